"""The README's main job (`longdoc demo`, longdoc.demo): the cut to the first N wordpieces, and the
whole orchestration end to end on a tiny budget."""

import json
from pathlib import Path

import pytest

from longdoc.cli import main
from longdoc.errors import InputError


def _layout_length(record, tokenizer) -> int:
    """Wordpieces of the long input the feature builder lays out: [CLS] question [SEP] paragraphs [SEP]."""
    texts = [record["question"]] + [piece for title, sentences in record["context"] for piece in (title, *sentences)]
    return 3 + sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def test_first_tokens_keeps_a_prefix_within_the_limit_and_never_both_facts(tokenizer):
    from longdoc.demo import first_tokens, generator_of
    from longdoc.tasks import get_task
    from longdoc.tasks.multihop.generator import make_examples

    records = make_examples(6, seed=3, length=400, min_distance=200, comparison_fraction=0.5, tokenizer=tokenizer,
                            progress=False)
    cut = first_tokens(records, 200, tokenizer, generator_of(get_task("multihop")))
    for record, short in zip(records, cut):
        assert _layout_length(record, tokenizer) <= 400
        length = _layout_length(short, tokenizer)
        # Whole sentences only: the limit holds and at most one more sentence would not have fitted.
        assert 150 < length <= 200
        assert {k: v for k, v in short.items() if k != "context"} == {k: v for k, v in record.items() if k != "context"}
        for (title, sentences), (short_title, short_sentences) in zip(record["context"], short["context"]):
            assert short_title == title and sentences[:len(short_sentences)] == short_sentences
        kept = {(title, i) for title, sentences in short["context"] for i in range(len(sentences))}
        facts = {tuple(fact) for fact in record["supporting_facts"]}
        assert len(facts & kept) <= 1, "the restricted model must never see both facts"


def test_restricted_length_must_leave_the_facts_apart():
    from longdoc.demo import DemoData

    with pytest.raises(InputError, match="min_distance 300 must be at least restricted_length 512"):
        DemoData(min_distance=300)
    with pytest.raises(InputError, match="restricted_length 512 must be below length 512"):
        DemoData(length=512)


@pytest.mark.slow
def test_demo_trains_once_and_prints_both_rows(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--train-examples", "4", "--dev-examples", "3", "--length", "512",
                 "--min-distance", "256", "--restricted-length", "256", "--max-steps", "1",
                 "--model-dir", str(tmp_path / "model")]) == 0
    printed = capsys.readouterr().out
    full = json.loads((out / "full" / "metrics.json").read_text())
    assert full["task"] == "multihop" and full["model"] == str(out / "full")
    assert full["config"]["long_max_len"] == 512 and full["config"]["max_steps"] == 1
    assert full["config"]["dev"] == str(out / "data" / "dev.json")
    # The restricted row: the same trained model, reading the dev file cut to 256 wordpieces.
    restricted = json.loads((out / "first-256" / "metrics.json").read_text())
    assert restricted["model"] == f"{out / 'full'} (first 256 wordpieces)"
    assert restricted["config"] == {"model": str(out / "full"), "dev": str(out / "data" / "dev-first256.json"),
                                    "restricted_length": 256}
    # ... scored on a gold derived from the whole dev file: ranked in its table, marked
    assert restricted["gold"]["derived_from"]["files"] == ["dev.json"] == full["gold"]["files"]
    assert restricted["gold"]["derived_from"]["how"] == "each example cut to its first 256 wordpieces"
    assert printed.count("#### ") == 1 and ", derived: each example cut to its first 256 wordpieces" in printed
    for run, record in (("full", full), ("first-256", restricted)):
        assert 0.0 <= record["metrics"]["f1"] <= 1.0
        predictions = json.loads((out / run / "dev_predictions.json").read_text())
        assert len(predictions["answer"]) == 3
        # The leaderboard row and the F1 line of this run, with the figure of its metrics.json.
        assert f"| {record['model']} " in printed
        assert f"held-out answer F1, {run}: {record['metrics']['f1']:.4f}" in printed
    assert printed.index("### multihop") < printed.index("held-out answer F1")
    # The whole-document model, without checkpoints, where `longdoc ask` was pointed; one question
    # of the first held-out example asked of its document, answered with a location or refused.
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "README.md", "config.json", "model.safetensors", "model.safetensors.sha256", "tokenizer.json",
        "tokenizer_config.json"]
    # Its card says what it learnt from, which `longdoc ask` tells on stderr.
    assert "trained on generated documents only" in (tmp_path / "model" / "README.md").read_text()
    question = json.loads((out / "data" / "dev.json").read_text())[0]["question"]
    document = out / "data" / "document.txt"
    ask_output = printed[printed.index("$ longdoc ask"):]
    assert question in ask_output.splitlines()[0] and str(document) in ask_output.splitlines()[0]
    answer_line = ask_output.splitlines()[1]
    assert answer_line == "no answer found" or f" at {document}:" in answer_line


def test_demo_writes_under_the_cache_folder_unless_told(tmp_path, monkeypatch, capsys):
    import longdoc.commands.demo as demo

    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    written = []

    def stop_at_once(tasks, out, *rest):  # where the demo would write; stopped before any training
        written.append(out)
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run_demo", stop_at_once)
    assert main(["demo"]) == 130
    assert written == [tmp_path / "cache" / "demo"]
    assert f"longdoc demo: writing the data and both runs to {tmp_path / 'cache' / 'demo'}" in capsys.readouterr().err
    assert main(["demo", "--out", "here"]) == 130 and written[-1] == Path("here")
    assert not (tmp_path / "longdoc-demo").exists()
