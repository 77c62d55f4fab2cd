"""Continued pretraining: corpus reading and packing, whole-word and CPC masking, the model's
losses and heads, the saved encoder as --init, bad corpora, and a short run that lowers both losses."""

import json
import math
import random
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from longdoc.data.features import GlobalMarkers
from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.data.pretraining_corpus import (
    PretrainingCollator,
    PretrainingSettings,
    prepare_corpus,
    read_corpus,
)
from longdoc.model.pretraining import HEADS_FILE, GlobalLocalForPretraining
from longdoc.model_folder import write_new_folder
from longdoc.train.pretraining import save_encoder

NAMES = "alice bob carol dave erin frank grace henry irene jack kate liam mary nick olga paul rose sam tina victor".split()
CITIES = "paris berlin rome madrid oslo vienna london dublin prague warsaw".split()


def person_document(name: str, rng: random.Random) -> str:
    """Six sentences about one person, always in the same order: a masked sentence can be told from
    other documents' sentences by the name its neighbours carry, and from its own document's by its place."""
    n = name.capitalize()
    return " ".join([
        f"{n} was born in {rng.choice(CITIES).capitalize()}.",
        f"{n} works as a {rng.choice('baker teacher doctor pilot farmer lawyer painter singer'.split())}.",
        f"{n} owns a {rng.choice('red blue green black white yellow'.split())} car.",
        f"The favourite food of {n} is {rng.choice('bread rice fish soup cheese cake'.split())}.",
        f"{n} has {rng.randint(2, 9)} brothers.",
        f"Every summer {n} visits {rng.choice(CITIES).capitalize()}.",
    ])


def write_people(folder: Path, count: int = 20, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for name in NAMES[:count]:
        (folder / f"{name}.txt").write_text(person_document(name, rng), encoding="utf-8")
    return folder


def tiny_config(tokenizer, **overrides) -> GlobalLocalConfig:
    # initializer_range 0.2: with BERT's 0.02 a 32-wide random model's global outputs barely depend
    # on their sentences at the start, and CPC has nothing to sharpen in a short run.
    values = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, long_max_len=128, global_max_len=16, local_radius=8,
                  initializer_range=0.2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return GlobalLocalConfig(**{**values, **overrides})


@pytest.fixture
def one_thread():
    # Tiny models on a shared 2-core machine run many times faster on one thread than on two contended ones.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def prepared(tmp_path, tokenizer, settings, **read_options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inputs, report = prepare_corpus(read_corpus(tmp_path / "corpus", cache_dir=tmp_path / "cache", **read_options),
                                        tokenizer, settings)
    return inputs, report, [str(w.message) for w in caught]


