"""`longdoc convert etc` with a SentencePiece vocabulary, as the large ETC checkpoints carry.

etcmodel's FullTokenizer(None, None, spm_model_file) tokenizes with `EncodeAsPieces` (no
lower-casing, no other preprocessing) and maps each piece with `PieceToId`; the one rule of its own
(ALBERT's: a piece ending in a digit and a comma is re-encoded without the comma) is refused by
the converter, so its ids are `PieceToId` of `EncodeAsPieces`. The models here are trained at test
time with etcmodel's id layout as far as its code names it: "<pad>" 0 (NQ's pad), "</s>" 1, "<s>" 2,
"<unused_N>" at N + 1 (35 = "<unused_34>" and 40-43 = "<unused_39>"-"<unused_42>" are named there;
"<unused_2>", NQ's SEP, is assumed at 3 by the same rule). Where etcmodel's model keeps "<unk>" is
not known; here it is 46, after "<unused_44>".
"""

import io
import shutil
from pathlib import Path

import pytest
import sentencepiece

from longdoc import cli
from longdoc.cli import main
from longdoc.model_folder import read_tokenizer
from longdoc.convert.vocabulary import read_vocabulary
from longdoc.errors import InputError

PADDING = Path(__file__).resolve().parents[1] / "fixtures" / "etc" / "padding"  # embeddings of 64 rows
UNUSED = [f"<unused_{n}>" for n in range(2, 45)]
# Words with casing, digits, accents and punctuation; "<", "/" and ">" so that the model knows the
# characters of "</s>" (a literal "</s>" in a text is then tokenized as characters by both).
CORPUS = [
    "The quick brown fox jumps over the lazy dog in Paris on 3 March 1990.",
    "ETC encodes long and structured inputs; its global tokens summarize sentences!",
    "Café, naïve and Émile are words with accents, as is Ångström?",
    "Numbers: 12, 1990, 2023 and 4096 appear in tables of x < y and y > z or a/b.",
    "PARIS, Paris and paris differ in case (QUOTES \"here\" and 'there').",
]
SENTENCES = [
    "The quick brown fox, 1990.",
    "PARIS Paris paris pArIs",
    "Café naïve Émile Ångström 12,5 1,000 2023!",
    "  two  spaces\tand a\nnewline ",
    "ＦＵＬＬ width, ﬁne ligature, ① circled",
    "日本語 and € € € unknown characters",
    "literal </s> <s> <pad> <unk> and <unused_39> inside",
    "\u2581leading mark and x\u200by zero width",
    "",
]


def train(path: Path, vocab_size: int, corpus: list[str], **options) -> Path:
    model = io.BytesIO()
    settings = dict(model_type="unigram", pad_id=0, eos_id=1, bos_id=2, unk_id=len(UNUSED) + 3,
                    user_defined_symbols=UNUSED, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
                    num_threads=1)
    settings.update(options)
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(corpus * 20), model_writer=model,
                                             vocab_size=vocab_size, **settings)
    path.write_bytes(model.getvalue())
    return path


def full_tokenizer_ids(processor, text: str) -> list[int]:
    """etcmodel's FullTokenizer: EncodeAsPieces, then PieceToId per piece (its digit-comma rule never
    fires: no piece ends in a digit and a comma)."""
    pieces = processor.EncodeAsPieces(text)
    assert not [p for p in pieces if len(p) > 1 and p[-1] == "," and p[-2].isdigit()]
    return [processor.PieceToId(piece) for piece in pieces]


@pytest.fixture(autouse=True)
def only_the_convert_command(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"convert": "longdoc.commands.convert"})


# Unigram (etcmodel's model type is not known) with SentencePiece's default normalizer (nmt_nfkc, extra
# spaces removed) and with none, every space kept; BPE (split_digits: else "2," becomes a piece here).
@pytest.fixture(scope="module", ids=["unigram", "unigram_identity", "bpe"], params=[
    {}, dict(normalization_rule_name="identity", remove_extra_whitespaces=False),
    dict(model_type="bpe", split_digits=True)])
def rich_model(tmp_path_factory, request) -> Path:
    return train(tmp_path_factory.mktemp("spm") / "vocab.model", 240, CORPUS, **request.param)


def test_token_ids_are_the_sentencepiece_models(rich_model, tmp_path):
    processor = sentencepiece.SentencePieceProcessor(model_file=str(rich_model))
    assert processor.GetPieceSize() > 120  # pieces beyond single characters: segmentation is a choice
    tokenizer, vocabulary = read_vocabulary(rich_model.parent, None, True, 512, processor.GetPieceSize())
    assert vocabulary == rich_model
    tokenizer.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    for loaded in (tokenizer, AutoTokenizer.from_pretrained(tmp_path, local_files_only=True), read_tokenizer(tmp_path)):
        for text in SENTENCES + CORPUS:
            assert loaded(text, add_special_tokens=False)["input_ids"] == full_tokenizer_ids(processor, text), text
    # The same ids as SentencePiece's own EncodeAsIds, and, where every character is known, its pieces.
    assert tokenizer(SENTENCES[2], add_special_tokens=False)["input_ids"] == processor.EncodeAsIds(SENTENCES[2])
    assert tokenizer.tokenize(SENTENCES[0]) == processor.EncodeAsPieces(SENTENCES[0])
    assert tokenizer.convert_ids_to_tokens(list(range(processor.GetPieceSize()))) == [
        processor.IdToPiece(i) for i in range(processor.GetPieceSize())]


