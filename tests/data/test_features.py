"""build_features on hand-made examples: the exact layout of long and global tokens, structure ids,
drops with counted warnings, markers for BPE, batching into model inputs."""

import pytest
import torch

from longdoc.data.batching import collate_features
from longdoc.errors import InputError
from longdoc.data.examples import Candidate, Document, DomNode, Paragraph, Span, StructuredExample, TextSpan
from longdoc.data.features import FeatureSettings, GlobalKind, GlobalMarkers, build_features, window_settings
from longdoc.convert.pretrained import default_tokenizer
from longdoc.data.spans import SOURCE_NONE, SOURCE_QUESTION
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.inputs import MODEL_INPUT_NAMES, PACKED_ROW_INPUTS
from tests.data.token_text import check_offsets, small_bpe_tokenizer

TOKENIZER = default_tokenizer()
K = GlobalKind


def two_paragraph_example():
    # "Rome\nRome is old. Paris is new." : title "Rome" 0..4, sentences 5..17 and 18..31.
    text = "Rome\nRome is old. Paris is new."
    paragraph = Paragraph(Span(0, 31), [Span(5, 17), Span(18, 31)], title=Span(0, 4))
    return StructuredExample(
        id="ex", question="which city?",
        documents=[Document(text, [paragraph]), Document.from_text("Bern too.")],
        candidates=[Candidate("paris", [TextSpan(0, 18, 23)]), Candidate("bern", [TextSpan(1, 0, 4)])],
    )


def test_layout_by_hand():
    (f,) = build_features(two_paragraph_example(), TOKENIZER, FeatureSettings(64, 32, max_question_len=8))
    tokens = TOKENIZER.convert_ids_to_tokens(f.long_input_ids)
    assert tokens == ["[CLS]", "which", "city", "?", "[SEP]", "rome", "rome", "is", "old", ".", "paris", "is", "new",
                      ".", "bern", "too", ".", "[SEP]"]
    # globals: 0 CLS, 1-3 question, 4-5 candidates, 6 paragraph of doc 0, 7-8 its sentences,
    # 9 paragraph of doc 1, 10 its sentence.
    assert f.global_kinds == [K.CLS, K.QUESTION, K.QUESTION, K.QUESTION, K.CANDIDATE, K.CANDIDATE,
                              K.PARAGRAPH, K.SENTENCE, K.SENTENCE, K.PARAGRAPH, K.SENTENCE]
    assert f.global_item_ids == [-1, 0, 1, 2, 0, 1, 0, 0, 1, 1, 2]
    assert TOKENIZER.convert_ids_to_tokens(f.global_input_ids) == [
        "[CLS]", "which", "city", "?", "[unused2]", "[unused2]", "[unused0]", "[unused1]", "[unused1]",
        "[unused0]", "[unused1]"]
    # [CLS]->0, question->1..3, [SEP]->0, title "rome"->paragraph 6, sentences->7 / 8, doc 1->10, [SEP]->0
    assert f.sentence_ids == [0, 1, 2, 3, 0, 6, 7, 7, 7, 7, 8, 8, 8, 8, 10, 10, 10, 0]
    # "paris" mentions candidate global 4, "bern" candidate global 5
    assert f.mention_ids == [-1] * 10 + [4] + [-1] * 3 + [5] + [-1] * 3
    # segments: 0 prefix, 1 the paragraph of doc 0, 2 the paragraph of doc 1, 0 final [SEP]
    assert f.long_paragraph_ids == [0] * 5 + [1] * 9 + [2] * 3 + [0]
    assert f.global_paragraph_ids == [0] * 6 + [1, 1, 1, 2, 2]
    assert f.global_sees_all == [True] * 6 + [False] * 5
    assert f.global_token_type_ids == [0] * 4 + [1] * 7
    assert f.long_token_type_ids == [0] * 5 + [1] * 13
    assert f.long_source_ids == [SOURCE_NONE] + [SOURCE_QUESTION] * 3 + [SOURCE_NONE] + [0] * 9 + [1] * 3 + [SOURCE_NONE]
    assert f.long_offsets[:6] == [[-1, -1], [0, 5], [6, 10], [10, 11], [-1, -1], [0, 4]]
    assert f.long_attention_mask == [1] * 18 and f.global_attention_mask == [1] * 11


