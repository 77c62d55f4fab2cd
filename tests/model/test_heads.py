"""Heads, losses, span decoding and the TaskModel base (save/load, refusals)."""

import json
import re

import pytest
import torch

from longdoc.commands.hints import with_hint
from longdoc.errors import InputError, ModelFolderError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.heads import (
    MASKED_LOGIT, GlobalTokenClassifier, GlobalTokenScorer, SpanHead, binary_loss, classification_loss, mean_loss,
    pool_linked, span_loss, top_spans,
)
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.model.task_model import TaskModel, check_task_checkpoint


def test_top_spans_stays_in_one_group_and_length():
    start = torch.tensor([9.0, 0.0, 5.0, 0.0, 0.0, 1.5])
    end = torch.tensor([0.0, 0.0, 0.0, 8.0, 0.0, 7.0])
    # Group -1 (e.g. the question) at 0; paragraphs 1 (tokens 1-3) and 2 (tokens 4-5).
    groups = torch.tensor([-1, 1, 1, 1, 2, 2])
    # Unconstrained best would be 0..3 (17) or 2..5 (12): both excluded.
    assert top_spans(start, end, groups, max_length=10, k=3) == [(13.0, 2, 3), (8.5, 5, 5), (8.0, 1, 3)]
    # Length bound: with max_length 2, 1..3 (3 tokens) is gone; all 8 allowed spans come back.
    bounded = top_spans(start, end, groups, max_length=2, k=20)
    assert len(bounded) == 8 and bounded[:2] == [(13.0, 2, 3), (8.5, 5, 5)]
    assert all(last - first < 2 and groups[first] == groups[last] >= 0 for _, first, last in bounded)
    # A span never ends before it starts, even where that would score best.
    assert top_spans(torch.tensor([0.0, 5.0]), torch.tensor([4.0, 1.0]), torch.tensor([0, 0]), 5)[0] == (6.0, 1, 1)


def test_top_spans_with_nothing_allowed():
    assert top_spans(torch.zeros(3), torch.zeros(3), torch.full((3,), -1), max_length=4) == []
    assert top_spans(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.long), max_length=4) == []


def test_heads_shapes_and_masks():
    torch.manual_seed(0)
    long_hidden, global_hidden = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    allowed = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    start, end = SpanHead(8)(long_hidden, allowed)
    assert start.shape == end.shape == (2, 5)
    assert (start[~allowed] == MASKED_LOGIT).all() and (start[allowed] != MASKED_LOGIT).all()
    classifier = GlobalTokenClassifier(8, 3)
    assert classifier(global_hidden).shape == (2, 3)
    # Per-row index picks that row's token.
    by_row = classifier(global_hidden, torch.tensor([0, 2]))
    assert torch.allclose(by_row[1], classifier.projection(global_hidden[1, 2]))
    selected = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    scores = GlobalTokenScorer(8)(global_hidden, selected)
    assert scores.shape == (2, 4) and (scores[~selected] == MASKED_LOGIT).all()


def test_losses_ignore_unlabelled_entries():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    assert span_loss(logits, logits, torch.tensor([-1, -1]), torch.tensor([-1, -1])) is None
    one = span_loss(logits, logits, torch.tensor([0, -1]), torch.tensor([0, -1]))
    expected = torch.nn.functional.cross_entropy(logits[:1], torch.tensor([0]))
    assert torch.allclose(one, expected)
    assert torch.allclose(classification_loss(logits, torch.tensor([-1, 1])), expected)
    binary = binary_loss(torch.tensor([[0.0, 3.0, 1.0]]), torch.tensor([[1, -1, 0]]))
    by_hand = (torch.log1p(torch.exp(torch.tensor(-0.0))) + torch.log1p(torch.exp(torch.tensor(1.0)))) / 2
    assert torch.allclose(binary, by_hand)
    assert binary_loss(torch.zeros(1, 2), torch.full((1, 2), -1)) is None
    assert torch.allclose(mean_loss(torch.tensor(1.0), None, torch.tensor(3.0)), torch.tensor(2.0))
    assert mean_loss(None, None) is None


