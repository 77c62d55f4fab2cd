"""GlobalLocalModel as a transformers model: save/load, gradient checkpointing, dtypes, input checks."""

import pytest
import torch

from longdoc import GlobalLocalConfig, GlobalLocalModel
from tests.model.conftest import make_inputs, tiny_config


def test_save_and_load_round_trip_through_safetensors(tmp_path):
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config(talking_heads=True, global_feature_size=2)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.bin"))
    loaded = GlobalLocalModel.from_pretrained(tmp_path).eval()
    ignored = {"_name_or_path"}
    assert {k: v for k, v in loaded.config.to_dict().items() if k not in ignored} == {
        k: v for k, v in model.config.to_dict().items() if k not in ignored
    }
    inputs = make_inputs(2, 11, 3, padding=True, structure=True)
    inputs["global_features"] = torch.randn(2, 3, 2)
    expected, actual = model(**inputs), loaded(**inputs)
    assert torch.equal(expected.long_hidden_state, actual.long_hidden_state)
    assert torch.equal(expected.global_hidden_state, actual.global_hidden_state)


def test_config_round_trips_through_json_and_refuses_impossible_combinations(tmp_path):
    config = GlobalLocalConfig.from_preset("minilm", residual_attention_mean=True, talking_heads=True)
    config.save_pretrained(tmp_path)
    assert GlobalLocalConfig.from_pretrained(tmp_path).to_dict() == config.to_dict()
    with pytest.raises(ValueError, match="relative_vocab_size"):
        GlobalLocalConfig(max_relative_distance=20, relative_vocab_size=32)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        GlobalLocalConfig(position_embedding_type="absolute", long_max_len=4096, max_position_embeddings=512)
    with pytest.raises(ValueError, match="residual_attention_mean"):
        GlobalLocalConfig(residual_attention=False, residual_attention_mean=True)
    with pytest.raises(ValueError, match="unknown preset"):
        GlobalLocalConfig.from_preset("huge")


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config()).train()
    inputs = make_inputs(2, 15, 4, padding=True, structure=True)

    def gradients():
        model.zero_grad()
        output = model(**inputs)
        (output.long_hidden_state.pow(2).sum() + output.global_hidden_state.sum()).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    # the layers' forward runs again in the backward where it is checkpointed: its attention is called twice
    calls = []
    model.encoder.layers[0].attention.register_forward_hook(lambda *_: calls.append(model.training))
    plain = gradients()
    assert len(calls) == 1
    model.activation_checkpointing_enable({"use_reentrant": False})
    assert all(layer.gradient_checkpointing for layer in model.encoder.layers)
    checkpointed = gradients()
    assert len(calls) == 3
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(plain[name], checkpointed[name], msg=name)


def test_reentrant_checkpointing_is_refused_with_a_clear_error():
    # It gave wrong gradients (against no checkpointing); both entry points reach the refusal.
    model = GlobalLocalModel(tiny_config())
    with pytest.raises(ValueError, match="use_reentrant=False"):
        model.activation_checkpointing_enable({"use_reentrant": True})
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="use_reentrant=False"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing


def test_bfloat16_forward_and_backward_stay_close_to_float32():
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config(talking_heads=True)).eval()
    inputs = make_inputs(2, 25, 5, padding=True, structure=True)
    expected = model(**inputs).long_hidden_state
    model_bf16 = model.to(torch.bfloat16)
    output = model_bf16(**inputs).long_hidden_state
    assert output.dtype == torch.bfloat16
    mask = inputs["long_attention_mask"].bool()
    torch.testing.assert_close(output.float()[mask], expected[mask], atol=0.1, rtol=0.05)
    output.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model_bf16.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda x: x.update(long_input_ids=torch.ones(2, 65, dtype=torch.long)), r"length 65, above long_max_len = 64"),
        (lambda x: x.update(long_input_ids=torch.ones(10, dtype=torch.long)), r"long_input_ids must be a \[batch, length\]"),
        (lambda x: x.update(global_input_ids=torch.ones(2, 17, dtype=torch.long)), r"17 global tokens, above global_max_len = 16"),
        (lambda x: x["long_input_ids"].__setitem__((0, 0), 50), r"long_input_ids contains 50, outside \[0, 49\]"),
        (lambda x: x["sentence_ids"].__setitem__((1, 2), 4), r"sentence_ids contains 4, outside \[-1, 3\]"),
        (lambda x: x["mention_ids"].__setitem__((0, 1), -2), r"mention_ids contains -2"),
        (lambda x: x["sentence_ids"].__setitem__((1, 0), 3), r"sentence_ids\[1, 0\] = 3 points to a padding global token"),
        (lambda x: x.update(long_attention_mask=torch.ones(2, 9)), r"long_attention_mask has shape \(2, 9\), expected \(2, 10\)"),
        (lambda x: x.update(global_sees_all=torch.ones(2, 5, dtype=torch.bool)), r"global_sees_all has shape \(2, 5\), expected \(2, 4\)"),
        (lambda x: x["long_token_type_ids"].__setitem__((0, 0), 2), r"long_token_type_ids contains 2, outside \[0, 1\]"),
        (lambda x: x.update(sentence_ids=x["sentence_ids"].float()), r"sentence_ids must hold integers"),
        (lambda x: x.update(global_features=torch.ones(2, 4, 3)), r"global_features was given but config.global_feature_size is 0"),
        (lambda x: [x.pop(key) for key in list(x) if key.startswith("global_") and key != "global_sees_all"], r"global_sees_all was given but global_input_ids is None"),
    ],
)
def test_bad_inputs_are_refused_before_any_compute(edit, message):
    model = GlobalLocalModel(tiny_config())
    inputs = make_inputs(2, 10, 4, padding=True, structure=True)
    edit(inputs)
    with pytest.raises(ValueError, match=message):
        model(**inputs)


@pytest.mark.parametrize("on", [True, False])
def test_global_tokens_take_absolute_positions_only_when_configured(on):
    config = tiny_config(position_embedding_type="absolute", global_absolute_positions=on)
    embeddings = GlobalLocalModel(config).eval().embeddings
    same_token_twice = torch.tensor([[5, 5]])
    global_rows = embeddings(same_token_twice, None, is_global=True)[0]
    long_rows = embeddings(same_token_twice, None)[0]
    assert not torch.allclose(long_rows[0], long_rows[1])  # long tokens always take their position
    assert torch.allclose(global_rows[0], global_rows[1]) is not on


def test_lifted_models_give_global_tokens_no_absolute_positions():
    from longdoc.convert.pretrained import default_model_path

    assert GlobalLocalConfig.from_pretrained(default_model_path("absolute")).global_absolute_positions is False
    assert GlobalLocalConfig().global_absolute_positions  # what configs saved before the field computed
