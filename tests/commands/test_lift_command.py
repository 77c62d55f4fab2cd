"""`longdoc lift` on damaged checkpoints: one line naming --from, exit status 2, no traceback."""

import shutil

from longdoc.cli import main
from longdoc.convert.pretrained import minilm_path


def test_truncated_safetensors_is_a_one_line_error(tmp_path, capsys):
    source = tmp_path / "bert"
    source.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(minilm_path() / name, source / name)
    (source / "model.safetensors").write_bytes((minilm_path() / "model.safetensors").read_bytes()[:1000])
    assert main(["lift", "--from", str(source), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"longdoc lift: error: {source / 'model.safetensors'}: not readable as safetensors (")
    assert error.count("\n") == 1
    assert not (tmp_path / "out").exists()