def test_classifier_pooling_selected_global_tokens():
    torch.manual_seed(0)
    head = GlobalTokenClassifier(2, 3, pool_selected=True)
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 5.0], [5.0, 7.0], [100.0, 100.0]]])
    selected = torch.tensor([[0, 1, 1, 0]])
    # [token 0; mean of tokens 1 and 2] = [1, 2, 4, 6] through the linear map.
    expected = head.projection(torch.tensor([[1.0, 2.0, 4.0, 6.0]]))
    torch.testing.assert_close(head(hidden, 0, selected), expected)
    # Nothing selected: the pooled half is zeros, not NaN.
    torch.testing.assert_close(head(hidden, 0, torch.zeros(1, 4)), head.projection(torch.tensor([[1.0, 2.0, 0, 0]])))
    with pytest.raises(ValueError, match="question_mask"):
        head(hidden, 0)


class ToyModel(TaskModel):
    task_name = "toy"
    default_task_options = {"threshold": 0.5}

    def __init__(self, config):
        super().__init__(config)
        self.scorer = GlobalTokenScorer(config.hidden_size)
        self.post_init()

    def forward(self, labels=None, **inputs):
        return self.scorer(self.encode(inputs).global_hidden_state)


@pytest.fixture()
def encoder_dir(tmp_path):
    config = GlobalLocalConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32, local_radius=4, long_max_len=32, global_max_len=4)
    torch.manual_seed(0)
    GlobalLocalModel(config).save_pretrained(tmp_path / "encoder")
    return tmp_path / "encoder"


def test_task_model_from_encoder_save_and_restore(encoder_dir, tmp_path):
    encoder = GlobalLocalModel.from_pretrained(encoder_dir)
    model = ToyModel.from_encoder(encoder_dir, encoder_config={"global_max_len": 8}, threshold=0.25)
    for name, value in encoder.state_dict().items():
        assert torch.equal(model.encoder.state_dict()[name], value), name
    assert model.config.global_max_len == 8 and model.task_options == {"threshold": 0.25}
    model.save_pretrained(tmp_path / "trained")
    saved = json.loads((tmp_path / "trained" / "config.json").read_text())
    assert saved["task"] == "toy" and saved["task_options"] == {"threshold": 0.25}
    assert (tmp_path / "trained" / "model.safetensors").is_file()
    restored = ToyModel.from_pretrained(tmp_path / "trained")
    for name, value in model.state_dict().items():
        assert torch.equal(restored.state_dict()[name], value), name
    batch = {"long_input_ids": torch.tensor([[1, 2, 3]]), "global_input_ids": torch.tensor([[4, 5]]),
             "labels": torch.tensor([0])}
    assert torch.allclose(model.eval()(**batch), restored(**batch))


def test_an_unknown_batch_key_is_an_error_naming_it_and_the_known_ones(encoder_dir):
    model = ToyModel.from_encoder(encoder_dir).eval()
    batch = {"long_input_ids": torch.tensor([[1, 2, 3]]), "global_input_ids": torch.tensor([[4, 5]])}
    assert model(**batch, labels=torch.tensor([0])).shape == (1, 2)
    with pytest.raises(TypeError, match=r"ToyModel.forward got unknown input\(s\) lables; known: labels, "
                                        r"long_input_ids, .*global_input_ids"):
        model(**batch, lables=torch.tensor([0]))


def test_a_task_model_reads_transformers_names_resolving_them_once(encoder_dir, monkeypatch):
    from longdoc.model import inputs, modeling, task_model

    model = ToyModel.from_encoder(encoder_dir).eval()
    named = model(long_input_ids=torch.tensor([[1, 2, 3]]), global_input_ids=torch.tensor([[4, 5]]))
    calls = []
    counted = lambda given: calls.append(1) or inputs.take_aliases(given)
    for module in (modeling, task_model):  # wherever the package imported it
        monkeypatch.setattr(module, "take_aliases", counted, raising=False)
    aliased = model(input_ids=torch.tensor([[1, 2, 3]]), global_input_ids=torch.tensor([[4, 5]]))
    assert torch.equal(aliased, named) and len(calls) == 1
    with pytest.raises(TypeError, match="^input_ids and long_input_ids were both given"):
        model(input_ids=torch.tensor([[1, 2, 3]]), long_input_ids=torch.tensor([[1, 2, 3]]))

