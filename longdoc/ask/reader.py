"""Reading retrieved passages with a trained task model whose answers are spans, and merging its answers.

Which model reads, and how, is the model's task's: its config.json names the task, the registry
gives the task's `ask` part (`longdoc.data.task.SpanAnswerReading`). The passages become one example of
documents (each passage a document with its untitled paragraphs and their sentences, in the order
they stand in their files: the model was trained on documents read in order, and a chain "A works
for B." ... "B is based in C." read backwards is not what it learned), which the task lays out in its
windows and its model reads; an example longer than the encoder is read in several windows. Then:

- a fixed answer (HotpotQA's "yes"/"no"): when the task says the windows give one, it is the
  answer, scored by its probability, with no location (`file`, `start`, `end` are null);
- span answers: the best `SPANS_PER_WINDOW` spans of each window where the task lets an answer lie,
  at most the model's longest answer, each scored by its probability (start softmax x end softmax
  over the window's tokens) times the probability that the answer is a span: its final score.
  Spans with the same text (case and spacing aside) are merged, keeping the location with the best
  final score; those whose final score is under `min_score` are dropped, and when none is left the
  answer list is empty: "no answer found", never an invented span;
- support: the sentences whose supporting-sentence probability (the highest over the windows that
  hold them) reaches the task's threshold for the model, best first, at least the best one.
Every location is mapped back to the file: `text == source.text[start:end]`.
"""

from typing import Sequence

import torch

from longdoc.ask.answers import Answer, Location, locate
from longdoc.ask.index import CorpusIndex, Hit
from longdoc.data.examples import Document, Paragraph, Span
from longdoc.data.prediction import score_examples
from longdoc.data.text import split_paragraphs
from longdoc.data.task import SpanAnswerReading

SPANS_PER_WINDOW = 20
MIN_SCORE = 0.05


def passage_documents(corpus: CorpusIndex, hits: Sequence[Hit]) -> list[Document]:
    """One document per passage; a passage that joins several of its file's paragraphs (a heading
    and what follows) keeps them as separate paragraphs, so no answer span crosses a blank line."""
    documents = []
    for hit in hits:
        passage = corpus.passage(hit)
        text = corpus.text(hit)
        sentences = [Span(start - passage.start, end - passage.start) for start, end in passage.sentences]
        paragraphs = [Paragraph(Span(start, end), [s for s in sentences if start <= s.start and s.end <= end])
                      for start, end in split_paragraphs(text)]
        documents.append(Document(text, [paragraph for paragraph in paragraphs if paragraph.sentences]))
    return documents


def _location(corpus: CorpusIndex, hit: Hit, start: int, end: int) -> Location:
    """Characters [start, end) of the hit's passage text, as a location in its file."""
    offset = corpus.passage(hit).start
    return locate(corpus.documents[hit.document].source, offset + start, offset + end)


def _normalised(text: str) -> str:
    return " ".join(text.lower().split())


def read_answers(question: str, corpus: CorpusIndex, hits: Sequence[Hit], model, tokenizer,
                 reading: SpanAnswerReading, *, top_k: int = 1, min_score: float = MIN_SCORE,
                 batch_size: int = 4) -> list[Answer]:
    """The answers `model`, read as `reading` says (its task's ask part), finds in the passages
    `hits`, best first by final score (at most `top_k`)."""
    if not hits:
        return []
    hits = sorted(hits, key=lambda hit: (hit.document, hit.passage))
    example = reading.passages_example(question, passage_documents(corpus, hits))
    with torch.inference_mode():
        ((_, windows),) = score_examples(
            model, [example], tokenizer=tokenizer, settings=reading.feature_settings(model.config),
            inputs=reading.window_inputs, collate=reading.collate, batch_size=batch_size, progress=False)

    support = _support(corpus, hits, reading.sentence_probabilities(windows), reading.support_threshold(model))
    fixed, probability = reading.fixed_answer(windows)
    if fixed is not None:
        return [Answer(Location(fixed), probability, support)]
    found = []
    for window in windows:
        length = len(window.features.long_input_ids)
        start_log_p = window.outputs["start_logits"][:length].log_softmax(-1)
        end_log_p = window.outputs["end_logits"][:length].log_softmax(-1)
        for _, first, last in reading.window_spans(window, reading.max_answer_length(model), k=SPANS_PER_WINDOW):
            span = reading.char_span(window.features, first, last)
            if span is not None:
                score = float((start_log_p[first] + end_log_p[last]).exp()) * probability
                hit = hits[span.document]
                found.append(Answer(_location(corpus, hit, span.start, span.end), score, support, hit))
    return merge_answers(found, min_score)[:top_k]


def merge_answers(answers: Sequence[Answer], min_score: float) -> list[Answer]:
    """One answer per text (case and spacing aside), the one with the best final score (the first of
    equals), those at or above `min_score`, best first."""
    best: dict[str, Answer] = {}
    for answer in answers:
        key = _normalised(answer.location.text)
        if answer.score >= min_score and (key not in best or answer.score > best[key].score):
            best[key] = answer
    return sorted(best.values(), key=lambda answer: answer.score, reverse=True)


def _support(corpus: CorpusIndex, hits: Sequence[Hit], probabilities, threshold: float) -> list[Location]:
    sentence_spans = [(d, span) for d, hit in enumerate(hits) for span in corpus.passage(hit).sentences]
    ranked = sorted(probabilities, key=probabilities.get, reverse=True)
    chosen = [item for item in ranked if probabilities[item] >= threshold] or ranked[:1]
    locations = []
    for item in chosen:
        d, (start, end) = sentence_spans[item]
        passage_start = corpus.passage(hits[d]).start
        locations.append(_location(corpus, hits[d], start - passage_start, end - passage_start))
    return locations