def test_globals_over_budget_are_dropped_with_counts():
    # Budget 6: CLS + 3 question + 2 candidates fill it, so 3 paragraph + sentence tokens of doc 0
    # and 2 of doc 1 are dropped: 2 paragraph and 3 sentence; owners fall back to -1.
    with pytest.warns(UserWarning, match=r"dropped global tokens over 1 window\(s\): 2 paragraph, 3 sentence$"):
        (f,) = build_features(two_paragraph_example(), TOKENIZER, FeatureSettings(64, 6, max_question_len=5))
    assert len(f.global_input_ids) == 6
    assert f.sentence_ids[5:17] == [-1] * 12


def test_dropped_sentence_falls_back_to_its_paragraph():
    # Budget 8: 6 fixed + paragraph 0 + sentence 0; sentence 1 and doc 1's globals are dropped.
    with pytest.warns(UserWarning, match=r"over 1 window\(s\): 1 paragraph, 2 sentence$"):
        (f,) = build_features(two_paragraph_example(), TOKENIZER, FeatureSettings(64, 8, max_question_len=5))
    assert f.sentence_ids[5:14] == [6, 7, 7, 7, 7, 6, 6, 6, 6]


def test_long_question_is_truncated_with_a_warning():
    example = StructuredExample("q", "one two three four five six", [Document("text")])
    with pytest.warns(UserWarning, match="question truncated from 6 to 4"):
        (f,) = build_features(example, TOKENIZER, FeatureSettings(16, 8, max_question_len=4))
    assert f.global_kinds.count(K.QUESTION) == 4


def test_windows_repeat_question_and_respect_limits():
    text = " ".join(f"word{i}." for i in range(40))
    example = StructuredExample("w", "why", [Document.from_text(text)])
    windows = build_features(example, TOKENIZER, FeatureSettings(24, 40, stride=5, max_question_len=4))
    assert len(windows) > 3
    for w in windows:
        assert len(w.long_input_ids) <= 24
        assert TOKENIZER.convert_ids_to_tokens(w.long_input_ids[:3]) == ["[CLS]", "why", "[SEP]"]
        assert check_offsets(w, example, TOKENIZER) == len(w.long_input_ids) - 3


def test_dom_nodes_get_features_and_own_their_tokens():
    example = StructuredExample("d", "", [Document("big title small print")],
                                dom_nodes=[DomNode(TextSpan(0, 0, 21), [1.0, 2.0]),
                                           DomNode(TextSpan(0, 10, 21), [3.0, 4.0])])
    (f,) = build_features(example, TOKENIZER, FeatureSettings(16, 8, max_question_len=0, global_feature_size=2))
    # globals: CLS, node 0 (first owns "big"), node 1; the smaller node 1 owns "small print"
    assert f.global_kinds == [K.CLS, K.DOM_NODE, K.DOM_NODE]
    assert f.global_features == [[0.0, 0.0], [1.0, 2.0], [3.0, 4.0]]
    assert f.sentence_ids == [0, 0, 1, 1, 2, 2, 0]
    with pytest.raises(InputError, match=r"example 'd': field 'dom_nodes\[0\].features' has 2 values"):
        build_features(example, TOKENIZER, FeatureSettings(16, 8, max_question_len=0, global_feature_size=3))


def test_bpe_markers_and_offsets():
    example = two_paragraph_example()
    bpe = small_bpe_tokenizer([d.text for d in example.documents] + [example.question] * 3, vocab_size=300)
    markers = GlobalMarkers.from_tokenizer(bpe)
    # no [unused*]: sep "</s>", mask, unk, pad, in that order (never the CLS id "<s>")
    assert markers == GlobalMarkers(*bpe.convert_tokens_to_ids(["</s>", "<mask>", "<unk>", "<pad>"]))
    (f,) = build_features(example, bpe, FeatureSettings(64, 32, max_question_len=8))
    assert f.long_input_ids[0] == bpe.convert_tokens_to_ids("<s>")
    assert check_offsets(f, example, bpe) == len(f.long_input_ids) - 3