def test_task_model_refusals(encoder_dir, tmp_path):
    # The library says what a folder holds; the command line adds what to run (longdoc.commands.hints).
    with pytest.raises(ModelFolderError, match="bare encoder") as refused:
        ToyModel.from_pretrained(encoder_dir)
    assert re.search("bare encoder.*longdoc train toy", with_hint(refused.value))
    with pytest.raises(InputError, match="unknown option.*colour"):
        ToyModel.from_encoder(encoder_dir, colour=1)
    ToyModel.from_encoder(encoder_dir).save_pretrained(tmp_path / "toy")
    with pytest.raises(ModelFolderError, match="trained toy model, not a lifted encoder") as refused:
        ToyModel.from_encoder(tmp_path / "toy")
    assert f"`longdoc predict toy --model {tmp_path / 'toy'}`" in with_hint(refused.value)
    with pytest.raises(ModelFolderError, match="trained toy model, not a hotpotqa model") as refused:
        check_task_checkpoint(tmp_path / "toy", "hotpotqa")
    assert re.search("trained toy model, not a hotpotqa model.*longdoc predict toy", with_hint(refused.value))
    with pytest.raises(InputError, match="no such folder"):
        ToyModel.from_encoder(tmp_path / "missing")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelFolderError, match="not a longdoc model") as refused:
        ToyModel.from_encoder(tmp_path / "bert")
    assert re.search("not a longdoc model.*longdoc lift", with_hint(refused.value))
    assert with_hint(InputError("a.json: line 3: no text")) == "a.json: line 3: no text"


def test_forward_rows_moves_batches_to_the_models_device_and_results_to_the_cpu(encoder_dir, monkeypatch):
    # The model reports another device than the CPU (the only one here): forward_rows must move each
    # batch there (meta tensors: devices and shapes, no data), and bring the outputs back to the CPU.
    model = ToyModel.from_encoder(encoder_dir)
    monkeypatch.setattr(ToyModel, "device", property(lambda self: torch.device("meta")))
    seen = []

    def spy(**batch):
        seen.extend(value.device for value in batch.values())
        return {"scores": torch.zeros(len(batch["long_input_ids"]), 2)}  # as if computed on that device

    monkeypatch.setattr(model, "forward", spy)
    rows = [{"long_input_ids": [1, 2, 3], "global_input_ids": [4, 5]} for _ in range(3)]
    results = model.forward_rows(rows, lambda rows, pad: {name: torch.tensor([row[name] for row in rows])
                                                          for name in rows[0]}, batch_size=2, progress=False)
    assert len(seen) == 4 and set(seen) == {torch.device("meta")}  # 2 batches x 2 inputs
    assert [result["scores"].device for result in results] == [torch.device("cpu")] * 3


def test_forward_rows_checks_each_batchs_values_once(encoder_dir, monkeypatch):
    # Prediction checks a batch's values where it is collated, on the CPU; the encoder's forward then
    # leaves them to that check instead of reading every input a second time.
    from longdoc.model import inputs

    model = ToyModel.from_encoder(encoder_dir)
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **batch: {"scores": forward(**batch)})  # outputs by name
    checks = []
    check_values = inputs._check_values
    monkeypatch.setattr(inputs, "_check_values", lambda *args: checks.append(1) or check_values(*args))
    rows = [{"long_input_ids": [1, 2, 3], "global_input_ids": [4, 5]} for _ in range(3)]
    model.forward_rows(rows, lambda rows, pad: {name: torch.tensor([row[name] for row in rows])
                                                for name in rows[0]}, batch_size=2, progress=False)
    assert len(checks) == 2  # 2 batches, each checked once
    checks.clear()
    model(long_input_ids=torch.tensor([[1, 2, 3]]), global_input_ids=torch.tensor([[4, 5]]))
    assert len(checks) == 1  # called directly, the forward still checks what it is given


def test_pool_linked_means_the_linked_long_states():
    long_hidden = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [5.0, 4.0], [7.0, 6.0]]])
    links = torch.tensor([[1, -1, 1, 0]])
    pooled = pool_linked(long_hidden, links, count=3)
    assert torch.equal(pooled, torch.tensor([[[7.0, 6.0], [3.0, 2.0], [0.0, 0.0]]]))
