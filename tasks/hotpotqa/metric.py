"""HotpotQA's official metric, rule for rule: `hotpot_evaluate_v1.py` of hotpotqa/hotpot at commit
fa3a36370899e1d85822de61e58c85ea19993154 (2018-10-05, the file's last change).

- Answers: SQuAD normalisation (lowercase, drop ASCII punctuation, drop the words a/an/the,
  collapse whitespace), then exact match and bag-of-tokens precision, recall and F1. When either
  side normalises to "yes", "no" or "noanswer" and the two differ, all three are 0: no partial
  credit for a yes/no question (`longdoc.evaluate.answers`, which the built-in generator shares).
- Supporting facts: the predicted and gold facts as *sets* of (title, sentence index) tuples;
  precision, recall, F1, and EM = no false positive and no false negative.
- Joint: precision = answer precision x support precision, recall likewise, F1 from those two,
  EM = answer EM x support EM.
- Every figure is a macro average over the gold examples, in the gold file's order: an example
  whose answer (or supporting facts) is missing from the prediction adds 0 to the answer (support)
  sums and 0 to every joint sum. We warn with the counts; the official script prints each id.
  Such a file, or one with ids not in the gold, is refused unless `allow_missing` is given
  (longdoc.evaluate.ids: the one rule of every task).

Beside the official figures (never instead of them): ROUGE-L of the answer text (`rougeL_prec`,
`rougeL_recall`, `rougeL_f1`), averaged over the same gold examples, a missing answer scoring 0.

Arithmetic follows the official script expression for expression and sums in the same order, so
the figures equal its output to the last digit.
"""

import warnings
from dataclasses import dataclass
from typing import Any

from longdoc.data.records import read_json_list
from longdoc.errors import InputError
from longdoc.evaluate.answers import ZERO, MatchScores, answer_scores
from longdoc.evaluate.ids import check_prediction_ids
from longdoc.evaluate.rouge import RougeScore, rouge_l
from longdoc.io import read_json

OFFICIAL_KEYS = (
    "em", "f1", "prec", "recall",
    "sp_em", "sp_f1", "sp_prec", "sp_recall",
    "joint_em", "joint_f1", "joint_prec", "joint_recall",
)
ROUGE_KEYS = ("rougeL_prec", "rougeL_recall", "rougeL_f1")


def _hashable(value: Any) -> Any:
    # JSON lists and objects become tuples so that any value can sit in a set; only a tuple of a
    # string and a number can ever equal a gold fact.
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _hashable(item)) for key, item in value.items())
    return value


def _as_fact(item: Any) -> tuple:
    """One predicted fact as the official script sees it: `tuple(item)`.

    Follows its quirks: a sentence index given as "0" stays a string and so never matches the gold
    0; 0.0 and true equal 0 and 1 in Python, so they do match; a string item becomes a tuple of
    its characters. Items the official script cannot turn into a tuple (a number, null) crash it;
    here they count as one wrong fact each, told apart by their value.
    """
    if isinstance(item, (list, str, dict)):
        return tuple(_hashable(element) for element in item)
    return ("<not a fact>", repr(item))


def supporting_fact_scores(predicted: Any, gold: list) -> MatchScores:
    """Support EM, precision, recall and F1 of one example (official `update_sp`), as sets."""
    # The official script iterates whatever it is given: a string's characters, an object's keys.
    items = predicted if isinstance(predicted, (list, str, dict)) else [predicted]
    predicted_facts = {_as_fact(item) for item in items}
    gold_facts = {_as_fact(fact) for fact in gold}
    tp = len(predicted_facts & gold_facts)
    fp = len(predicted_facts) - tp
    fn = len(gold_facts) - tp
    prec = 1.0 * tp / (tp + fp) if tp + fp > 0 else 0.0
    recall = 1.0 * tp / (tp + fn) if tp + fn > 0 else 0.0
    f1 = 2 * prec * recall / (prec + recall) if prec + recall > 0 else 0.0
    em = 1.0 if fp + fn == 0 else 0.0
    return MatchScores(em=em, prec=prec, recall=recall, f1=f1)


def joint_scores(answer: MatchScores, support: MatchScores) -> MatchScores:
    """Joint figures of one example: products of the answer and support figures."""
    prec = answer.prec * support.prec
    recall = answer.recall * support.recall
    f1 = 2 * prec * recall / (prec + recall) if prec + recall > 0 else 0.0
    return MatchScores(em=answer.em * support.em, prec=prec, recall=recall, f1=f1)


