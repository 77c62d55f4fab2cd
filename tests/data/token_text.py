"""Test helpers: a small byte-level BPE tokenizer trained in memory, and the offsets check.

The check: each long token's offsets, sliced out of its source text (the question or a document),
must give that token's text. WordPiece tokens are compared with the slice after the tokenizer's
own normaliser (lowercasing, accent stripping), without the "##" prefix; byte-level BPE tokens are
decoded, and consecutive tokens whose offsets overlap (the bytes of one character split over
tokens) are decoded together. [UNK] matches any non-empty slice; only whitespace tokens may have
an empty slice. Offsets must not carry
whitespace at their ends unless the token is only whitespace.
"""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from longdoc.data.spans import SOURCE_NONE, SOURCE_QUESTION


def small_bpe_tokenizer(texts, vocab_size: int = 2000) -> PreTrainedTokenizerFast:
    """A RoBERTa-style byte-level BPE tokenizer (no [unused*] tokens) trained on `texts`."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>",
        pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
    )


def source_text(example, source: int) -> str:
    return example.question if source == SOURCE_QUESTION else example.documents[source].text


def check_offsets(features, example, tokenizer) -> int:
    """Assert every long token with a source slices back to its text; return how many were checked."""
    normalizer = tokenizer.backend_tokenizer.normalizer
    wordpiece = type(tokenizer.backend_tokenizer.model).__name__ == "WordPiece"
    rows = [
        (source, start, end, token_id)
        for token_id, (start, end), source in zip(features.long_input_ids, features.long_offsets,
                                                  features.long_source_ids)
        if source != SOURCE_NONE
    ]
    checked = 0
    for source, start, end, ids in _character_groups(rows):
        piece = source_text(example, source)[start:end]
        if start == end:
            # Only a whitespace token (BPE's lone "Ġ" after trimming) may have an empty slice.
            assert tokenizer.decode(ids).strip() == "", (example.id, source, start, ids)
            checked += len(ids)
            continue
        # Offsets carry no whitespace at the ends, except for tokens that are only whitespace.
        assert piece.strip() in (piece, ""), (example.id, source, start, end, piece)
        if ids == [tokenizer.unk_token_id]:
            checked += 1
            continue
        if wordpiece:
            expected = (normalizer.normalize_str(piece) if normalizer else piece).strip()
            got = "".join(t.removeprefix("##") for t in tokenizer.convert_ids_to_tokens(ids))
        else:
            expected, got = piece.strip(), tokenizer.decode(ids).strip()
        assert got == expected, (example.id, source, start, end, piece, got)
        checked += len(ids)
    return checked


def _character_groups(rows):
    """Merge consecutive tokens whose character spans overlap (one character's bytes over tokens)."""
    groups = []
    for source, start, end, token_id in rows:
        if groups and groups[-1][0] == source and start < groups[-1][2] and start >= groups[-1][1]:
            last = groups[-1]
            groups[-1] = (source, last[1], max(last[2], end), last[3] + [token_id])
        else:
            groups.append((source, start, end, [token_id]))
    return groups
