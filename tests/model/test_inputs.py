"""The input schema: forward's signature and docstring follow it; features -> collate -> forward
holds to it end to end; inputs of the wrong dtype or name are refused; the checks of values run where
batches are collated, and in forward on CPU inputs only, unless the caller checked them (`checked_batches`)."""

import inspect

import pytest
import torch

from longdoc import GlobalLocalModel
from longdoc.convert.pretrained import default_tokenizer
from longdoc.data.batching import collate_features
from longdoc.data.examples import Document, DomNode, Paragraph, Span, StructuredExample, TextSpan
from longdoc.data.features import FeatureSettings, build_features
from longdoc.model.inputs import (
    ENCODER_INPUTS, INPUT_ALIASES, MODEL_INPUT_NAMES, PACKED_ROW_INPUTS, PAD_TOKEN_ID, InputSpec, check_and_collect,
    check_encoder_inputs, checked_batches,
)
from tests.model.conftest import make_inputs, tiny_config


def test_forward_arguments_and_docstring_follow_the_schema():
    parameters = list(inspect.signature(GlobalLocalModel.forward).parameters)
    assert parameters == ["self", *MODEL_INPUT_NAMES, *INPUT_ALIASES]
    docstring = GlobalLocalModel.forward.__doc__
    for spec in ENCODER_INPUTS:
        assert f"{spec.name} {spec.shape_text}" in docstring, spec.name
        if spec.dtype != torch.long:  # the docstring names every dtype other than the default int64
            assert f"{spec.name} {spec.shape_text} {str(spec.dtype).removeprefix('torch.')[:5]}" in docstring


def test_features_of_a_real_tokenizer_collate_into_inputs_the_model_takes():
    tokenizer = default_tokenizer()
    text = "Rome is old. Paris is new."
    long_doc = StructuredExample(
        "a", "which city?", [Document(text, [Paragraph(Span(0, 26), [Span(0, 12), Span(13, 26)])])],
        dom_nodes=[DomNode(TextSpan(0, 0, 4), [1.0, 2.0])],
    )
    short_doc = StructuredExample("b", "old?", [Document("Bern.")], dom_nodes=[DomNode(TextSpan(0, 0, 4), [3.0, 4.0])])
    settings = FeatureSettings(long_max_len=32, global_max_len=16, max_question_len=8, global_feature_size=2)
    rows = [f.to_dict() for example in (long_doc, short_doc) for f in build_features(example, tokenizer, settings)]
    batch = collate_features(rows, tokenizer.pad_token_id)
    assert set(batch) == set(MODEL_INPUT_NAMES) - set(PACKED_ROW_INPUTS)  # features hold one example per row
    for spec in (spec for spec in ENCODER_INPUTS if spec.name in batch):
        assert batch[spec.name].dtype == spec.dtype and batch[spec.name].dim() == len(spec.axes), spec.name
    length, globals_ = len(rows[1]["long_input_ids"]), len(rows[1]["global_input_ids"])
    assert batch["long_input_ids"][1, length:].eq(tokenizer.pad_token_id).all()
    assert batch["sentence_ids"][1, length:].eq(-1).all() and batch["global_paragraph_ids"][1, globals_:].eq(-1).all()
    config = tiny_config(vocab_size=tokenizer.vocab_size, global_feature_size=2)
    output = GlobalLocalModel(config).eval()(**batch)
    assert output.global_hidden_state.shape == (2, batch["global_input_ids"].shape[1], config.hidden_size)


