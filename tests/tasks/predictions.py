"""Prediction files made from the real gold samples (../shared/data), in each task's official format:
the gold itself ("perfect") or the gold changed at random ("perturbed": wrong answers, dropped and
added supporting facts, other candidates, moved spans, missing and mistyped predictions), so that
every figure takes several values."""

import json
import random
from pathlib import Path

HOTPOTQA_GOLD = "hotpotqa/hotpot_dev_distractor_v1.first53.json"
WIKIHOP_GOLD = "wikihop/wikihop_dev.first28.json"
NQ_GOLD = "natural_questions/simplified-nq-train.sample2.jsonl"
OPENKP_GOLD = "openkp/openkp_readme_example.jsonl"
# The NQ sample is training data: one annotation per example (the dev set's 2-of-5 vote never holds).
NQ_OPTIONS = {"long_non_null_threshold": 1, "short_non_null_threshold": 1}


def hotpotqa(gold: Path, out: Path, perturbed: bool, seed: int = 0) -> Path:
    examples = json.loads(gold.read_text(encoding="utf-8"))
    rng = random.Random(seed)
    answers, facts = {}, {}
    for number, example in enumerate(examples):
        answer, support = example["answer"], [list(fact) for fact in example["supporting_facts"]]
        if perturbed:
            draw = rng.random()
            if draw < 0.2:
                answer = "no" if answer == "yes" else "yes"
            elif draw < 0.4:
                answer = answer.split(" ")[0]
            support = [fact for fact in support if rng.random() < 0.7]
            title, sentences = example["context"][rng.randrange(len(example["context"]))]
            support.append([title, rng.randrange(len(sentences))])
            if number == 3:
                support.append(["No such paragraph", 0])
        if perturbed and number == 5:
            continue  # no prediction at all for this one
        answers[example["_id"]] = 42 if perturbed and number == 7 else answer
        facts[example["_id"]] = support
    out.write_text(json.dumps({"answer": answers, "sp": facts}), encoding="utf-8")
    return out


def wikihop(gold: Path, out: Path, perturbed: bool, seed: int = 0) -> Path:
    rng = random.Random(seed)
    predictions = {}
    for number, example in enumerate(json.loads(gold.read_text(encoding="utf-8"))):
        if perturbed and number == 2:
            continue
        others = [c for c in example["candidates"] if c != example["answer"]]
        wrong = perturbed and others and rng.random() < 0.4
        predictions[example["id"]] = rng.choice(others) if wrong else example["answer"]
    out.write_text(json.dumps(predictions), encoding="utf-8")
    return out


def nq(gold: Path, out: Path, perturbed: bool, seed: int = 0) -> Path:
    rng = random.Random(seed)
    predictions = []
    for line in gold.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        annotation = record["annotations"][0]
        long_span = {key: annotation["long_answer"][key] for key in ("start_token", "end_token")}
        shorts = [{key: s[key] for key in ("start_token", "end_token")} for s in annotation["short_answers"]]
        if perturbed:
            candidate = rng.choice(record["long_answer_candidates"])
            long_span = {"start_token": candidate["start_token"], "end_token": candidate["end_token"]}
            shorts = [{"start_token": long_span["start_token"] + 1, "end_token": long_span["start_token"] + 3}]
        if long_span["start_token"] < 0:
            long_span = {"start_token": -1, "end_token": -1}
        predictions.append({"example_id": record["example_id"], "long_answer": long_span,
                            "long_answer_score": rng.uniform(0, 10), "short_answers": shorts,
                            "short_answers_score": rng.uniform(0, 10), "yes_no_answer": "NONE"})
    out.write_text(json.dumps({"predictions": predictions}), encoding="utf-8")
    return out


def openkp(gold: Path, out: Path, perturbed: bool, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = []
    for line in gold.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        phrases = [phrase for phrase in record["KeyPhrases"] if phrase]
        if perturbed:
            words = record["text"].split(" ")
            start = rng.randrange(len(words) - 2)
            # The gold phrases after the third: right at 5 only.
            phrases = [words[start:start + 2], ["Java"], ["Project"], phrases[-1], phrases[0]]
        lines.append(json.dumps({"url": record["url"], "KeyPhrases": phrases}))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


# task -> (gold file under shared/data, prediction maker, metric options)
MAKERS = {
    "hotpotqa": (HOTPOTQA_GOLD, hotpotqa, {}),
    "wikihop": (WIKIHOP_GOLD, wikihop, {}),
    "nq": (NQ_GOLD, nq, NQ_OPTIONS),
    "openkp": (OPENKP_GOLD, openkp, {}),
}


def prediction_files(task: str, shared_data: Path, folder: Path) -> tuple[Path, list[Path], dict]:
    """(gold, [perturbed prediction, perfect prediction], metric options) for one task."""
    gold_name, make, options = MAKERS[task]
    gold = shared_data / gold_name
    suffix = ".jsonl" if task == "openkp" else ".json"
    return gold, [make(gold, folder / f"{task}-perturbed{suffix}", True),
                  make(gold, folder / f"{task}-perfect{suffix}", False)], options


def model_predictions(task: str, shared_data: Path, tokenizer, folder: Path, first: int | None = None,
                      **task_options) -> tuple[Path, Path]:
    """(gold, the prediction file `longdoc predict` writes for it with a tiny random model of the
    task, seed 0: real decoding, meaningless scores; its scores side file lies beside it). `first`:
    the gold is the sample's first examples only (a task whose file is one JSON list); `task_options`:
    the model's (`from_encoder`'s)."""
    import torch

    from longdoc.cli import main
    from longdoc.tasks import get_task
    from tests.tasks.conftest import TINY_ENCODER, write_encoder

    gold = shared_data / MAKERS[task][0]
    if first is not None:
        examples = json.loads(gold.read_text(encoding="utf-8"))[:first]
        gold = folder / f"{gold.stem}.first{first}.json"
        gold.write_text(json.dumps(examples), encoding="utf-8")
    encoder = write_encoder(folder / "encoder", tokenizer, **TINY_ENCODER, long_max_len=256, global_max_len=96)
    torch.manual_seed(0)
    model = folder / "model"
    get_task(task).load("model").from_encoder(encoder, **task_options).save_pretrained(model)
    tokenizer.save_pretrained(model)
    pred = folder / f"{task}-model{'.jsonl' if task == 'openkp' else '.json'}"
    assert main(["--quiet", "predict", task, "--model", str(model), "--data", str(gold), "--out", str(pred)]) == 0
    return gold, pred
