"""The vocabulary of a Google checkpoint folder -> a transformers fast tokenizer with the ids the
checkpoint was trained with: a WordPiece vocab.txt (BERT's and ETC-base's) or a SentencePiece model
(ETC-large's), read as Google's own tokenizers read them (`read_vocabulary`)."""

import re
from pathlib import Path

from longdoc.errors import InputError, OptionError


def find_vocabulary(folder: Path, vocab: Path | None) -> Path:
    """`vocab` if given, else the folder's one vocabulary: a WordPiece vocab.txt (or its only
    *vocab*.txt) or a SentencePiece model (its only *.model)."""
    if vocab is None:
        wordpiece = [folder / "vocab.txt"] if (folder / "vocab.txt").is_file() else sorted(folder.glob("*vocab*.txt"))
        sentencepiece = sorted(folder.glob("*.model"))
        if wordpiece and sentencepiece:
            raise OptionError("{folder}: a WordPiece vocabulary ({wordpiece}) and a SentencePiece model "
                              "({sentencepiece}); name the one the checkpoint was trained with by {vocab}",
                              folder=folder, wordpiece=", ".join(path.name for path in wordpiece),
                              sentencepiece=", ".join(path.name for path in sentencepiece))
        if len(wordpiece + sentencepiece) != 1:
            found = ", ".join(path.name for path in wordpiece + sentencepiece) or "none"
            raise OptionError("{folder}: expected one WordPiece vocabulary (vocab.txt or *vocab*.txt), found: {found}, "
                              "or one SentencePiece model (*.model); name it with {vocab}", folder=folder, found=found)
        vocab = (wordpiece + sentencepiece)[0]
    if not vocab.is_file():
        raise OptionError("{vocab} {path}: not a file", path=vocab)
    return vocab


def is_sentencepiece(vocabulary: Path) -> bool:
    return vocabulary.suffix == ".model"


def read_vocabulary(folder: Path, vocab: Path | None, lower_case: bool, max_length: int, vocab_size: int,
                    sentencepiece_tokens: dict[str, str] | None = None):
    """The tokenizer of a Google checkpoint folder's vocabulary (`find_vocabulary`) and its path.

    WordPiece: BERT's basic tokenization, lower-cased or not. SentencePiece (`read_sentencepiece`):
    the model's own normalization (etcmodel's FullTokenizer ignores do_lower_case for it).

    Args:
        folder: the checkpoint folder searched for its one vocabulary when `vocab` is None.
        vocab: the vocabulary file (vocab.txt or a SentencePiece *.model); None: the folder's one.
        lower_case: lower-case text before WordPiece (not used for SentencePiece).
        max_length: the tokenizer's `model_max_length`.
        vocab_size: rows of the checkpoint's embeddings; a vocabulary with more tokens is refused.
        sentencepiece_tokens: the special tokens of a SentencePiece vocabulary (cls_token,
            sep_token, ...: piece names); None: none.

    Returns:
        (the transformers fast tokenizer, the vocabulary file's path).

    Raises:
        OptionError: no single vocabulary in the folder, or `vocab` not a file.
        InputError: a vocabulary with more tokens than `vocab_size`, or one that cannot be read,
            naming the file.
    """
    vocab = find_vocabulary(folder, vocab)
    if is_sentencepiece(vocab):
        tokenizer = read_sentencepiece(vocab, max_length, sentencepiece_tokens or {})
    else:
        tokenizer = read_wordpiece(vocab, lower_case, max_length)
    if len(tokenizer) > vocab_size:
        raise InputError(f"{vocab}: {len(tokenizer)} tokens, but the checkpoint's embeddings have {vocab_size} rows "
                         "(a vocabulary of another model)")
    return tokenizer, vocab


def read_wordpiece(vocab: Path, lower_case: bool, max_length: int):
    from transformers import BertTokenizerFast

    # Google's load_vocab: one token per "\n"-ended line, stripped, numbered from 0 (not splitlines():
    # it also splits at characters a vocabulary may hold, such as U+2028).
    lines = vocab.read_text(encoding="utf-8").removesuffix("\n").split("\n")
    tokens: dict[str, int] = {}
    for index, line in enumerate(lines):
        token = line.strip()
        if token in tokens:
            # etcmodel's load_vocab keeps the first and numbers densely, BERT's keeps the last: ids would be a guess.
            raise InputError(f"{vocab}:{index + 1}: token {token!r} again (first on line {tokens[token] + 1}); "
                             "expected each token once")
        tokens[token] = index
    return BertTokenizerFast(vocab=tokens, do_lower_case=lower_case, model_max_length=max_length)


# sentencepiece_model.proto's ModelProto.SentencePiece.Type (the two a text can produce) and
# TrainerSpec.ModelType values.
NORMAL, USER_DEFINED = 1, 4
UNIGRAM, BPE = 1, 2
SENTENCEPIECE_MODEL_TYPES = {UNIGRAM: "unigram", BPE: "BPE", 3: "word", 4: "char"}


