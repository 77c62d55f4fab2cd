"""scripts/study_attention.py: when a run counts as diverged, and its score read from what the run wrote."""

import json
import math

import pytest

from scripts.study_attention import run_figures, spread


def write_log(folder, losses, evaluation=None):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [{"step": 5 * (index + 1), "loss": loss, "examples_per_second": 40.0} for index, loss in enumerate(losses)]
    if evaluation is not None:
        lines.append({"step": 5 * len(losses), "eval": evaluation})
    (folder / "train_log.jsonl").write_text("\n".join(json.dumps(line) for line in lines), encoding="utf-8")


@pytest.mark.parametrize("losses, diverged", [
    ([2.3, 1.9, 1.2], False),
    ([2.3, 1.9, 2.4], True),  # the last logged loss above the first
    ([2.3, math.nan, 1.2], True),  # a NaN anywhere
    ([], True),  # nothing logged: the run did not train
])
def test_a_run_diverges_when_a_loss_is_nan_or_the_last_above_the_first(tmp_path, losses, diverged):
    write_log(tmp_path / "run", losses, {"mlm_loss": 7.5})
    figures = run_figures("mlm", tmp_path / "run", {"status": 0, "seconds": 1.0})
    assert figures["diverged"] is diverged
    assert figures["score"] == 7.5


def test_the_multihop_score_is_the_answer_f1_and_a_nan_score_is_none(tmp_path):
    write_log(tmp_path / "run", [2.3, 1.0])
    (tmp_path / "run" / "metrics.json").write_text(json.dumps({"metrics": {"f1": 0.54, "em": 0.5}}))
    assert run_figures("multihop", tmp_path / "run", {"status": 0, "seconds": 1.0})["score"] == 0.54
    write_log(tmp_path / "nan", [2.3, math.nan], {"mlm_loss": math.nan})
    assert run_figures("mlm", tmp_path / "nan", {"status": 0, "seconds": 1.0})["score"] is None


def test_spread_is_mean_and_sample_deviation():
    assert spread([0.5, 0.7]) == "0.600 ± 0.141"
    assert spread([0.25]) == "0.250" and spread([]) == "-"
