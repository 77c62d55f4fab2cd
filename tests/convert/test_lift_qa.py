"""Lifting transformers extractive QA checkpoints into span readers: start/end logits equal to the
source's on inputs the local window covers (BERT with an uncased and a cased WordPiece, RoBERTa with
a byte-level BPE, XLM-RoBERTa and CamemBERT with a SentencePiece unigram model, ELECTRA, DistilBERT;
random weights), the reader's span head as a task model's starting point, and the refusals
(unsupported architecture, a head without two outputs, no tokenizer, pickled weights)."""

import json
import shlex
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
from transformers import (
    AlbertConfig, AlbertForQuestionAnswering, AutoTokenizer, BertConfig, BertForQuestionAnswering, BertTokenizer,
    CamembertConfig, CamembertForQuestionAnswering,
    DebertaV2Config, DebertaV2ForQuestionAnswering, DistilBertConfig, DistilBertForQuestionAnswering,
    DistilBertTokenizer, ElectraConfig, ElectraForQuestionAnswering, RobertaConfig, RobertaForQuestionAnswering,
    RobertaTokenizer, XLMRobertaConfig, XLMRobertaForQuestionAnswering, XLMRobertaTokenizer,
)

from longdoc import cli
from longdoc.convert.checkpoint import CONVERT_TO_SAFETENSORS
from longdoc.convert.pretrained import minilm_path
from longdoc.model.span_reader import SpanReader
from longdoc.tasks.hotpotqa.model import HotpotQAModel

QUESTIONS = ["Where was Ada Lovelace born?", "Who was born in Paris?"]
CONTEXTS = [
    "Ada Lovelace was born in London. She wrote of the engine of Babbage.",
    "The painter was born in Paris, not in paris of the south. Ada was born in London.",
]
# A case-sensitive check: a cased tokenizer gives different ids for these two, an uncased one the same.
CASE_PROBE = ("Paris", "paris")


def minilm_tokenizer():
    """Uncased WordPiece (MiniLM's, 30522 tokens)."""
    return AutoTokenizer.from_pretrained(minilm_path())


def cased_wordpiece(tokenizer_class=BertTokenizer):
    """A cased WordPiece over the words of the questions and contexts ("Paris" and "paris" both in it)."""
    words = sorted({word for text in QUESTIONS + CONTEXTS for word in text.replace(".", " . ").replace(",", " , ")
                    .replace("?", " ? ").split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    return tokenizer_class(vocab={token: index for index, token in enumerate(vocab)}, do_lower_case=False)


def cased_distilbert_wordpiece():
    return cased_wordpiece(DistilBertTokenizer)


def byte_level_bpe():
    """A byte-level BPE (cased, RoBERTa's special tokens) trained on the questions and contexts."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(QUESTIONS + CONTEXTS, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model["merges"]]
    return RobertaTokenizer(vocab=model["vocab"], merges=merges)


def sentencepiece_unigram():
    """A SentencePiece unigram model (cased, XLM-R's special tokens) trained on the questions and contexts."""
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(QUESTIONS + CONTEXTS, vocab_size=200, unk_token="<unk>",
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    pieces = [tuple(piece) for piece in json.loads(unigram.to_str())["model"]["vocab"]]
    return XLMRobertaTokenizer(vocab=pieces + [("<mask>", 0.0)])


# Shapes of the random readers. initializer_range 0.2 (not BERT's 0.02) spreads the logits (standard
# deviation above 0.2, checked), so agreement to 1e-4 is not the agreement of two near-constant outputs.
SHAPES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, initializer_range=0.2)


def bert_reader(tokenizer, **config):
    return BertForQuestionAnswering(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **SHAPES, **config))


def electra_reader(tokenizer, **config):
    shapes = {"embedding_size": SHAPES["hidden_size"], **SHAPES, **config}
    return ElectraForQuestionAnswering(ElectraConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **shapes))


def distilbert_reader(tokenizer):
    return DistilBertForQuestionAnswering(DistilBertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=128, dim=SHAPES["hidden_size"], n_layers=2, n_heads=4,
        hidden_dim=48, initializer_range=SHAPES["initializer_range"]))


def roberta_reader(tokenizer, model_class=RobertaForQuestionAnswering, config_class=RobertaConfig):
    # RoBERTa numbers real tokens from pad + 1 = 2: 128 usable positions.
    return model_class(config_class(vocab_size=len(tokenizer), max_position_embeddings=130, type_vocab_size=1,
                                    pad_token_id=1, layer_norm_eps=1e-5, **SHAPES))


def xlm_roberta_reader(tokenizer):
    return roberta_reader(tokenizer, XLMRobertaForQuestionAnswering, XLMRobertaConfig)


def camembert_reader(tokenizer):
    return roberta_reader(tokenizer, CamembertForQuestionAnswering, CamembertConfig)


