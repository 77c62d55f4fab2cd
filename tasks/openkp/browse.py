"""OpenKP examples and predictions as `longdoc serve --task openkp` shows them (longdoc.serve.views).

Per page: the gold keyphrases and each prediction file's, ranked as the file lists them (its order
is the ranking the metric cuts at 1, 3 and 5) with the model's score of each when the file's scores
side file lies beside it (PRED.scores.jsonl: `longdoc predict` writes it, longdoc.tasks.openkp.decode
says what the scores are; a file without one is said to have no scores) and the model's rank of each
phrase among all it scored there (where it put a gold phrase it did not write), the page's
text with every occurrence of each phrase marked (its tokens, compared lowercased, as the metric
normalises them) when the gold file holds the text (OpenKPDev.jsonl does; the metric's reference
files hold only url and KeyPhrases), and the page's P, R and F1 at 1, 3 and 5 from
`metric.document_scores` (their mean over the pages is what `longdoc evaluate` prints).
"""

from dataclasses import dataclass
from typing import Mapping, Sequence

from longdoc.data.prediction_scores import PredictionScores, is_number
from longdoc.data.text import token_char_spans
from longdoc.serve.views import (
    BrowseParts, Column, ExampleBrowser, ExampleRow, ExampleView, Mark, PredictionFile, RunResult, TextBlock,
    open_examples, table_of,
)
from longdoc.tasks.openkp.metric import (
    CUTOFFS, document_scores, normalize_keyphrase, prepare_keyphrases, read_keyphrase_file,
)

METRIC_KEYS = tuple(f"{name}@{k}" for k in CUTOFFS for name in ("F1", "P", "R"))


def _occurrences(text: str, phrase: str) -> list[tuple[int, int]]:
    """Characters of every occurrence of a normalised phrase among the text's tokens (split on " ")."""
    spans = token_char_spans(text)
    lowered = [text[start:end].lower() for start, end in spans]
    wanted = phrase.split(" ")
    n = len(wanted)
    return [(spans[i][0], spans[i + n - 1][1]) for i in range(len(spans) - n + 1) if lowered[i:i + n] == wanted]


def check_scores(record: Mapping) -> str | None:
    """What is wrong with one record of an OpenKP scores side file (None: nothing)."""
    phrases = record.get("keyphrases")
    if not isinstance(phrases, list) or not all(
            isinstance(p, dict) and isinstance(p.get("phrase"), list) and all(isinstance(t, str) for t in p["phrase"])
            and is_number(p.get("score")) for p in phrases):
        return "'keyphrases' must be a list of {\"phrase\": [token, ...], \"score\": a number}"
    return None


def _phrase_scores(scores: PredictionScores, url: str) -> dict[str, float] | None:
    """{normalised phrase: score} of one page in one file's scores, best first (the side file's order:
    its first phrases are the prediction file's, then the ones the model ranked next); None when it
    has none for it."""
    record = scores.records.get(url)
    if record is None:
        return None
    found: dict[str, float] = {}
    for phrase in record["keyphrases"]:
        found.setdefault(normalize_keyphrase(phrase["phrase"]), float(phrase["score"]))
    return found


def _ranked_line(phrases: list[str], found: dict[str, float] | None) -> str:
    return "; ".join(f"{rank}. {phrase}" + ("" if found is None or phrase not in found else f" ({found[phrase]:.4g})")
                     for rank, phrase in enumerate(phrases, start=1))


def _scores_field(scores: PredictionScores, url: str) -> tuple[str, str]:
    return "scores", scores.none_for(url) or f"from {scores.path.name}: the best n-gram logit of each phrase"


@dataclass(frozen=True)
class Page:
    """One gold page: its url, its prepared gold keyphrases, and its text when the gold file holds it."""

    url: str
    phrases: list[str]
    text: str | None


def _read_ranked(path) -> dict[str, list[str]]:
    """A candidate file's keyphrases by url, prepared as the metric ranks them."""
    return {url: prepare_keyphrases(record.phrases) for url, record in read_keyphrase_file(path).items()}


def _row(page: Page, files: Sequence[PredictionFile]) -> tuple[ExampleRow, Page]:
    runs = []
    for file in files:
        if page.url not in file.predictions:
            runs.append(RunResult("", None, dict.fromkeys(METRIC_KEYS, 0.0)))
            continue
        scores = document_scores(file.predictions[page.url], page.phrases)
        runs.append(RunResult(prediction="; ".join(file.predictions[page.url]), right=scores[3].precision > 0,
                              metrics={f"{name}@{k}": getattr(scores[k], field) for k in CUTOFFS
                                       for name, field in (("F1", "f1"), ("P", "precision"), ("R", "recall"))}))
    row = ExampleRow(id=page.url, question=page.url, gold="; ".join(page.phrases),
                     facets={"gold keyphrases": str(len(page.phrases))}, runs=tuple(runs))
    return row, page


def _view(page: Page, files: Sequence[PredictionFile]) -> ExampleView:
    url, phrases = page.url, page.phrases
    ranked = [file.predictions.get(url, []) for file in files]
    every = list(dict.fromkeys(phrases + [phrase for run in ranked for phrase in run]))
    found = [_phrase_scores(file.scores, url) for file in files]
    columns = [Column("keyphrase", lambda phrase: phrase),
               Column("gold", lambda phrase: "gold" if phrase in phrases else "")]
    for run, (phrases_of_run, run_found) in enumerate(zip(ranked, found)):
        columns.append(Column(f"run {run + 1} rank", lambda phrase, listed=phrases_of_run: str(
            listed.index(phrase) + 1) if phrase in listed else ""))
        if run_found is not None:  # a file without scores for it keeps the one column
            # The model's rank among the phrases it scored: where it put a gold phrase it did not write.
            scored_ranks = {phrase: rank for rank, phrase in enumerate(run_found, start=1)}
            columns.append(Column(f"run {run + 1} model's rank of {len(run_found)}",
                                  lambda phrase, ranks=scored_ranks: str(ranks.get(phrase, ""))))
            columns.append(Column(f"run {run + 1} score", lambda phrase, scored=run_found: f"{scored[phrase]:.4g}"
                                  if phrase in scored else ""))
    table = table_of("keyphrases", every, columns)
    blocks = ()
    if page.text is not None:
        text = page.text
        marks = [Mark(start, end, "keyphrase", None) for phrase in phrases for start, end in _occurrences(text, phrase)]
        marks += [Mark(start, end, "keyphrase", run, f"rank {rank}") for run, phrases_of_run in enumerate(ranked)
                  for rank, phrase in enumerate(phrases_of_run, start=1) for start, end in _occurrences(text, phrase)]
        blocks = (TextBlock("page text", text, tuple(marks)),)
    return ExampleView(id=url, fields=(("url", url), ("keyphrases", "; ".join(phrases))),
                       run_fields=tuple((("keyphrases", _ranked_line(run, run_found)), _scores_field(file.scores, url))
                                        for run, run_found, file in zip(ranked, found, files)),
                       tables=(table,), texts=blocks)


PARTS = BrowseParts(right_means="a gold keyphrase is among the first 3", metric_keys=METRIC_KEYS,
                    read_predictions=_read_ranked, row=_row, view=_view, check_scores=check_scores)


def open_browser(gold_path, pred_paths, **metric_options) -> ExampleBrowser:
    """The pages of an OpenKP gold file against candidate files {"url", "KeyPhrases"} (JSON lines)
    and their scores side files."""
    pages = (Page(url, prepare_keyphrases(record.phrases), record.text)
             for url, record in read_keyphrase_file(gold_path).items())
    return open_examples(PARTS, pages, pred_paths)