def test_collate_pads_model_inputs_only():
    rows = [f.to_dict() for f in build_features(two_paragraph_example(), TOKENIZER, FeatureSettings(64, 32, max_question_len=8))]
    short = StructuredExample("s", "a", [Document("b")])
    rows += [f.to_dict() for f in build_features(short, TOKENIZER, FeatureSettings(64, 32, max_question_len=8))]
    batch = collate_features(rows, TOKENIZER.pad_token_id)
    assert set(batch) == set(MODEL_INPUT_NAMES) - {"global_features", *PACKED_ROW_INPUTS}
    assert batch["long_input_ids"].shape == (2, 18) and batch["global_input_ids"].shape == (2, 11)
    # short example: [CLS] a [SEP] b [SEP] = 5 long tokens, CLS + 1 question + paragraph + sentence = 4 globals
    assert batch["long_attention_mask"][1].tolist() == [1] * 5 + [0] * 13
    assert batch["sentence_ids"][1, 5:].tolist() == [-1] * 13
    assert batch["global_sees_all"].dtype == torch.bool and batch["global_sees_all"][1].tolist() == [True, True] + [False] * 9
    assert batch["long_input_ids"].dtype == torch.int64


def test_model_inputs_are_the_schema_fields_present():
    (f,) = build_features(two_paragraph_example(), TOKENIZER, FeatureSettings(64, 32, max_question_len=8))
    inputs = f.model_inputs()
    # no DOM features, one example per row
    assert list(inputs) == [name for name in MODEL_INPUT_NAMES if name not in ("global_features", *PACKED_ROW_INPUTS)]
    assert inputs["sentence_ids"] == f.sentence_ids and "long_offsets" not in inputs


FOUR_KINDS = dict(paragraph=5, sentence=1, candidate=4, dom_node=6)


def test_model_config_conventions_reach_the_features():
    """A config's token types and global token ids, through a save/load round trip, are what
    build_features gives (the markers passed in come after the model's own)."""
    config = GlobalLocalConfig(long_max_len=64, global_max_len=32, long_question_token_type_id=2,
                               long_document_token_type_id=3, global_question_token_type_id=4,
                               global_structure_token_type_id=5, type_vocab_size=6, global_token_ids=FOUR_KINDS)
    config = GlobalLocalConfig.from_dict(config.to_dict())
    config.task_options = dict(max_question_len=8)
    settings = window_settings("test", config, ("max_question_len",))
    (f,) = build_features(two_paragraph_example(), TOKENIZER, settings, GlobalMarkers.from_tokenizer(TOKENIZER))
    assert f.long_token_type_ids == [2] * 5 + [3] * 13
    assert f.global_token_type_ids == [4] * 4 + [5] * 7
    assert f.global_input_ids[4:] == [4, 4, 5, 1, 1, 5, 1]  # 2 candidates, paragraph, 2 sentences, paragraph, sentence
    assert f.global_input_ids[1:4] == f.long_input_ids[1:4]  # no question marker: the question's wordpieces


@pytest.mark.parametrize("fields, message", [
    (dict(global_token_ids={"sentence": 1}), "missing: paragraph, candidate, dom_node, unknown: none"),
    (dict(global_token_ids={**FOUR_KINDS, "title": 3}), "missing: none, unknown: title"),
    (dict(global_token_ids={**FOUR_KINDS, "cpc_mask": 30522}),
     r"global_token_ids\['cpc_mask'\] must be an int in \[0, 30521\] \(vocab_size\), got 30522"),
    (dict(long_document_token_type_id=2),
     r"long_document_token_type_id must be an int in \[0, 1\] \(type_vocab_size\)"),
])
def test_bad_input_conventions_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        GlobalLocalConfig(**fields)