READERS = {
    "bert-uncased-wordpiece": (minilm_tokenizer, bert_reader),
    "bert-cased-wordpiece": (cased_wordpiece, bert_reader),
    "roberta-byte-level-bpe": (byte_level_bpe, roberta_reader),
    "xlm-roberta-sentencepiece": (sentencepiece_unigram, xlm_roberta_reader),
    "camembert-sentencepiece": (sentencepiece_unigram, camembert_reader),
    "electra-uncased-wordpiece": (minilm_tokenizer, electra_reader),
    "distilbert-cased-wordpiece": (cased_distilbert_wordpiece, distilbert_reader),
}


def save_source(folder, name: str, seed: int = 0):
    """A random QA checkpoint saved as transformers saves one (safetensors) with its tokenizer;
    returns (model in eval mode, tokenizer)."""
    make_tokenizer, make_model = READERS[name]
    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    model = make_model(tokenizer).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def run_cli(monkeypatch, *arguments) -> int:
    # Only this command is registered, so the test does not depend on the other subcommands.
    monkeypatch.setattr(cli, "COMMANDS", {"lift": "longdoc.commands.lift"})
    return cli.main(["lift", *map(str, arguments)])


@pytest.mark.parametrize("name, options", [pytest.param(name, [], id=name) for name in READERS] + [
    # Talking heads start at identity: the same computation.
    pytest.param("bert-cased-wordpiece", ["--talking-heads"], id="bert-cased-wordpiece-talking-heads"),
])
def test_lifted_reader_logits_equal_the_source_readers(tmp_path, monkeypatch, name, options):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source, source_tokenizer = save_source(tmp_path / "source", name)
    # The reader's defaults (absolute positions, no residual attention, radius 383, 256 global
    # positions): these inputs (at most 85 tokens, checked below) lie inside the local window.
    assert run_cli(monkeypatch, "--from", tmp_path / "source", "--out", tmp_path / "reader", *options) == 0
    reader = SpanReader.from_pretrained(tmp_path / "reader").eval()
    assert reader.config.position_embedding_type == "absolute" and not reader.config.residual_attention
    assert reader.config.talking_heads == ("--talking-heads" in options)

    # The tokenizer came along, cased or not, and loads with AutoTokenizer.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "reader")
    assert type(tokenizer) is type(source_tokenizer)
    cased = source_tokenizer(CASE_PROBE[0])["input_ids"] != source_tokenizer(CASE_PROBE[1])["input_ids"]
    assert cased == ("uncased" not in name)
    for text in CASE_PROBE + tuple(QUESTIONS):
        assert tokenizer(text)["input_ids"] == source_tokenizer(text)["input_ids"]

    # Question and context as the source reads them: the tokenizer's pair template, token types and
    # all, right-padded to one batch.
    encoded = tokenizer(QUESTIONS, CONTEXTS, padding=True, return_tensors="pt")
    source_encoded = source_tokenizer(QUESTIONS, CONTEXTS, padding=True, return_tensors="pt")
    assert torch.equal(encoded["input_ids"], source_encoded["input_ids"])
    first = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    # [CLS] q [SEP] c [SEP] (WordPiece, BERT's template) or <s> q </s></s> c </s> (RoBERTa's).
    assert first[0] == tokenizer.cls_token
    assert first.count(tokenizer.sep_token) == (2 if name.endswith("wordpiece") else 3)
    assert encoded["input_ids"].shape[1] <= 85
    with torch.no_grad():
        theirs = source(**source_encoded)
        ours = reader(long_input_ids=encoded["input_ids"], long_attention_mask=encoded["attention_mask"],
                      long_token_type_ids=encoded.get("token_type_ids"))
    real = encoded["attention_mask"].bool()
    assert not bool(real.all())  # the shorter pair is padded: the masks are exercised
    for ours_logits, their_logits in ((ours.start_logits, theirs.start_logits), (ours.end_logits, theirs.end_logits)):
        assert their_logits[real].std() > 0.2
        assert (ours_logits - their_logits)[real].abs().max().item() < 1e-4


def test_model_card_and_head_say_where_the_reader_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_source(tmp_path / "source", "bert-cased-wordpiece")
    config_path = tmp_path / "source" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "_name_or_path": "someone/bert-squad"}))
    assert run_cli(monkeypatch, "--from", tmp_path / "source", "--out", tmp_path / "reader") == 0
    card = (tmp_path / "reader" / "README.md").read_text(encoding="utf-8")
    assert f"Source folder: `{tmp_path / 'source'}`" in card
    assert "Source architecture: `BertForQuestionAnswering`" in card
    assert "Source `_name_or_path`: `someone/bert-squad`" in card
    assert "on inputs of at most 128 tokens" in card  # the source's 128 positions (radius 383 + 1 is more)
    assert "SpanReader.from_pretrained" in card

    saved = load_file(tmp_path / "reader" / "model.safetensors")
    source = load_file(tmp_path / "source" / "model.safetensors")
    torch.testing.assert_close(saved["span_head.projection.weight"], source["qa_outputs.weight"], rtol=0, atol=0)
    torch.testing.assert_close(saved["span_head.projection.bias"], source["qa_outputs.bias"], rtol=0, atol=0)
    config = json.loads((tmp_path / "reader" / "config.json").read_text())
    assert config["task"] == "span_reader" and config["architectures"] == ["SpanReader"]
    assert config["task_options"] == {"max_answer_length": 15}


