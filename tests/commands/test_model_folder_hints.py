"""A model folder of the wrong kind on the command line: the library's message (what the folder
holds) and the command line's hint (what to run instead, `longdoc.commands.hints`), on one line, exit 2."""

import json

from longdoc.cli import main


def test_predict_with_a_bert_folder_says_to_lift_it(tmp_path, capsys):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "dev.json").write_text("[]")
    assert main(["predict", "hotpotqa", "--model", str(tmp_path / "bert"), "--data", str(tmp_path / "dev.json"),
                 "--out", str(tmp_path / "p.json")]) == 2
    error = capsys.readouterr().err
    assert error == (f"longdoc predict: error: {tmp_path / 'bert'}: model_type is 'bert', not 'longdoc-global-local': not a "
                     "longdoc model; turn a BERT-family checkpoint into a longdoc encoder with "
                     "`longdoc lift --from DIR --out DIR`\n")


def test_predict_with_a_bare_encoder_says_how_to_train_one(tmp_path, capsys):
    (tmp_path / "encoder").mkdir()
    (tmp_path / "encoder" / "config.json").write_text(json.dumps({"model_type": "longdoc-global-local"}))
    (tmp_path / "dev.json").write_text("[]")
    assert main(["predict", "wikihop", "--model", str(tmp_path / "encoder"), "--data", str(tmp_path / "dev.json"),
                 "--out", str(tmp_path / "p.json")]) == 2
    error = capsys.readouterr().err
    assert error == (f"longdoc predict: error: {tmp_path / 'encoder'}: is a bare encoder (GlobalLocalModel, no task "
                     "head), not a trained wikihop model; train one with "
                     "`longdoc train wikihop --init ENCODER_DIR --out DIR`\n")
