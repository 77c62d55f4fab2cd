"""`longdoc analyze attention`: the per-layer table on stdout and the folder it writes; bad input
refused in one line naming what is wrong, exit status 2, nothing written."""

import json

import pytest

from longdoc.cli import main
from tests.analyze.folders import text_file, tiny_encoder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("analyze") / "encoder")


@pytest.mark.slow  # a forward pass with the attention kept and every statistic
def test_the_table_has_one_line_per_layer_and_the_folder_its_figures(encoder, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert main(["analyze", "attention", "--model", str(encoder), "--data", str(text_file(tmp_path / "text")),
                 "--out", str(out), "--no-plots", "--quiet"]) == 0
    captured = capsys.readouterr()
    heading, *layers = captured.out.splitlines()
    assert heading.split() == ["layer", "H/log", "n", "long", "H/log", "n", "global", "top10%", "long", "JS->next",
                               "long", "carried", "long"]
    analysis = json.loads((out / "analysis.json").read_text())
    assert [line.split()[0] for line in layers] == ["1", "2"]
    first, second = (line.split() for line in layers)
    # The first layer receives no scores; JS compares a layer with the next, so the last has none.
    assert first[-1] == "0.000" and float(second[-1]) > 0 and second[4] == "-"
    entropy = analysis["statistics"]["normalized_entropy"]["pieces"]["long"]
    assert first[1] == f"{entropy[0]['mean']:.3f}" and second[1] == f"{entropy[1]['mean']:.3f}"
    assert analysis["data"]["inputs"] >= 1 and analysis["plots"] == []
    assert captured.err == (f"longdoc analyze: {analysis['data']['inputs']} inputs ({analysis['data']['long_tokens']} "
                            f"long and {analysis['data']['global_tokens']} global tokens) -> {out / 'analysis.json'} "
                            "and 0 plots\n")


@pytest.mark.parametrize("case", ["missing model", "not a model", "unknown task", "missing data"])
def test_bad_input_is_one_line_and_exit_status_2(case, encoder, tmp_path, capsys):
    text, other = text_file(tmp_path / "text"), tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not a model\n", encoding="utf-8")
    model, data, task, expected = {
        "missing model": (tmp_path / "absent", text, None, f"{tmp_path / 'absent'}: no such folder"),
        "not a model": (other, text, None, f"{other}: no config.json"),
        "unknown task": (encoder, text, "trivia", "--task trivia: unknown task; one of hotpotqa, multihop"),
        "missing data": (encoder, tmp_path / "absent.txt", None, f"{tmp_path / 'absent.txt'}: no such file"),
    }[case]
    out = tmp_path / "analysis"
    argv = ["analyze", "attention", "--model", str(model), "--data", str(data), "--out", str(out), "--no-plots"]
    assert main(argv + (["--task", task] if task else [])) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"longdoc analyze: error: {expected}"), captured.err
    assert not out.exists()
