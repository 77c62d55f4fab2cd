"""A converted ETC model gets the inputs etcmodel's own input code gave it.

Fixtures (tests/fixtures/etc_inputs/*.npz, written by make_etc_inputs.py there from Google's
etcmodel/models/input_utils.py): ETC's pretraining layout, sentences on the long input and one
global token per sentence, with the ids, token types, masks and relative ids etcmodel received.
longdoc builds the same rows with its pretraining row builder under the converted config; its
masks and relative ids (blocked, as the attention reads them) are spread into dense [query, key]
arrays and compared with etcmodel's at every real query.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from longdoc.convert.etc import LengthOptions, _relative_rows, etc_config_to_longdoc
from longdoc.convert.pretrained import default_tokenizer
from longdoc.data.batching import collate_features
from longdoc.data.examples import Candidate, Document, Paragraph, Span, StructuredExample, TextSpan
from longdoc.data.features import GlobalKind, build_features, window_settings
from longdoc.data.pretraining_corpus import PretrainingCollator, PretrainingSettings
from longdoc.model.inputs import check_and_collect, encoder_inputs
from longdoc.model.side_inputs import RelativeIdLayout, build_side_inputs

FIXTURES = Path(__file__).parents[1] / "fixtures" / "etc_inputs"
CASES = sorted(path.stem for path in FIXTURES.glob("*.npz"))
TOKENIZER = default_tokenizer()  # BERT uncased WordPiece, the base checkpoints' vocabulary


def converted_config(structure: dict, **source):
    k = structure["relative_pos_max_distance"]
    etc_config = dict(vocab_size=30522, local_radius=structure["local_radius"], relative_pos_max_distance=k,
                      relative_vocab_size=2 * k + 4, use_hard_g2l_mask=structure["use_hard_g2l_mask"], **source)
    return etc_config_to_longdoc(etc_config, Path("etc_config.json"),
                                 LengthOptions(structure["long_length"], structure["global_length"]))


def longdoc_batch(structure: dict, config) -> dict:
    """longdoc's pretraining rows (one document per row) of the fixture's sentences."""
    collator = PretrainingCollator(TOKENIZER, PretrainingSettings(structure["long_length"], structure["global_length"]),
                                   config)
    rows = []
    for sentences in structure["rows"]:
        ids = torch.tensor([t for sentence in sentences for t in sentence])
        owners = torch.tensor([s for s, sentence in enumerate(sentences) for _ in sentence])
        rows.append(collator.sentences_row(ids, owners, len(sentences)))
    return collate_features(rows, TOKENIZER.pad_token_id)


def dense_side_inputs(batch: dict, config) -> dict[str, np.ndarray]:
    """longdoc's masks (bool) and relative ids as dense [B, query, key] arrays: l2l, l2g, g2g, g2l."""
    side = build_side_inputs(
        check_and_collect(config, encoder_inputs(batch)), local_radius=config.local_radius,
        max_relative_distance=config.max_relative_distance, hard_g2l=config.hard_g2l, hard_l2g=config.hard_l2g,
        local_attention_within_paragraph=config.local_attention_within_paragraph, dtype=torch.float32)
    batch_size, length = batch["long_input_ids"].shape
    num_globals = batch["global_input_ids"].shape[1]
    b, window = side.block_size, 3 * side.block_size
    long_allowed = (side.long_mask_bias[:, 0] == 0).reshape(batch_size, -1, window + num_globals).numpy()
    long_ids = side.long_relative_ids[:, 0].reshape(batch_size, -1, window + num_globals).numpy()
    l2l_allowed = np.zeros((batch_size, length, length), bool)
    l2l_ids = np.full((batch_size, length, length), -1)
    for query in range(length):
        for column in range(window):
            key = query // b * b - b + column  # the window starts a block before the query's block
            if 0 <= key < length:
                l2l_allowed[:, query, key] = long_allowed[:, query, column]
                l2l_ids[:, query, key] = long_ids[:, query, column]
    global_allowed = (side.global_mask_bias[:, 0] == 0).numpy()
    global_ids = side.global_relative_ids[:, 0].numpy()
    return dict(
        l2l_att_mask=l2l_allowed, l2l_relative_att_ids=l2l_ids,
        l2g_att_mask=long_allowed[:, :length, window:], l2g_relative_att_ids=long_ids[:, :length, window:],
        g2g_att_mask=global_allowed[..., :num_globals], g2g_relative_att_ids=global_ids[..., :num_globals],
        g2l_att_mask=global_allowed[..., num_globals:num_globals + length],
        g2l_relative_att_ids=global_ids[..., num_globals:num_globals + length],
    )