def test_a_task_model_starts_its_span_head_from_the_readers(tmp_path, monkeypatch):
    """`longdoc train hotpotqa --init READER`: TaskModel.from_encoder on a reader folder."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_source(tmp_path / "source", "bert-cased-wordpiece")
    assert run_cli(monkeypatch, "--from", tmp_path / "source", "--out", tmp_path / "reader") == 0
    reader = SpanReader.from_pretrained(tmp_path / "reader")
    torch.manual_seed(0)
    model = HotpotQAModel.from_encoder(tmp_path / "reader", type_from_question=True)
    assert isinstance(model, HotpotQAModel) and model.config.task == "hotpotqa"
    assert model.task_options["type_from_question"] is True
    assert model.task_options["max_answer_length"] == HotpotQAModel.default_task_options["max_answer_length"]
    assert "span_reader" not in json.dumps(model.config.to_dict())  # no trace of the reader's own task
    for name, value in reader.span_head.state_dict().items():
        torch.testing.assert_close(model.span_head.state_dict()[name], value, rtol=0, atol=0)
    reader_encoder = reader.encoder.state_dict()
    for name, value in model.encoder.state_dict().items():
        torch.testing.assert_close(value, reader_encoder[name], rtol=0, atol=0)
    # The reader itself is left as it was: the task model holds copies.
    with torch.no_grad():
        model.span_head.projection.weight.add_(1.0)
    assert not torch.equal(model.span_head.projection.weight, reader.span_head.projection.weight)


def assert_refused(monkeypatch, capsys, source, out, *expected: str) -> None:
    """`longdoc lift --from source --out out`: exit 2, one error line naming `source` and holding
    each of `expected`, nothing under `out` and no temporary folder beside it."""
    before = set(out.parent.iterdir())
    capsys.readouterr()  # what saving the source printed
    assert run_cli(monkeypatch, "--from", source, "--out", out) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("longdoc lift: error: ")
    assert str(source) in error
    for text in expected:
        assert text in error
    assert not out.exists() and set(out.parent.iterdir()) == before


def test_unsupported_reader_architectures_are_refused_by_name(tmp_path, monkeypatch, capsys):
    tokenizer = minilm_tokenizer()
    small = dict(vocab_size=len(tokenizer), max_position_embeddings=64)
    for name, model in (
        ("albert", AlbertForQuestionAnswering(AlbertConfig(embedding_size=8, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=24, **small))),
        ("deberta", DebertaV2ForQuestionAnswering(DebertaV2Config(hidden_size=16, num_hidden_layers=1,
                                                                  num_attention_heads=2, intermediate_size=24, **small))),
    ):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        assert_refused(monkeypatch, capsys, tmp_path / name, tmp_path / f"{name}-out",
                       f"architecture {type(model).__name__} cannot be lifted",
                       "supported QA readers: BertForQuestionAnswering, RobertaForQuestionAnswering")


def test_a_head_without_two_outputs_is_refused(tmp_path, monkeypatch, capsys):
    tokenizer = minilm_tokenizer()
    bert_reader(tokenizer, num_labels=3).save_pretrained(tmp_path / "three")
    tokenizer.save_pretrained(tmp_path / "three")
    assert_refused(monkeypatch, capsys, tmp_path / "three", tmp_path / "out",
                   "qa_outputs.weight has shape (3, 32)", "two outputs (start and end logits): expected [2, hidden]")


def test_an_electra_with_narrower_embeddings_is_refused(tmp_path, monkeypatch, capsys):
    tokenizer = minilm_tokenizer()
    electra_reader(tokenizer, embedding_size=16).save_pretrained(tmp_path / "small")
    tokenizer.save_pretrained(tmp_path / "small")
    assert_refused(monkeypatch, capsys, tmp_path / "small", tmp_path / "out",
                   "embedding_size 16 differs from hidden_size 32")


def test_weights_without_a_tokenizer_are_refused(tmp_path, monkeypatch, capsys):
    bert_reader(minilm_tokenizer()).save_pretrained(tmp_path / "bare")
    assert_refused(monkeypatch, capsys, tmp_path / "bare", tmp_path / "out",
                   "no tokenizer files (expected one of tokenizer.json")


def test_pickled_weights_are_refused_and_the_advised_conversion_works(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source, _ = save_source(tmp_path / "source", "bert-uncased-wordpiece")
    folder = tmp_path / "source"
    # Our own tensors, pickled by torch.save as transformers' old format: trusted here, so the advice can be run.
    torch.save(source.state_dict(), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    assert_refused(monkeypatch, capsys, folder, tmp_path / "out", "only pytorch_model.bin found",
                   "Convert it once")

    command = shlex.split(CONVERT_TO_SAFETENSORS)
    subprocess.run([sys.executable, *command[1:], str(folder)], check=True)
    assert run_cli(monkeypatch, "--from", folder, "--out", tmp_path / "out") == 0
    saved = load_file(tmp_path / "out" / "model.safetensors")
    expected = source.qa_outputs.weight.detach()
    torch.testing.assert_close(saved["span_head.projection.weight"], expected, rtol=0, atol=0)