def test_a_tokenizers_output_runs_the_encoder_as_the_long_input():
    # What a transformers user writes: model(**tokenizer(question, context, return_tensors="pt")).
    tokenizer = default_tokenizer()
    encoded = tokenizer(["which city is old?", "new?"], ["Rome is old. Paris is new.", "Bern."], padding=True,
                        return_tensors="pt")
    assert set(encoded) == set(INPUT_ALIASES)
    assert not bool(encoded["attention_mask"].all()) and bool(encoded["token_type_ids"].any())  # both matter
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config(vocab_size=tokenizer.vocab_size)).eval()
    with torch.no_grad():
        aliased = model(**encoded)
        named = model(**{INPUT_ALIASES[name]: value for name, value in encoded.items()})
        without_types = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
    assert torch.equal(aliased.long_hidden_state, named.long_hidden_state)
    assert aliased.global_hidden_state.shape == (2, 0, model.config.hidden_size)
    assert not torch.equal(aliased.long_hidden_state, without_types.long_hidden_state)  # token types were read


@pytest.mark.parametrize("alias", sorted(INPUT_ALIASES))
def test_an_alias_given_with_its_long_name_is_refused(alias):
    inputs = make_inputs(2, 10, 4, padding=True, structure=False)
    inputs[alias] = inputs[INPUT_ALIASES[alias]]
    with pytest.raises(TypeError, match=f"^{alias} and {INPUT_ALIASES[alias]} were both given: .*give one of them$"):
        GlobalLocalModel(tiny_config())(**inputs)


@pytest.mark.parametrize("name", ["long_attention_mask", "global_sees_all", "long_paragraph_ids"])
def test_floats_where_the_schema_wants_integers_or_booleans_are_refused(name):
    inputs = make_inputs(2, 10, 4, padding=True, structure=True)
    inputs[name] = inputs[name].float()
    with pytest.raises(ValueError, match=f"{name} must hold (integers|booleans or integers), got dtype torch.float32"):
        GlobalLocalModel(tiny_config())(**inputs)


def test_unknown_input_names_and_bad_specs_are_refused():
    inputs = make_inputs(1, 6, 2, padding=False, structure=False)
    with pytest.raises(ValueError, match="unknown encoder input.s. global_mask"):
        check_and_collect(tiny_config(), {**inputs, "global_mask": inputs["global_attention_mask"]})
    with pytest.raises(ValueError, match="axes must start with 'batch'"):
        InputSpec("labels", ("long",), torch.long)
    with pytest.raises(ValueError, match="pad must be a number, a bool or PAD_TOKEN_ID"):
        InputSpec("labels", ("batch",), torch.long, pad="pad")
    assert InputSpec("ids", ("batch", "long"), torch.long, pad=PAD_TOKEN_ID).pad_value(7) == 7


def test_value_checks_run_where_batches_are_collated_and_in_forward_on_cpu_inputs():
    config = tiny_config()
    inputs = make_inputs(2, 10, 4, padding=True, structure=True)
    inputs["sentence_ids"][1, 2] = 4  # no global token 4
    batch = {**inputs, "answer_labels": torch.zeros(2, dtype=torch.long)}  # a task's labels beside the inputs
    with pytest.raises(ValueError, match=r"sentence_ids contains 4, outside \[-1, 3\]"):
        check_encoder_inputs(batch, config)
    with pytest.raises(ValueError, match="sentence_ids contains 4"):
        check_and_collect(config, inputs)  # CPU inputs, no tracing: forward checks them too
    # What forward does with inputs on a GPU, or under torch.compile or export: no value is read.
    structure = check_and_collect(config, inputs, check_values=False)
    assert torch.equal(structure.sentence_ids, inputs["sentence_ids"])
    with pytest.raises(ValueError, match=r"long_attention_mask has shape \(2, 9\)"):  # shapes: always
        check_and_collect(config, {**inputs, "long_attention_mask": torch.ones(2, 9)}, check_values=False)
    # Batches their caller checked where it made them (the training engine's): forward reads no value again.
    with checked_batches():
        assert torch.equal(check_and_collect(config, inputs).sentence_ids, inputs["sentence_ids"])
        with pytest.raises(ValueError, match=r"long_attention_mask has shape \(2, 9\)"):
            check_and_collect(config, {**inputs, "long_attention_mask": torch.ones(2, 9)})
    with pytest.raises(ValueError, match="sentence_ids contains 4"):
        check_and_collect(config, inputs)  # and after it, again
