"""`longdoc lift`: on damaged checkpoints one line naming --from, exit status 2, no traceback;
`--json` one object saying what was written."""

import json
import shutil

from longdoc.cli import main
from longdoc.convert.pretrained import minilm_path
from tests.convert.test_lift_qa import save_source


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


def test_json_says_what_was_written_for_an_encoder(tmp_path, capsys):
    out = tmp_path / "lifted"
    assert main(["lift", "--from", str(minilm_path()), "--out", str(out), "--positions", "absolute", "--radius", "64",
                 "--seed", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    config = json.loads((out / "config.json").read_text())
    assert summary == {
        "out": str(out), "kind": "encoder", "source": str(minilm_path()), "architecture": "GlobalLocalModel",
        "options": {"positions": "absolute", "residual_attention": True, "talking_heads": False, "local_radius": 64,
                    "long_max_len": 4096, "global_max_len": 256, "share_qkv": False,
                    "share_attention_output": False, "share_feed_forward": False, "seed": 3},
        "model_card": str(out / "README.md"),
    }
    assert (config["position_embedding_type"], config["local_radius"]) == ("absolute", 64)


def test_json_names_a_span_reader_and_the_readers_defaults(tmp_path, capsys):
    source = tmp_path / "reader"
    save_source(source, "bert-uncased-wordpiece")
    assert main(["lift", "--from", str(source), "--out", str(tmp_path / "out"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["kind"], summary["architecture"]) == ("span reader", "SpanReader")
    assert {name: summary["options"][name] for name in ("positions", "residual_attention", "local_radius")} == {
        "positions": "absolute", "residual_attention": False, "local_radius": 383}