def dense_etc_l2l(etc_blocked: np.ndarray, radius: int, length: int) -> np.ndarray:
    """etcmodel's l2l [B, L, 2r + 1] (column c: key i - r + c) as [B, L, L], -1 outside the window."""
    dense = np.full((etc_blocked.shape[0], length, length), -1)
    for query in range(length):
        for column in range(2 * radius + 1):
            key = query - radius + column
            if 0 <= key < length:
                dense[:, query, key] = etc_blocked[:, query, column]
    return dense


@pytest.mark.parametrize("case", CASES)
def test_feature_builder_gives_etcmodels_inputs(case):
    reference = np.load(FIXTURES / f"{case}.npz")
    structure = json.loads(str(reference["structure"]))
    config = converted_config(structure)
    batch = longdoc_batch(structure, config)
    length, num_globals = batch["long_input_ids"].shape[1], batch["global_input_ids"].shape[1]
    long_valid = reference["long_breakpoints"][:, ::-1].cumsum(1)[:, ::-1] > 0  # etcmodel's example id > 0
    global_valid = reference["global_breakpoints"][:, ::-1].cumsum(1)[:, ::-1] > 0

    # Ids and token types, padding included (etcmodel pads further, with the same 0s).
    for name, etc_name in (("long_input_ids", "token_ids"), ("long_token_type_ids", "segment_ids"),
                           ("global_input_ids", "global_token_ids"), ("global_token_type_ids", "global_segment_ids")):
        etc_values, width = reference[etc_name], batch[name].shape[1]
        np.testing.assert_array_equal(batch[name].numpy(), etc_values[:, :width], err_msg=name)
        assert not etc_values[:, width:].any(), etc_name
    np.testing.assert_array_equal(batch["long_attention_mask"].numpy().astype(bool), long_valid[:, :length])
    np.testing.assert_array_equal(batch["global_attention_mask"].numpy().astype(bool), global_valid[:, :num_globals])
    assert not long_valid[:, length:].any() and not global_valid[:, num_globals:].any()
    real = long_valid[:, :length]
    np.testing.assert_array_equal(batch["sentence_ids"].numpy()[real], reference["sentence_ids"][:, :length][real])

    # Masks and relative ids at every real query. Relative ids: the row of etcmodel's table that
    # the converted model reads for longdoc's id (the converter swaps the linked/unlinked rows).
    ours = dense_side_inputs(batch, config)
    rows = _relative_rows(RelativeIdLayout(config.max_relative_distance))([np.arange(config.relative_vocab_size)])
    etc = {name: reference[name] for name in ours}
    etc["l2l_att_mask"] = dense_etc_l2l(etc["l2l_att_mask"], config.local_radius, reference["token_ids"].shape[1])
    etc["l2l_relative_att_ids"] = dense_etc_l2l(etc["l2l_relative_att_ids"], config.local_radius,
                                                reference["token_ids"].shape[1])
    keys = {"l2l": length, "l2g": num_globals, "g2g": num_globals, "g2l": length}
    for piece, key_count in keys.items():
        queries = long_valid[:, :length] if piece[0] == "l" else global_valid[:, :num_globals]
        query_count = queries.shape[1]
        etc_mask = etc[f"{piece}_att_mask"][:, :query_count, :key_count] == 1
        our_mask = ours[f"{piece}_att_mask"]
        np.testing.assert_array_equal(our_mask[queries], etc_mask[queries], err_msg=f"{piece} mask, {case}")
        # etcmodel pads its keys further; none of them is allowed to a real query.
        assert not (etc[f"{piece}_att_mask"][:, :query_count, key_count:][queries] == 1).any()
        allowed = queries[:, :, None] & our_mask
        etc_ids = etc[f"{piece}_relative_att_ids"][:, :query_count, :key_count]
        np.testing.assert_array_equal(rows[ours[f"{piece}_relative_att_ids"]][allowed], etc_ids[allowed],
                                      err_msg=f"{piece} relative ids, {case}")
        assert allowed.any(), f"{piece}: no allowed pair compared"


