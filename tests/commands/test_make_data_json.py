"""`longdoc make-data --json`: one JSON object on stdout that matches the file written."""

import json

from longdoc.cli import main


def test_json_summary_describes_the_written_file(tmp_path, capsys):
    out = tmp_path / "made.json"
    assert main(["make-data", "multihop", "--n", "2", "--length", "256", "--seed", "1", "--out", str(out),
                 "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    examples = json.loads(out.read_text(encoding="utf-8"))
    assert summary == {"task": "multihop", "path": str(out), "examples": len(examples), "bytes": out.stat().st_size,
                       "length": 256, "seed": 1, "min_distance": 128, "comparison_fraction": 0.2,
                       "relation_share": 0.35, "chain_order": False}
    assert len(examples) == 2
    assert "wrote" not in captured.err


def test_json_summary_keeps_the_given_min_distance(tmp_path, capsys):
    out = tmp_path / "made.json"
    assert main(["make-data", "multihop", "--n", "1", "--length", "256", "--seed", "0", "--out", str(out),
                 "--min-distance", "64", "--chain-order", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["min_distance"], summary["chain_order"], summary["examples"]) == (64, True, 1)
