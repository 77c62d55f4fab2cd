"""Small model and analysis folders for the tests of `longdoc analyze` and of `longdoc serve --analysis`:
a randomly initialised encoder with MiniLM's tokenizer, and plain text for it to read."""

from pathlib import Path

import torch

from longdoc import GlobalLocalConfig, GlobalLocalModel

TEXT = ("Mara Quell was born in Tallinnford. She paints bridges over the river. The bridges are old.\n\n"
        "Orbix Group sells lamps. Its lamps light the bridges of Tallinnford at night. Nobody buys them twice.\n")


def tiny_encoder(folder: Path, seed: int = 0, **overrides) -> Path:
    """A random encoder (2 layers, 2 heads of 8) with MiniLM's tokenizer, saved in `folder`."""
    from longdoc.model_folder import read_tokenizer
    from longdoc.convert.pretrained import minilm_path

    settings = dict(vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                    local_radius=4, long_max_len=64, global_max_len=16, max_relative_distance=3, relative_vocab_size=10)
    torch.manual_seed(seed)
    GlobalLocalModel(GlobalLocalConfig(**{**settings, **overrides})).save_pretrained(folder)
    read_tokenizer(Path(minilm_path())).save_pretrained(folder)
    return folder


def text_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "notes.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path
