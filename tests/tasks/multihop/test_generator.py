"""The built-in multi-hop generator: its files read back with the HotpotQA reader, lengths and fact
distances hold in the wordpieces the feature builder really makes, the answer needs the bridge, the
same seed writes the same file, and gold scored against itself is perfect."""

import json
import re
from collections import Counter

import pytest

from longdoc.cli import main
from longdoc.data.examples import TextSpan
from longdoc.data.features import FeatureSettings, build_features
from longdoc.data.spans import char_span_to_token_span
from longdoc.errors import InputError
from longdoc.tasks import get_task
from longdoc.tasks.hotpotqa.reader import read_examples
from longdoc.tasks.multihop.generator import (BASED_IN, guessing_f1, make_examples, shortest_length,
                                           wordpiece_counter)

LENGTH, MIN_DISTANCE = 512, 300


@pytest.fixture(scope="module")
def data_file(tmp_path_factory, tokenizer):
    records = make_examples(12, seed=5, length=LENGTH, min_distance=MIN_DISTANCE, comparison_fraction=0.5,
                            tokenizer=tokenizer, progress=False)
    path = tmp_path_factory.mktemp("multihop") / "dev.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def _fact_token_spans(example, features):
    spans = []
    for title, index in example.labels["supporting_facts"]:
        document = next(d for d, doc in enumerate(example.documents) if doc.text.startswith(title + "\n"))
        text = example.documents[document].text
        sentence = example.documents[document].paragraphs[0].sentences[index]
        # HotpotQA sentences keep their leading space; tokens start after it.
        start = sentence.start + len(text[sentence.start:sentence.end]) - len(text[sentence.start:sentence.end].lstrip())
        spans.append(char_span_to_token_span(features.long_offsets, features.long_source_ids,
                                             TextSpan(document, start, sentence.end)))
    return spans


def test_reads_back_with_one_window_and_far_apart_facts(data_file, tokenizer):
    settings = FeatureSettings(long_max_len=LENGTH, global_max_len=512, max_question_len=64)
    examples = list(read_examples(data_file))
    assert len(examples) == 12 and {e.labels["type"] for e in examples} == {"bridge", "comparison"}
    for example in examples:
        windows = build_features(example, tokenizer, settings)
        # The whole example fits the length it was made for: one window, no token cut.
        assert len(windows) == 1, example.id
        features = windows[0]
        assert len(features.long_input_ids) <= LENGTH
        first, second = sorted(_fact_token_spans(example, features), key=lambda span: span.first)
        # Wordpieces strictly between the two facts, counted by the real feature builder.
        assert second.first - first.last - 1 >= MIN_DISTANCE, example.id
        if example.labels["type"] == "bridge":
            # The reader finds the answer, in a supporting sentence first.
            assert example.answers and example.text_of(example.answers[0]) == example.labels["answer"]
        else:
            assert example.labels["answer"] in ("yes", "no")


def _cities_named_based_in(sentences):
    """How many "X is based in C." sentences name each city C."""
    return Counter(re.fullmatch(r".+ is based in (\w+)\.", s).group(1) for s in sentences if " is based in " in s)


def test_only_the_bridge_answers_the_question(data_file):
    records = json.loads(data_file.read_text(encoding="utf-8"))
    bridges = [r for r in records if r["type"] == "bridge"]
    assert bridges
    for record in bridges:
        person = re.search(r"employer of (.+) based\?|company that (.+) works for", record["question"])
        person = person.group(1) or person.group(2)
        sentences = [s.strip() for _, paragraph in record["context"] for s in paragraph]
        employers = [s for s in sentences if s.startswith(f"{person} works for ")]
        assert len(employers) == 1
        company = employers[0][len(f"{person} works for "):-1]
        bases = [s for s in sentences if s.startswith(f"{company} is based in ")]
        assert bases == [BASED_IN.format(company=company, city=record["answer"])]
        facts = {(title, index) for title, index in record["supporting_facts"]}
        context = dict((title, [s.strip() for s in paragraph]) for title, paragraph in record["context"])
        assert {context[t][i] for t, i in facts} == {employers[0], bases[0]}
        # Distractors use the same relation and level the cities: counting "based in" sentences
        # per city finds nothing (every city named in one is named as often as the others, give
        # or take one), and the person is named beside another city.
        named = _cities_named_based_in(sentences)
        assert len(named) > 1 and max(named.values()) - min(named.values()) <= 1, named
        assert any(s.startswith(f"{person} visited ") and record["answer"] not in s for s in sentences)


def test_counting_cities_is_chance():
    # The shortcut the levelling defeats: answer a bridge question with the city named in the most
    # "based in" sentences (ties split). Before the levelling it was right 38% of the time at 2048
    # wordpieces (13 cities); now it is what guessing among the named cities gives.
    records = make_examples(40, seed=2, length=1024, min_distance=400, comparison_fraction=0.0, progress=False)
    hits, guesses = 0.0, 0.0
    for record in records:
        sentences = [s.strip() for _, paragraph in record["context"] for s in paragraph]
        named = _cities_named_based_in(sentences)
        top = [city for city, count in named.items() if count == max(named.values())]
        hits += (record["answer"] in top) / len(top)
        guesses += 1 / len(named)
    assert hits / len(records) <= guesses / len(records) + 0.1, (hits, guesses)


