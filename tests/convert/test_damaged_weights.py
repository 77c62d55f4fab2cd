"""A damaged model.safetensors (cut short, or random bytes) read by any command: one line naming the
file, exit status 2, no traceback (`longdoc.model.encoder_folder.readable_weights`)."""

import random

import pytest

from longdoc.cli import main
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.modeling import GlobalLocalModel
from longdoc.tasks import get_task

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, local_radius=8,
            max_relative_distance=4, relative_vocab_size=16)


def damage(weights, how: str) -> None:
    data = weights.read_bytes()
    if how == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    else:
        weights.write_bytes(random.Random(0).randbytes(len(data)))


def encoder_folder(folder, tokenizer, how):
    GlobalLocalModel(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    damage(folder / "model.safetensors", how)
    return folder


def hotpotqa_model_folder(folder, tokenizer, how):
    model_class = get_task("hotpotqa").load("model")
    model_class(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    damage(folder / "model.safetensors", how)
    return folder


# Each command that reads a model folder: the folder it takes, and its arguments around it.
COMMANDS = {
    "predict": (hotpotqa_model_folder, lambda folder, data, out: [
        "predict", "hotpotqa", "--model", folder, "--data", data, "--out", out]),
    "train": (encoder_folder, lambda folder, data, out: [
        "train", "hotpotqa", "--init", folder, "--train", data, "--out", out, "--max-steps", "1"]),
    "pretrain": (encoder_folder, lambda folder, data, out: [
        "pretrain", "--init", folder, "--train", data, "--out", out, "--max-steps", "1"]),
}


@pytest.mark.parametrize("how", ["truncated", "random bytes"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_damaged_weights_are_a_one_line_error(tmp_path, capsys, tokenizer, command, how):
    make_folder, arguments = COMMANDS[command]
    folder = make_folder(tmp_path / "model", tokenizer, how)
    data = tmp_path / "data.json"
    data.write_text("[]", encoding="utf-8")
    capsys.readouterr()  # saving the folder printed a progress bar
    assert main(arguments(str(folder), str(data), str(tmp_path / "out"))) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    weights = folder / "model.safetensors"
    assert error.startswith(f"longdoc {command}: error: {weights}: not readable as safetensors ("), error
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_intact_file_loads(tmp_path, tokenizer):
    """The same folder undamaged loads: the error above comes from the damage, not the folder."""
    model = hotpotqa_model_folder(tmp_path / "model", tokenizer, "truncated")
    model_class = get_task("hotpotqa").load("model")
    model_class(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)).save_pretrained(model)
    assert isinstance(model_class.from_pretrained(model), model_class)