def etc_folder(tmp_path: Path, **options) -> Path:
    """The padding fixture's checkpoint with a 64-piece SentencePiece model instead of vocab.txt."""
    folder = tmp_path / "etc_large"
    shutil.copytree(PADDING, folder)
    (folder / "vocab.txt").unlink()
    corpus = ["a banana in a cabin", "an old road and a bold dog", "no nonsense, inane and odd"]
    train(folder / "vocab_gpt_for_etc.model", 64, corpus, **options)
    return folder


def test_convert_gives_etcs_sentencepiece_inputs(tmp_path, capsys):
    from longdoc.data.examples import Document, Paragraph, Span, StructuredExample
    from longdoc.data.features import GlobalKind, build_features, window_settings
    from longdoc.model.config import GlobalLocalConfig

    folder = etc_folder(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", "etc", "--from", str(folder), "--out", str(out), "--long-max-len", "64",
                 "--global-max-len", "16", "--json"]) == 0
    assert '"vocabulary": "vocab_gpt_for_etc.model"' in capsys.readouterr().out
    config = GlobalLocalConfig.from_pretrained(out)
    assert config.global_token_ids == dict(sentence=1, cpc_mask=2, question=41, candidate=42, paragraph=43, dom_node=44)
    tokenizer = read_tokenizer(out)
    assert (tokenizer.cls_token, tokenizer.cls_token_id) == ("<unused_39>", 40)
    assert (tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id) == (3, 0, 46)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "vocab_gpt_for_etc.model"))
    for text in ("A banana, an odd road.", "NO Nonsense 42 ü"):
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == full_tokenizer_ids(processor, text)

    # Features built for the converted model: CLS 40 first on both inputs, etcmodel's global ids.
    config.task_options = dict(stride=0, max_question_len=12)
    text = "a banana. an old road."
    example = StructuredExample(id="ex", question="a dog?",
                                documents=[Document(text, [Paragraph(Span(0, 22), [Span(0, 9), Span(10, 22)])])])
    (features,) = build_features(example, tokenizer, window_settings("test", config, ("stride", "max_question_len")))
    question = tokenizer("a dog?", add_special_tokens=False)["input_ids"]
    assert features.long_input_ids[:len(question) + 2] == [40, *question, 3]
    assert features.global_input_ids == [40] + [41] * len(question) + [43, 1, 1]
    assert features.global_kinds[-3:] == [GlobalKind.PARAGRAPH, GlobalKind.SENTENCE, GlobalKind.SENTENCE]
    assert "CLS is the tokenizer's `<unused_39>` (40)" in (out / "README.md").read_text()


def assert_refused(capsys, arguments: list[str], message: str) -> None:
    assert main(["convert", "etc", *arguments]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1, error
    assert message in error, error


def test_both_vocabularies_ask_for_vocab(tmp_path, capsys):
    folder = etc_folder(tmp_path)
    shutil.copy(PADDING / "vocab.txt", folder)
    out = tmp_path / "out"
    assert_refused(capsys, ["--from", str(folder), "--out", str(out)],
                   "a WordPiece vocabulary (vocab.txt) and a SentencePiece model (vocab_gpt_for_etc.model); "
                   "name the one the checkpoint was trained with by --vocab")
    assert not out.exists()
    assert main(["convert", "etc", "--from", str(folder), "--out", str(out),
                 "--vocab", str(folder / "vocab_gpt_for_etc.model")]) == 0
    assert read_tokenizer(out).cls_token_id == 40


def test_corrupt_model_exits_2(tmp_path, capsys):
    folder = etc_folder(tmp_path)
    model = folder / "vocab_gpt_for_etc.model"
    model.write_bytes(model.read_bytes()[:100])
    out = tmp_path / "out"
    assert_refused(capsys, ["--from", str(folder), "--out", str(out)], f"{model}: not a SentencePiece model (")
    assert not out.exists()


@pytest.mark.parametrize("options, message", [
    (dict(model_type="char"), "a SentencePiece char model; expected a unigram or BPE model"),
    (dict(user_defined_symbols=UNUSED[::-1]), "id 40 is '<unused_7>'; expected '<unused_39>'"),
])
def test_models_whose_ids_are_not_etcmodels_are_refused(tmp_path, capsys, options, message):
    folder = etc_folder(tmp_path, **options)
    assert_refused(capsys, ["--from", str(folder), "--out", str(tmp_path / "out")], message)


def test_digit_comma_pieces_are_refused(tmp_path):
    # Without split_by_number, "7," can become one piece, which FullTokenizer would re-encode.
    model = train(tmp_path / "spiece.model", 100, ["in 1990, 1990, and 1990, again 12, 34, 56,"] * 5 +
                  ["the fox, the dog, 7,"] * 2, split_by_number=False, split_by_unicode_script=False)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model))
    assert "\u25817," in [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
    with pytest.raises(InputError, match=r"pieces end in a digit and a comma .*expected none"):
        read_vocabulary(tmp_path, None, True, 512, 1000)
