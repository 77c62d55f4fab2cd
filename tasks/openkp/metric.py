"""OpenKP's official metric, rule for rule: `evaluate.py` of microsoft/OpenKP at commit
d0a02d58fd13c7f45d77ed3561d5826ec715e221 (2019-11-04, the file's last change: P, R and F1 at 1, 3, 5).

- A keyphrase is a list of tokens. It is normalised by lowercasing each token, joining them with
  single spaces and stripping trailing whitespace (no punctuation or article removal: the
  official script defines those helpers but never calls them).
- Empty phrases are dropped before anything else. Official quirk kept: a phrase counts as empty
  when it has no token or when its *first* token is "", so ["", "web"] is dropped while
  ["web", ""] is kept (as "web").
- Candidates and references are de-duplicated, keeping the first occurrence (after normalising,
  so ["Web"] and ["web"] are one phrase).
- Per document, for k in 1, 3, 5: tp = how many of the first k candidates are references;
  P@k = tp / k (k, not the number of candidates: predicting fewer than k phrases costs
  precision), R@k = tp / number of distinct references, F1@k from those two (0 when both are 0).
  Each figure is then averaged over the documents.
- The candidate and reference files must hold exactly the same urls; otherwise the official
  script refuses to score, and so do we, naming a few of the urls (longdoc.evaluate.ids).

Input is checked where the official script is silent: keyphrases given as strings instead of
token lists (the format its README shows) are scored there character by character, so
"Web Application" becomes "w e b   a p p l i c a t i o n" and never matches; we stop and say so.
"""

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longdoc.errors import InputError
from longdoc.evaluate.ids import require_gold_ids
from longdoc.io import iter_jsonl

CUTOFFS = (1, 3, 5)


@dataclass(frozen=True)
class ScoresAtK:
    precision: float
    recall: float
    f1: float


@dataclass(frozen=True)
class KeyphraseRecord:
    line: int
    phrases: list[list[str]]
    text: str | None = None  # the page's text where the file holds it (OpenKPDev.jsonl does; the metric ignores it)


def normalize_keyphrase(tokens: list[str]) -> str:
    """Official normalisation: lowercase tokens joined by single spaces, trailing space stripped."""
    return " ".join(token.lower() for token in tokens).rstrip()


def prepare_keyphrases(phrases: list[list[str]]) -> list[str]:
    """Drop empty phrases (official test: no token, or an empty first token), normalise, de-duplicate."""
    normalized = [normalize_keyphrase(tokens) for tokens in phrases if len(tokens) > 0 and len(tokens[0]) > 0]
    return list(dict.fromkeys(normalized))


def document_scores(candidates: list[str], references: list[str]) -> dict[int, ScoresAtK]:
    """P@k, R@k and F1@k of one document's prepared candidates against its prepared references."""
    reference_set = set(references)
    scores = {}
    for k in CUTOFFS:
        true_positives = sum(1 for phrase in candidates[:k] if phrase in reference_set)
        precision = true_positives / float(k)
        recall = true_positives / float(len(reference_set))
        f1 = (2 * (precision * recall)) / (precision + recall) if precision + recall > 0 else 0.0
        scores[k] = ScoresAtK(precision=precision, recall=recall, f1=f1)
    return scores


def evaluate(gold: dict[str, KeyphraseRecord], predictions: dict[str, KeyphraseRecord]) -> dict[str, float]:
    """Official OpenKP figures of parsed candidates against parsed references, both keyed by url
    (the same urls: `evaluate_files` checks them)."""
    per_cutoff = {k: {"F1": [], "P": [], "R": []} for k in CUTOFFS}
    # Gold file order. The official script walks a set of urls, whose order changes from run to
    # run with Python's string hashing, so only its last digit or so can differ from ours.
    for url, reference in gold.items():
        references = prepare_keyphrases(reference.phrases)
        if not references:
            # The official script divides by zero here.
            raise InputError(f"openkp: gold line {reference.line} ({url}) has no non-empty keyphrase; "
                             "recall is undefined")
        scores = document_scores(prepare_keyphrases(predictions[url].phrases), references)
        for k, at_k in scores.items():
            per_cutoff[k]["F1"].append(at_k.f1)
            per_cutoff[k]["P"].append(at_k.precision)
            per_cutoff[k]["R"].append(at_k.recall)
    # numpy's mean, as the official script uses (pairwise summation: equal to the last digit).
    return {f"{name}@{k}": float(np.mean(values)) for k in CUTOFFS for name, values in per_cutoff[k].items()}


def read_keyphrase_file(path) -> dict[str, KeyphraseRecord]:
    """Read a JSONL file of {"url", "KeyPhrases": [[token, ...], ...]} lines, keyed by url.

    A url given twice keeps its last line, as the official loader does (with a warning here).
    """
    records: dict[str, KeyphraseRecord] = {}
    repeated = 0
    for line, item in iter_jsonl(path):
        where = f"{path}:{line}"
        if not isinstance(item, dict):
            raise InputError(f"{where}: expected a JSON object with 'url' and 'KeyPhrases'")
        if not isinstance(item.get("url"), str):
            raise InputError(f"{where}: missing or non-text 'url' field")
        if "KeyPhrases" not in item:
            raise InputError(f"{where}: missing 'KeyPhrases' field ({item['url']})")
        phrases = item["KeyPhrases"]
        if not isinstance(phrases, list):
            raise InputError(f"{where}: 'KeyPhrases' must be a list of token lists, such as "
                             '[["Doctor", "Appointment"], ["Web", "Application"]]')
        for index, phrase in enumerate(phrases):
            if isinstance(phrase, str):
                raise InputError(
                    f"{where}: keyphrase {index} is a string ({phrase!r}), not a token list; write "
                    f"{phrase.split(' ')!r}. The official script would silently score a string "
                    "character by character and never match it"
                )
            if not isinstance(phrase, list) or not all(isinstance(token, str) for token in phrase):
                raise InputError(f"{where}: keyphrase {index} must be a list of text tokens, got {phrase!r}")
        repeated += item["url"] in records
        text = item.get("text")
        records[item["url"]] = KeyphraseRecord(line=line, phrases=phrases, text=text if isinstance(text, str) else None)
    if repeated:
        warnings.warn(f"{Path(path).name} gives {repeated} urls more than once; the last line of each "
                      "counts, as in the official script")
    return records


def evaluate_files(gold_path, pred_path, *, allow_missing: bool = False) -> dict[str, float]:
    """Score a candidate JSONL file against a reference JSONL file. Files with other urls are
    refused, as the official script refuses them, even with `allow_missing` (accepted so that every
    task's metric takes it: longdoc.evaluate.ids)."""
    gold = read_keyphrase_file(gold_path)
    if not gold:
        raise InputError(f"{gold_path}: the gold file holds no documents")
    predictions = read_keyphrase_file(pred_path)
    require_gold_ids(pred_path, gold_path, set(predictions) - set(gold), set(gold) - set(predictions),
                     official="the official script")
    return evaluate(gold, predictions)
