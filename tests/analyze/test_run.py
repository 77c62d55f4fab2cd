"""longdoc.analyze.run: what analysis.json says the model is."""

import json

import pytest
import torch

from longdoc.analyze.run import AnalysisOptions, analyze_attention, model_kind
from longdoc.cli import main
from longdoc.tasks import REGISTRY
from tests.analyze.folders import tiny_encoder


def test_the_kind_names_the_task_as_the_user_named_it():
    multihop = REGISTRY.get("multihop")  # runs HotpotQA's parts: its models record "hotpotqa"
    assert model_kind("hotpotqa", multihop) == "multihop"
    assert model_kind("hotpotqa", REGISTRY.get("hotpotqa")) == "hotpotqa"
    assert model_kind("hotpotqa", None) == "hotpotqa"
    assert model_kind("wikihop", multihop) == "wikihop"  # another task's model read as multihop stays what it is
    assert model_kind(None, multihop) == "encoder"


@pytest.mark.slow  # generates data, builds a task model and runs two analyses
def test_a_multihop_model_is_recorded_as_multihop(tmp_path):
    from longdoc.tasks.hotpotqa.model import HotpotQAModel

    data = tmp_path / "multihop.json"
    assert main(["make-data", "multihop", "--n", "2", "--length", "180", "--seed", "0", "--out", str(data),
                 "--quiet"]) == 0
    encoder = tiny_encoder(tmp_path / "encoder", long_max_len=256, global_max_len=96)
    torch.manual_seed(0)
    model = tmp_path / "model"
    HotpotQAModel.from_encoder(encoder).save_pretrained(model)
    (encoder / "tokenizer.json").replace(model / "tokenizer.json")
    (encoder / "tokenizer_config.json").replace(model / "tokenizer_config.json")
    kinds = {}
    for task in ("multihop", "hotpotqa"):
        result = analyze_attention(AnalysisOptions(model=model, data=data, out=tmp_path / task, task=task, examples=1,
                                                   plots=False, progress=False), REGISTRY)
        written = json.loads((result.out / "analysis.json").read_text(encoding="utf-8"))
        kinds[task] = (written["model"]["kind"], written["data"]["task"])
    assert kinds == {"multihop": ("multihop", "multihop"), "hotpotqa": ("hotpotqa", "hotpotqa")}