def read_sentencepiece(path: Path, max_length: int, special_tokens: dict[str, str]):
    """A transformers fast tokenizer giving the ids etcmodel's FullTokenizer(spm_model_file=path)
    gives: `SentencePieceProcessor.EncodeAsPieces` then `PieceToId` per piece, i.e. the model's
    own ids (`EncodeAsIds`).

    Built from the model's pieces with tokenizers' Unigram or BPE model and the model's normalizer
    spec, in SentencePiece's order: the precompiled character map (nmt_nfkc etc.), extra spaces
    removed, spaces escaped as "▁", the dummy "▁" prefix, user-defined pieces always whole.
    Unigram: SentencePiece never produces control, unknown, unused or byte pieces from text;
    tokenizers' Unigram would match them by their surface ("</s>" in a text), so their scores are
    put below any path of ordinary pieces over the same characters (where the model lacks one of
    those characters, the surface still gets the piece: a difference from SentencePiece). BPE:
    SentencePiece merges the adjacent pair whose joined piece scores highest, leftmost first: the
    merges are every split of a piece into two pieces, ranked by the joined piece's score; a
    stretch of unknown characters is one unknown piece, and a user-defined piece, isolated before,
    is taken whole. Refused: models whose ids tokenizers cannot reproduce here (word or char
    models, byte fallback, whitespace as suffix) and pieces ending in a digit and a comma, which
    FullTokenizer re-encodes apart (ALBERT's rule in `encode_pieces`)."""
    import sentencepiece
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    data = path.read_bytes()
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
        # The loader FullTokenizer uses: what it refuses is refused here.
        sentencepiece.SentencePieceProcessor(model_proto=data)
    except (DecodeError, RuntimeError, OSError) as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise InputError(f"{path}: not a SentencePiece model ({reason})") from None
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    if trainer.model_type not in (UNIGRAM, BPE):
        kind = SENTENCEPIECE_MODEL_TYPES.get(trainer.model_type, str(trainer.model_type))
        raise InputError(f"{path}: a SentencePiece {kind} model; expected a unigram or BPE model")
    if trainer.byte_fallback or trainer.treat_whitespace_as_suffix:
        setting = "byte_fallback" if trainer.byte_fallback else "treat_whitespace_as_suffix"
        raise InputError(f"{path}: trainer_spec.{setting} is on; expected it off (its ids are not reproduced here)")
    pieces = list(proto.pieces)
    digit_comma = [piece.piece for piece in pieces if piece.type == NORMAL and len(piece.piece) > 1
                   and piece.piece[-1] == "," and piece.piece[-2].isdigit()]
    if digit_comma:
        raise InputError(f"{path}: {len(digit_comma)} pieces end in a digit and a comma ({digit_comma[0]!r}, ...): "
                         "etcmodel's FullTokenizer re-encodes them apart, which this tokenizer does not reproduce; "
                         "expected none")
    names = {piece.piece for piece in pieces}
    for role, name in special_tokens.items():
        if name not in names:
            raise InputError(f"{path}: no piece {name!r} (expected it as the {role})")

    if trainer.model_type == UNIGRAM:
        matched = [piece.type in (NORMAL, USER_DEFINED) for piece in pieces]
        lowest = min((piece.score for piece in pieces if piece.type == NORMAL), default=0.0)
        longest = max((len(piece.piece) for piece, match in zip(pieces, matched) if not match), default=0)
        # Below `longest` ordinary pieces of the lowest score: never the best path over characters the
        # model knows.
        never = (longest + 1) * min(lowest, -1.0) - 1.0
        vocab = [(piece.piece, piece.score if match else never) for piece, match in zip(pieces, matched)]
        tokenizer = Tokenizer(models.Unigram(vocab, unk_id=trainer.unk_id, byte_fallback=False))
    else:
        ranks = {piece.piece: (-piece.score, index) for index, piece in enumerate(pieces) if piece.type == NORMAL}
        merges = sorted((rank, joined[:split], joined[split:]) for joined, rank in ranks.items()
                        for split in range(1, len(joined)) if joined[:split] in ranks and joined[split:] in ranks)
        tokenizer = Tokenizer(models.BPE({piece.piece: index for index, piece in enumerate(pieces)},
                                         [(left, right) for _, left, right in merges],
                                         unk_token=pieces[trainer.unk_id].piece, fuse_unk=True, ignore_merges=True))

    steps = []
    if normalizer.precompiled_charsmap:
        steps.append(normalizers.Precompiled(normalizer.precompiled_charsmap))
    if normalizer.remove_extra_whitespaces:
        # SentencePiece removes spaces only, not other whitespace such as newlines.
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if normalizer.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if normalizer.add_dummy_prefix:
        # Metaspace adds no prefix to a text that starts with "▁"; SentencePiece adds one anyway.
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    splits = []
    if normalizer.add_dummy_prefix:
        splits.append(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False))
    user_defined = sorted((piece.piece for piece in pieces if piece.type == USER_DEFINED), key=len, reverse=True)
    if user_defined:
        splits.append(pre_tokenizers.Split(Regex("|".join(re.escape(piece) for piece in user_defined)), "isolated"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    # split_special_tokens: a special token's text in the input is tokenized as SentencePiece does, not
    # replaced by its id.
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length,
                                   unk_token=pieces[trainer.unk_id].piece, split_special_tokens=True, **special_tokens)