def test_global_token_ids_are_etcs_wordpieces():
    """The ids the converted config names are the [unusedN] wordpieces ETC's input code used."""
    config = converted_config(dict(relative_pos_max_distance=12, local_radius=84, use_hard_g2l_mask=True,
                                   long_length=4096, global_length=256))
    names = {kind: TOKENIZER.convert_ids_to_tokens(token_id) for kind, token_id in config.global_token_ids.items()}
    assert names == dict(sentence="[unused0]", cpc_mask="[unused1]", question="[unused2]", candidate="[unused3]",
                         paragraph="[unused4]", dom_node="[unused5]")


def test_cpc_sentences_take_etcs_cpc_global_token():
    structure = dict(relative_pos_max_distance=12, local_radius=84, use_hard_g2l_mask=True, long_length=64,
                     global_length=8)
    config = converted_config(structure)
    collator = PretrainingCollator(TOKENIZER, PretrainingSettings(64, 8, cpc_sentence_rate=0.5), config)
    owners = [s for s in range(4) for _ in range(5)]
    row = dict(long_input_ids=list(range(2000, 2020)), sentence_ids=owners, word_starts=[1] * 20, num_sentences=4)
    torch.manual_seed(0)
    batch = collator([row])
    cpc = batch["cpc_positions"][:, 1].tolist()
    assert len(cpc) == 2
    expected = [2 if s in cpc else 1 for s in range(4)]
    assert batch["global_input_ids"][0].tolist() == expected
    assert batch["long_token_type_ids"].unique().tolist() == [1]
    assert batch["global_token_type_ids"].unique().tolist() == [0]
    # The second pass (each CPC sentence alone, unmasked) keeps the sentence token.
    assert batch["cpc_global_input_ids"].flatten().tolist() == [1, 1]


def test_task_features_for_a_converted_model_follow_its_config():
    config = converted_config(dict(relative_pos_max_distance=12, local_radius=84, use_hard_g2l_mask=True,
                                   long_length=64, global_length=32))
    config.task_options = dict(stride=0, max_question_len=8)
    text = "Rome is old. Paris is new."
    example = StructuredExample(
        id="ex", question="which city?",
        documents=[Document(text, [Paragraph(Span(0, 26), [Span(0, 12), Span(13, 26)])])],
        candidates=[Candidate("paris", [TextSpan(0, 13, 18)])],
    )
    (features,) = build_features(example, TOKENIZER, window_settings("test", config, ("stride", "max_question_len")))
    assert features.long_token_type_ids == [1] * len(features.long_input_ids)
    assert features.global_token_type_ids == [0] * len(features.global_input_ids)
    marker = {GlobalKind.QUESTION: 3, GlobalKind.CANDIDATE: 4, GlobalKind.PARAGRAPH: 5, GlobalKind.SENTENCE: 1}
    assert [i for i, k in zip(features.global_input_ids, features.global_kinds) if k in marker] == [
        marker[k] for k in features.global_kinds if k in marker]
    assert features.global_kinds.count(GlobalKind.SENTENCE) == 2
    assert features.global_kinds.count(GlobalKind.QUESTION) == 3
    assert TOKENIZER.convert_ids_to_tokens(features.long_input_ids[:5]) == ["[CLS]", "which", "city", "?", "[SEP]"]


def test_converted_folder_config_carries_etcs_conventions(tmp_path):
    from longdoc.convert.etc import convert_etc
    from longdoc.model.config import GlobalLocalConfig

    out = tmp_path / "etc"
    convert_etc(Path(__file__).parents[1] / "fixtures" / "etc" / "padding", out, LengthOptions(64, 8))
    config = GlobalLocalConfig.from_pretrained(out)
    assert (config.long_question_token_type_id, config.long_document_token_type_id) == (1, 1)
    assert (config.global_question_token_type_id, config.global_structure_token_type_id) == (0, 0)
    assert config.global_token_ids == dict(sentence=1, cpc_mask=2, question=3, candidate=4, paragraph=5, dom_node=6)