def test_without_relation_distractors_the_facts_are_the_only_relations_in_chain_order(tokenizer):
    # The demo's setting: no relation distractors and no decoys, the answer sentence always second.
    records = make_examples(6, seed=3, length=LENGTH, min_distance=MIN_DISTANCE, comparison_fraction=0.0,
                            relation_share=0.0, chain_order=True, tokenizer=tokenizer, progress=False)
    for record in records:
        sentences = [s.strip() for _, paragraph in record["context"] for s in paragraph]
        relations = [s for s in sentences if " works for " in s or " is based in " in s]
        context = dict((title, [s.strip() for s in paragraph]) for title, paragraph in record["context"])
        facts = [context[title][index] for title, index in record["supporting_facts"]]
        assert relations == facts  # only the two facts, "works for" first
        assert " works for " in relations[0] and relations[1].endswith(f" is based in {record['answer']}.")
    # The default keeps relation distractors (and so does the same seed without the options).
    default = make_examples(1, seed=3, length=LENGTH, min_distance=MIN_DISTANCE, comparison_fraction=0.0,
                            tokenizer=tokenizer, progress=False)[0]
    assert sum(" is based in " in s for _, paragraph in default["context"] for s in paragraph) > 2


def test_same_seed_same_file_and_examples_independent_of_n(tokenizer):
    options = dict(seed=9, length=300, min_distance=100, tokenizer=tokenizer, progress=False)
    three = make_examples(3, **options)
    assert three == make_examples(3, **options)
    assert make_examples(1, **options) == three[:1]
    assert make_examples(1, **{**options, "seed": 10})[0]["context"] != three[0]["context"]
    assert len({r["_id"] for r in three}) == 3


@pytest.mark.slow  # the HotpotQA metric imports rouge_score, which imports nltk (~3 s)
def test_gold_against_gold_is_perfect(data_file, tmp_path, capsys):
    records = json.loads(data_file.read_text(encoding="utf-8"))
    prediction = {"answer": {r["_id"]: r["answer"] for r in records},
                  "sp": {r["_id"]: r["supporting_facts"] for r in records}}
    pred = tmp_path / "pred.json"
    pred.write_text(json.dumps(prediction), encoding="utf-8")
    assert main(["evaluate", "multihop", "--gold", str(data_file), "--pred", str(pred), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    for key in ("em", "f1", "sp_em", "sp_f1", "joint_em", "joint_f1"):
        assert metrics[key] == 1.0


def test_task_record_names_the_hotpotqa_parts():
    task = get_task("multihop")
    assert task.reader == "longdoc.tasks.hotpotqa.reader" and task.metric == "longdoc.tasks.hotpotqa.metric"
    assert task.load("reader").read_examples is read_examples
    assert (task.configs / "cpu.json").is_file()


def test_make_data_command_writes_the_file(tmp_path, capsys):
    out = tmp_path / "made.json"
    assert main(["make-data", "multihop", "--n", "2", "--length", "256", "--seed", "1", "--out", str(out),
                 "--min-distance", "64"]) == 0
    assert [r["_id"] for r in json.loads(out.read_text(encoding="utf-8"))] == ["multihop-1-000000",
                                                                               "multihop-1-000001"]


def test_impossible_distance_is_refused(tmp_path, capsys, tokenizer):
    with pytest.raises(InputError, match="min_distance"):
        make_examples(1, seed=0, length=128, min_distance=200, tokenizer=tokenizer, progress=False)
    out = tmp_path / "never.json"
    assert main(["make-data", "multihop", "--n", "1", "--length", "128", "--seed", "0", "--out", str(out),
                 "--min-distance", "500"]) == 2
    assert "--min-distance" in capsys.readouterr().err and not out.exists()


def test_too_short_length_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "never.json"
    assert main(["make-data", "multihop", "--n", "3", "--length", "40", "--seed", "0", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    # One line: no progress bar was started before the check.
    assert error.count("\n") == 1 and "examples" not in error.split("error:")[0], error
    assert re.match(r"longdoc make-data: error: --length 40 is too short for --min-distance left at half of --length: "
                    r"the minimum is \d+, because \[CLS\]/\[SEP\] and the question", error), error
    assert not out.exists()


@pytest.mark.parametrize("min_distance, relation_share", [(None, 0.35), (0, 0.35), (100, 0.0)])
def test_every_draw_fits_at_the_shortest_length_and_one_less_is_refused(tokenizer, min_distance, relation_share):
    count_tokens = wordpiece_counter(tokenizer)
    shortest, _ = shortest_length(count_tokens, 300, min_distance, relation_share)
    options = dict(min_distance=min_distance, relation_share=relation_share, tokenizer=tokenizer, progress=False)
    # Drawn examples at the minimum: the longest names and the filling's leftovers are bounded, not guessed
    # (make_example asserts that two fact slots min_distance apart exist).
    records = make_examples(100, seed=11, length=shortest, **options)
    assert all(len(record["supporting_facts"]) == 2 for record in records)
    with pytest.raises(InputError, match=f"^length {shortest - 1} is too short .* the minimum is {shortest},"):
        make_examples(1, seed=11, length=shortest - 1, **options)


def test_guessing_f1_by_hand():
    # A bridge question whose document names its answer city in 2 of 3 "based in" sentences, and a
    # comparison: guessing gets 2/3 and 1/2, F1 (2/3 + 1/2) / 2 = 7/12.
    bridge = {"question": "Where is the employer of Al Ash based?", "answer": "Calton", "type": "bridge",
              "context": [["Section 1", ["Al Ash works for Zen Labs.", " Zen Labs is based in Calton."]],
                          ["Section 2", ["Ar Group is based in Calton.", " Al Ash visited Dorford in 1990.",
                                         " Bex Media is based in Dorford."]]]}
    comparison = {"question": "Are Zen Labs and Ar Group based in the same city?", "answer": "yes",
                  "type": "comparison", "context": bridge["context"]}
    assert guessing_f1([bridge, comparison]) == pytest.approx(7 / 12)
    assert guessing_f1([bridge]) == pytest.approx(2 / 3)
