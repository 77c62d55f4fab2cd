"""A damaged model.safetensors (cut short, random bytes, or overwritten in place so that its header still
reads) read by any command: one line naming the file (and the tensor, or the checksum recorded beside
it), exit status 2, no traceback (`longdoc.model.encoder_folder.readable_weights`)."""

import random
import struct
from pathlib import Path

import pytest

from longdoc.cli import main
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.model.span_reader import SpanReader
from longdoc.tasks import get_task

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, local_radius=8,
            max_relative_distance=4, relative_vocab_size=16)


def damage(weights, how: str) -> None:
    data = weights.read_bytes()
    if how == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif how == "overwritten":
        # 4 KiB of the tensors' bytes, the header left whole, the size kept: all-ones bytes are NaNs in float32.
        start = 8 + struct.unpack("<Q", data[:8])[0] + 4096
        weights.write_bytes(data[:start] + b"\xff" * 4096 + data[start + 4096:])
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


def span_reader_folder(folder, tokenizer, how):
    """A span reader as `longdoc lift` writes one, which `ask --model` loads on torch alone."""
    SpanReader(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    damage(folder / "model.safetensors", how)
    return folder


def a_document(beside: str) -> str:
    document = Path(beside).with_name("document.txt")
    document.write_text("Ed Wood is a 1994 film directed by Tim Burton.\n", encoding="utf-8")
    return str(document)


# Each command that reads a model folder: the folder it takes, and its arguments around it.
COMMANDS = {
    "ask": (span_reader_folder, lambda folder, data, out: [
        "ask", "--question", "Who directed it?", "--model", folder, a_document(data)]),
    "predict": (hotpotqa_model_folder, lambda folder, data, out: [
        "predict", "hotpotqa", "--model", folder, "--data", data, "--out", out]),
    "train": (encoder_folder, lambda folder, data, out: [
        "train", "hotpotqa", "--init", folder, "--train", data, "--out", out, "--max-steps", "1"]),
    "pretrain": (encoder_folder, lambda folder, data, out: [
        "pretrain", "--init", folder, "--train", data, "--out", out, "--max-steps", "1"]),
}


@pytest.mark.parametrize("how", ["truncated", "random bytes", "overwritten"])
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
    if how == "overwritten":  # a header that reads: the tensor with the NaNs is named
        assert error.startswith(f"longdoc {command}: error: {weights}: tensor "), error
        assert error.endswith(" holds NaN or infinite values; the file is damaged, or the training run that saved "
                              "it diverged\n"), error
    else:
        assert error.startswith(f"longdoc {command}: error: {weights}: not readable as safetensors ("), error
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def saved_model_folder(folder, tokenizer):
    """A HotpotQA model folder as longdoc writes one (`save_model`): its weights' sha256 recorded beside them."""
    from longdoc.model_folder import save_model

    folder.mkdir()
    save_model(folder, get_task("hotpotqa").load("model")(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)),
               tokenizer)
    return folder


def test_weights_longdoc_wrote_are_checked_against_their_recorded_sha256(tmp_path, tokenizer, capsys):
    """Zeroed bytes (a failing disk's damage) are finite: only the sha256 recorded at saving tells."""
    import hashlib

    folder = saved_model_folder(tmp_path / "model", tokenizer)
    weights = folder / "model.safetensors"
    recorded = (folder / "model.safetensors.sha256").read_text(encoding="utf-8")
    assert recorded == f"{hashlib.sha256(weights.read_bytes()).hexdigest()}  model.safetensors\n"  # sha256sum -c reads it
    model_class = get_task("hotpotqa").load("model")
    assert isinstance(model_class.from_pretrained(folder), model_class)
    data = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0] + 4096
    data[start:start + 4096] = bytes(4096)
    weights.write_bytes(bytes(data))
    (tmp_path / "data.json").write_text("[]", encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "hotpotqa", "--model", str(folder), "--data", str(tmp_path / "data.json"),
                 "--out", str(tmp_path / "pred.json")]) == 2
    assert capsys.readouterr().err == (
        f"longdoc predict: error: {weights}: its sha256 differs from the one recorded when it was written "
        "(model.safetensors.sha256): the file was damaged since, by a bad copy or a failing disk; copy, download or "
        "train it again\n")


def test_an_intact_file_loads(tmp_path, tokenizer):
    """The same folder undamaged loads: the error above comes from the damage, not the folder."""
    model = hotpotqa_model_folder(tmp_path / "model", tokenizer, "truncated")
    model_class = get_task("hotpotqa").load("model")
    model_class(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, **TINY)).save_pretrained(model)
    assert isinstance(model_class.from_pretrained(model), model_class)