def write_corpus(tmp_path, *texts: str) -> None:
    """tmp_path/corpus with one .txt file per text (a.txt, b.txt, ...), as `prepared` reads it."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in zip("abcdefgh", texts):
        (corpus / f"{name}.txt").write_text(text, encoding="utf-8")


def test_documents_are_split_into_sentences_and_packed(tmp_path, tokenizer):
    write_corpus(tmp_path, "Ann met Bo. They talked.\n\nBo left early. Ann stayed.", "Unbelievably true. Short one.")
    settings = PretrainingSettings(long_length=10, global_max_len=3, min_sentences=2)
    inputs, report, _ = prepared(tmp_path, tokenizer, settings)

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    a = [ids(s) for s in ("Ann met Bo.", "They talked.", "Bo left early.", "Ann stayed.")]
    assert [len(s) for s in a] == [4, 3, 4, 3]
    rows = [dict(inputs[i]) for i in range(len(inputs))]
    # a.txt: 4 + 3 tokens fit in 10, the third sentence would make 11: a second input starts there.
    assert rows[0]["long_input_ids"] == a[0] + a[1]
    assert rows[0]["sentence_ids"] == [0] * 4 + [1] * 3 and rows[0]["num_sentences"] == 2
    assert rows[1]["long_input_ids"] == a[2] + a[3] and rows[1]["sentence_ids"] == [0] * 4 + [1] * 3
    b = [ids("Unbelievably true."), ids("Short one.")]
    assert rows[2]["long_input_ids"] == b[0] + b[1]
    # Word starts: the continuation pieces of "unbelievably" are not word starts.
    pieces = tokenizer.convert_ids_to_tokens(b[0])
    assert rows[2]["word_starts"][:len(b[0])] == [int(not p.startswith("##")) for p in pieces]
    assert report.kept_documents == 2 and report.inputs == 3 and report.sentences == 6
    assert report.tokens == sum(len(s) for s in a + b)


def test_global_budget_and_long_sentences_are_cut_at_word_starts(tmp_path, tokenizer):
    write_corpus(tmp_path, "One. Two. Three. Four. Five.", "Unbelievably true unbelievably true unbelievably. End.")
    settings = PretrainingSettings(long_length=64, global_max_len=2, max_sentence_tokens=7)
    inputs, _, _ = prepared(tmp_path, tokenizer, settings)
    rows = [dict(inputs[i]) for i in range(len(inputs))]
    assert [r["num_sentences"] for r in rows] == [2, 2, 1, 2, 2]  # at most 2 global tokens per input
    word = tokenizer("unbelievably", add_special_tokens=False)["input_ids"]
    true = tokenizer("true", add_special_tokens=False)["input_ids"]
    period = tokenizer(".", add_special_tokens=False)["input_ids"]
    assert len(word) == 5 and len(true) == len(period) == 1
    # 18 tokens, at most 7 a piece, cut before a word start: 6 + 6 + 6, never inside "unbelievably".
    assert rows[3]["long_input_ids"] == word + true + word + true
    assert rows[3]["sentence_ids"] == [0] * 6 + [1] * 6
    assert rows[4]["long_input_ids"][:6] == word + period and rows[4]["sentence_ids"][:6] == [0] * 6


def test_one_document_per_line_and_a_saved_dataset(tmp_path, tokenizer):
    from datasets import Dataset

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "lines.txt").write_text("A cat sat. It purred.\nA dog ran. It barked.\n\n", encoding="utf-8")
    settings = PretrainingSettings(long_length=64, global_max_len=8)
    inputs, report, _ = prepared(tmp_path, tokenizer, settings, one_per_line=True)
    assert report.kept_documents == 2 and len(inputs) == 2 and report.empty_documents == 1

    saved = tmp_path / "saved"
    Dataset.from_dict({"text": ["A cat sat. It purred.", "A dog ran. It barked."], "id": [1, 2]}).save_to_disk(saved)
    from_disk, report = prepare_corpus(read_corpus(saved), tokenizer, settings)
    assert [r["long_input_ids"] for r in from_disk] == [r["long_input_ids"] for r in inputs]


def test_bad_corpora_are_refused_with_counts(tmp_path, tokenizer):
    settings = PretrainingSettings(long_length=64, global_max_len=8)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with pytest.raises(InputError, match="holds no files"):
        read_corpus(corpus)
    with pytest.raises(InputError, match="no such file or folder"):
        read_corpus(tmp_path / "missing")
    (corpus / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    (corpus / "blank.txt").write_text("  \n\n ", encoding="utf-8")
    (corpus / "short.txt").write_text("Only one sentence here.", encoding="utf-8")
    with pytest.raises(InputError) as refused:
        prepared(tmp_path, tokenizer, settings)
    message = str(refused.value)
    assert "no document to train on" in message and "1 file(s) not text" in message
    assert "1 empty document(s)" in message and "1 document(s) with fewer than 2 sentence(s)" in message

    (corpus / "good.txt").write_text("Two sentences. Here they are.", encoding="utf-8")
    inputs, report, messages = prepared(tmp_path, tokenizer, settings)
    assert len(inputs) == 1 and report.kept_documents == 1 and report.documents == 3
    assert any("skipped 1 file(s) not text" in m and "kept 1 of 3" in m for m in messages)

    (corpus / "good.txt").unlink()
    (corpus / "short.txt").unlink()
    (corpus / "blank.txt").unlink()
    with pytest.raises(InputError, match="no text to train on: 1 file"):
        prepared(tmp_path, tokenizer, settings)


def test_collator_masks_whole_words_and_cpc_sentences(tmp_path, tokenizer):
    corpus = write_people(tmp_path / "corpus")
    # Long words, so whole-word masking has multi-piece words to keep together.
    (corpus / "long.txt").write_text(" ".join(["Unbelievably enormous gigantically huge things happened."] * 40))
    settings = PretrainingSettings(long_length=512, global_max_len=64, cpc_sentence_rate=0.3)
    inputs, _, _ = prepared(tmp_path, tokenizer, settings)
    rows = [dict(inputs[i]) for i in range(len(inputs))]
    collator = PretrainingCollator(tokenizer, settings)
    torch.manual_seed(0)
    batch = collator(rows)
    marker = GlobalMarkers.from_tokenizer(tokenizer).sentence
    mask_id = tokenizer.mask_token_id
    labels, ids = batch["mlm_labels"], batch["long_input_ids"]
    seen_masked = seen_cpc = 0
    for b, row in enumerate(rows):
        length, count = len(row["long_input_ids"]), row["num_sentences"]
        original = torch.tensor(row["long_input_ids"])
        owners = torch.tensor(row["sentence_ids"])
        assert batch["global_input_ids"][b, :count].eq(marker).all() and batch["global_attention_mask"][b, count:].eq(0).all()
        cpc = [int(s) for e, s in batch["cpc_positions"].tolist() if e == b]
        assert 1 <= len(cpc) < count and len(cpc) == min(count - 1, max(1, round(0.3 * count)))
        in_cpc = torch.isin(owners, torch.tensor(cpc))
        assert ids[b, :length][in_cpc].eq(mask_id).all() and labels[b, :length][in_cpc].eq(-100).all()
        targets = labels[b, :length] != -100
        assert labels[b, :length][targets].equal(original[targets])
        # Whole words: every piece of a chosen word is a target.
        word = torch.cumsum(torch.tensor(row["word_starts"]), 0)
        for w in word[targets].unique():
            assert targets[word == w].all()
        # The budget: about mask_rate of the non-CPC tokens (whole words can overshoot by one word).
        free = int((~in_cpc).sum())
        assert abs(int(targets.sum()) - 0.15 * free) <= 1 + 4
        seen_masked += int(ids[b, :length][targets].eq(mask_id).sum())
        seen_cpc += len(cpc)
        assert labels[b, length:].eq(-100).all()
    # 80/10/10: most targets are [MASK], some are not.
    assert 0.65 < seen_masked / int((labels != -100).sum()) < 0.95
    # The second pass: each CPC sentence alone, unmasked, one global token owning all its tokens.
    assert len(batch["cpc_positions"]) == seen_cpc == batch["cpc_long_input_ids"].shape[0]
    for n, (b, s) in enumerate(batch["cpc_positions"].tolist()):
        row = rows[b]
        sentence = [t for t, o in zip(row["long_input_ids"], row["sentence_ids"]) if o == s]
        assert batch["cpc_long_input_ids"][n, :len(sentence)].tolist() == sentence
        assert batch["cpc_sentence_ids"][n, :len(sentence)].eq(0).all()
        assert batch["cpc_global_input_ids"][n].tolist() == [marker]


def test_model_losses_tied_decoder_and_saved_encoder(tmp_path, tokenizer):
    write_people(tmp_path / "corpus", count=6)
    settings = PretrainingSettings(long_length=64, global_max_len=16, cpc_sentence_rate=0.3)
    inputs, _, _ = prepared(tmp_path, tokenizer, settings)
    torch.manual_seed(0)
    batch = PretrainingCollator(tokenizer, settings)([dict(r) for r in inputs])
    model = GlobalLocalForPretraining(tiny_config(tokenizer)).eval()
    output = model(**batch)
    assert torch.isclose(output.loss, output.mlm_loss + output.cpc_loss)
    assert output.cpc_sentences == len(batch["cpc_positions"]) >= 2
    assert output.mlm_tokens == int((batch["mlm_labels"] != -100).sum())
    # The decoder is the word embedding matrix itself: no second [vocab, hidden] parameter.
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes.count((len(tokenizer), 32)) == 1
    # Chance level at the start: the CPC loss is about log(number of candidates).
    assert abs(float(output.cpc_loss) - torch.log(output.cpc_sentences.float())) < 1.5

    out = write_new_folder(tmp_path / "pretrained", lambda folder: save_encoder(folder, model, tokenizer))
    assert (out / "model.safetensors").is_file() and (out / HEADS_FILE).is_file()
    encoder = GlobalLocalModel.from_pretrained(out).eval()
    inputs_only = {k: v for k, v in batch.items() if not k.startswith(("cpc_", "mlm_"))}
    assert torch.equal(encoder(**inputs_only).long_hidden_state, model.encoder(**inputs_only).long_hidden_state)
    again = GlobalLocalForPretraining.from_encoder(out).eval()
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))


def test_mlm_head_from_a_bert_checkpoint(tmp_path, tokenizer):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64))
    bert.save_pretrained(tmp_path / "bert")
    model = GlobalLocalForPretraining(tiny_config(tokenizer))
    model.load_bert_mlm_head(tmp_path / "bert")
    source = bert.cls.predictions
    assert torch.equal(model.mlm_transform.dense.weight, source.transform.dense.weight)
    assert torch.equal(model.mlm_transform.layer_norm.bias, source.transform.LayerNorm.bias)
    assert torch.equal(model.mlm_bias, source.bias)
    with pytest.raises(InputError, match="has shape"):
        GlobalLocalForPretraining(tiny_config(tokenizer, hidden_size=64)).load_bert_mlm_head(tmp_path / "bert")


def save_tiny_encoder(folder: Path, tokenizer) -> Path:
    torch.manual_seed(0)
    GlobalLocalModel(tiny_config(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def pretrain_command(corpus: Path, out: Path, init: Path, cache: Path, **extra) -> list[str]:
    values = {"train": corpus, "out": out, "init": init, "cache-dir": cache, "max-steps": 80, "batch-size": 8,
              "lr": 3e-3, "cpc-sentence-rate": 0.3, "eval-rows": 20, "eval-batch-size": 10, "save-steps": 20,
              "eval-steps": 40, "log-steps": 20, "seed": 0, **extra}
    return ["pretrain", *(part for key, value in values.items() for part in (f"--{key}", str(value)))]


@pytest.mark.slow  # 80 + 20 steps of a tiny encoder
def test_a_short_run_lowers_both_losses_resumes_exactly_and_gives_an_init(tmp_path, tokenizer, one_thread, capsys):
    from safetensors.torch import load_file

    from longdoc.cli import main
    from longdoc.commands.pretrain import PRETRAINING_FLAGS
    from longdoc.tasks.hotpotqa.model import HotpotQAModel
    from longdoc.train.options import PretrainingOptions, resolve_options
    from longdoc.train.pretraining import EVALUATION_FILE, build_pretraining_job

    corpus = write_people(tmp_path / "corpus")
    init = save_tiny_encoder(tmp_path / "init", tokenizer)
    out, cache = tmp_path / "out", tmp_path / "cache"
    command = pretrain_command(corpus, out, init, cache)

    # Before: the held-out losses of the job's starting model (same rows, same fixed masks as the run's).
    arguments = dict(zip(command[1::2], command[2::2]))
    given = {option.name: option.type(arguments[option.flag]) if option.flag in arguments else None
             for option in PRETRAINING_FLAGS}
    job = build_pretraining_job(*resolve_options(given, (PretrainingOptions,)))
    with torch.no_grad():
        before = job.evaluate(job.model.eval(), tmp_path)

    assert main(command) == 0
    after = json.loads((out / EVALUATION_FILE).read_text())
    with capsys.disabled():
        print(f"\nheld-out MLM loss {before['mlm_loss']:.3f} -> {after['mlm_loss']:.3f}, "
              f"CPC loss {before['cpc_loss']:.3f} -> {after['cpc_loss']:.3f}, CPC accuracy {before['cpc_accuracy']:.3f} -> "
              f"{after['cpc_accuracy']:.3f} (chance: {after['cpc_candidates']:.0f} candidates, loss "
              f"{math.log(after['cpc_candidates']):.3f})")
    assert after["mlm_loss"] < before["mlm_loss"] - 2.0
    assert after["cpc_loss"] < before["cpc_loss"] - 0.6 and after["cpc_accuracy"] > before["cpc_accuracy"] + 0.1
    assert after["cpc_loss"] < math.log(after["cpc_candidates"]) - 0.5  # well under chance
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log if "loss" in line] == [20, 40, 60, 80]
    # Every logging step holds what the loss is made of (every batch of 8 six-sentence inputs at rate
    # 0.3 has a CPC task, so the loss is the sum of the two parts' means), and the parts fall.
    steps = [line for line in log if "loss" in line]
    for line in steps:
        assert {"mlm_loss", "mlm_accuracy", "cpc_loss", "cpc_accuracy"} <= set(line), line
        assert line["loss"] == pytest.approx(line["mlm_loss"] + line["cpc_loss"], rel=1e-5)
        assert 0.0 <= line["mlm_accuracy"] <= 1.0 and 0.0 <= line["cpc_accuracy"] <= 1.0
    assert steps[-1]["mlm_loss"] < steps[0]["mlm_loss"] and steps[-1]["cpc_loss"] < steps[0]["cpc_loss"]
    assert [line["step"] for line in log if "eval" in line] == [40, 80]
    assert all({"mlm_loss", "cpc_loss", "train_mlm_loss", "train_cpc_loss"} <= set(line["eval"])
               for line in log if "eval" in line)
    assert "20 input(s), 120 sentences" in capsys.readouterr().err

    # Exact resume: from the step-60 checkpoint, the same final weights and heads (the masking draws
    # come from the RNG state the checkpoint restores).
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "checkpoints" / "step-000000060", resumed / "checkpoints" / "step-000000060")
    assert main(pretrain_command(corpus, resumed, init, cache)) == 0
    for name in ("model.safetensors", HEADS_FILE):
        first, second = load_file(out / name), load_file(resumed / name)
        assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)

    # The output is a bare encoder that --init takes: GlobalLocalModel and a task model's from_encoder.
    encoder = GlobalLocalModel.from_pretrained(out)
    assert encoder.config.residual_attention
    trained = load_file(out / "model.safetensors")
    task_model = HotpotQAModel.from_encoder(out)
    assert all(torch.equal(task_model.encoder.state_dict()[name], value) for name, value in trained.items())
    assert not torch.equal(trained["embeddings.word_embeddings.weight"],
                           load_file(init / "model.safetensors")["embeddings.word_embeddings.weight"])


def test_command_defaults_are_the_library_defaults():
    import dataclasses

    from longdoc.train.options import PretrainingOptions

    # The packed lengths come from the encoder's config; the masking and corpus ones are options.
    defaults = {field.name: field.default for field in dataclasses.fields(PretrainingOptions)}
    library = {field.name: field.default for field in dataclasses.fields(PretrainingSettings)}
    for name in ("mask_rate", "cpc_sentence_rate", "min_sentences", "max_sentence_tokens"):
        assert defaults[name] == library[name], name


def test_command_refuses_a_corpus_with_nothing_to_train_on(tmp_path, tokenizer, capsys):
    from longdoc.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.bin").write_bytes(b"\0" * 16)
    (corpus / "b.txt").write_text("One sentence only.", encoding="utf-8")
    init = save_tiny_encoder(tmp_path / "init", tokenizer)
    assert main(pretrain_command(corpus, tmp_path / "out", init, tmp_path / "cache")) == 2
    error = capsys.readouterr().err
    assert "no document to train on" in error and "1 file(s) not text (binary)" in error
    assert "1 document(s) with fewer than 2 sentence(s)" in error
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_batch_too_small_for_cpc_is_said_and_not_logged_as_a_zero_loss(tmp_path, tokenizer, one_thread):
    from longdoc.cli import _format_warning, main
    from longdoc.errors import OptionWarning
    from longdoc.train.pretraining import EVALUATION_FILE

    # Six-sentence inputs at rate 0.1: one CPC sentence each, so one row per pass has no negatives.
    corpus = write_people(tmp_path / "corpus", count=4)
    init = save_tiny_encoder(tmp_path / "init", tokenizer)
    command = pretrain_command(corpus, tmp_path / "out", init, tmp_path / "cache", **{
        "batch-size": 1, "cpc-sentence-rate": 0.1, "max-steps": 2, "eval-steps": 0, "log-steps": 1,
        "eval-rows": 4, "eval-batch-size": 4})
    with pytest.warns(OptionWarning, match=r"CPC is not trained: a forward pass of batch_size 1 holds at most 1 "
                      r"CPC sentence\(s\) \(inputs of up to 6 sentences at cpc_sentence_rate 0.1\)") as caught:
        assert main(command) == 0
    [warning] = [w for w in caught if isinstance(w.message, OptionWarning)]
    # as the command line prints it: the options as its flags
    assert "a forward pass of --batch-size 1 holds" in _format_warning(warning.message, OptionWarning, "", 0)
    metrics = json.loads((tmp_path / "out" / EVALUATION_FILE).read_text())
    assert "train_mlm_loss" in metrics and "train_cpc_loss" not in metrics  # not a CPC loss of 0.0
    log = [json.loads(line) for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    steps = [line for line in log if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:  # the loss is the MLM loss alone; no CPC loss is logged as a 0.0 either
        assert "cpc_loss" not in line and "cpc_accuracy" not in line
        assert line["loss"] == pytest.approx(line["mlm_loss"], rel=1e-6)
    assert metrics["cpc_candidates"] == 4  # the held-out batches of 4 rows still measure it


def test_quiet_hides_the_pretraining_bar(tmp_path, tokenizer, one_thread, capsys):
    from longdoc.cli import main

    corpus = write_people(tmp_path / "corpus", count=6)
    init = save_tiny_encoder(tmp_path / "init", tokenizer)
    short = {"max-steps": 2, "eval-steps": 2, "save-steps": 2, "log-steps": 1, "batch-size": 2, "eval-batch-size": 2}
    assert main(pretrain_command(corpus, tmp_path / "shown", init, tmp_path / "cache", **short)) == 0
    shown = capsys.readouterr().err
    assert main(["--quiet", *pretrain_command(corpus, tmp_path / "hidden", init, tmp_path / "cache", **short)]) == 0
    hidden = capsys.readouterr().err
    assert "train pretrain:" in shown and "100%|" in shown
    assert "train pretrain" not in hidden and "100%|" not in hidden and "after 2 steps" in hidden