@dataclass(frozen=True)
class ExampleScores:
    """One gold example's figures against a prediction: `answer` None when the prediction has no
    answer for it, `support` None when it has no supporting facts for it (both score 0, and so
    does every joint figure); `unreadable_answer` when its answer is not text (scored as wrong)."""

    answer: MatchScores | None
    support: MatchScores | None
    rouge: RougeScore | None
    unreadable_answer: bool = False

    def figures(self) -> dict[str, float]:
        """Every key of `evaluate`'s output for this example alone (its mean over the gold is `evaluate`)."""
        figures = dict.fromkeys(OFFICIAL_KEYS + ROUGE_KEYS, 0.0)
        joint = None if self.answer is None or self.support is None else joint_scores(self.answer, self.support)
        for prefix, scores in (("", self.answer), ("sp_", self.support), ("joint_", joint)):
            if scores is not None:
                figures.update({f"{prefix}em": scores.em, f"{prefix}f1": scores.f1, f"{prefix}prec": scores.prec,
                                f"{prefix}recall": scores.recall})
        if self.rouge is not None:
            figures.update(rougeL_prec=self.rouge.precision, rougeL_recall=self.rouge.recall, rougeL_f1=self.rouge.f1)
        return figures


def example_scores(example: dict, answers: dict, facts: dict) -> ExampleScores:
    """The figures of one parsed gold example against a prediction's "answer" and "sp" objects."""
    example_id = example["_id"]
    answer = rouge = None
    unreadable = example_id in answers and not isinstance(answers[example_id], str)
    if unreadable:
        # The official script crashes on a non-text answer; we score it as a wrong answer.
        answer = ZERO
    elif example_id in answers:
        answer = answer_scores(answers[example_id], example["answer"])
        rouge = rouge_l(answers[example_id], example["answer"])
    support = supporting_fact_scores(facts[example_id], example["supporting_facts"]) if example_id in facts else None
    return ExampleScores(answer, support, rouge, unreadable)


def evaluate(gold_examples: list[dict], prediction: dict) -> dict[str, float]:
    """Official HotpotQA figures (plus ROUGE-L) of a parsed prediction against parsed gold."""
    answers, facts = prediction["answer"], prediction["sp"]
    sums = dict.fromkeys(OFFICIAL_KEYS + ROUGE_KEYS, 0.0)
    missing_answers = missing_facts = unreadable_answers = 0
    for example in gold_examples:
        scores = example_scores(example, answers, facts)
        missing_answers += scores.answer is None
        missing_facts += scores.support is None
        unreadable_answers += scores.unreadable_answer
        # Summed in gold order, as the official script sums (a missing figure adds 0.0: no change).
        for key, value in scores.figures().items():
            sums[key] += value

    gold_ids = {example["_id"] for example in gold_examples}
    extra = len((set(answers) | set(facts)) - gold_ids)
    total = len(gold_examples)
    if missing_answers:
        warnings.warn(f"{missing_answers} of {total} gold examples have no predicted answer; scored 0")
    if missing_facts:
        warnings.warn(f"{missing_facts} of {total} gold examples have no predicted supporting facts; scored 0")
    if unreadable_answers:
        warnings.warn(f"{unreadable_answers} predicted answers are not text; scored as wrong answers")
    if extra:
        warnings.warn(f"{extra} predicted ids are not in the gold file; ignored, as the official script does")
    return {key: value / total for key, value in sums.items()}


def read_gold(path) -> list[dict]:
    return read_json_list(path, "HotpotQA gold", "_id", {"answer": str, "supporting_facts": list})


def read_prediction(path) -> dict:
    prediction = read_json(path)
    if not isinstance(prediction, dict):
        raise InputError(f"{path}: a HotpotQA prediction is one JSON object "
                         '{"answer": {id: text}, "sp": {id: [[title, sentence index], ...]}}')
    for field in ("answer", "sp"):
        if field not in prediction:
            raise InputError(f"{path}: the prediction has no {field!r} field "
                             '(expected {"answer": {id: text}, "sp": {id: [[title, sentence index], ...]}})')
        if not isinstance(prediction[field], dict):
            raise InputError(f"{path}: the prediction's {field!r} field must be a JSON object keyed by example id")
    return prediction


def evaluate_files(gold_path, pred_path, *, allow_missing: bool = False) -> dict[str, float]:
    """Score an official prediction file against the official dev (gold) file; one that leaves gold
    examples out or names others is refused unless `allow_missing` (then scored as the official
    script scores it)."""
    gold, prediction = read_gold(gold_path), read_prediction(pred_path)
    gold_ids = {example["_id"] for example in gold}
    answers, facts = prediction["answer"], prediction["sp"]
    check_prediction_ids(pred_path, gold_path, (set(answers) | set(facts)) - gold_ids,
                         {"predicted answer": gold_ids - set(answers),
                          "predicted supporting facts": gold_ids - set(facts)}, allow_missing=allow_missing)
    return evaluate(gold, prediction)
