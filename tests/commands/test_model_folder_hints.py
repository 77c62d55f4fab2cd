"""A model folder of the wrong kind on the command line: the library's message (what the folder
holds) and the command line's hint (what to run instead, `longdoc.commands.hints`), on one line, exit 2."""

import json

import pytest

from longdoc.cli import main


@pytest.mark.parametrize("model_type, task, expected", [
    ("bert", "hotpotqa", "model_type is 'bert', not 'longdoc-global-local': not a longdoc model; turn a "
                         "BERT-family checkpoint into a longdoc encoder with `longdoc lift --from DIR --out DIR`"),
    ("longdoc-global-local", "wikihop", "is a bare encoder (GlobalLocalModel, no task head), not a trained wikihop "
                                        "model; train one with `longdoc train wikihop --init ENCODER_DIR --out DIR`"),
])
def test_predict_with_the_wrong_folder_says_what_it_holds_and_what_to_run(tmp_path, capsys, model_type, task,
                                                                          expected):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "dev.json").write_text("[]")
    assert main(["predict", task, "--model", str(tmp_path / "model"), "--data", str(tmp_path / "dev.json"),
                 "--out", str(tmp_path / "p.json")]) == 2
    assert capsys.readouterr().err == f"longdoc predict: error: {tmp_path / 'model'}: {expected}\n"
