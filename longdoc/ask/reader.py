"""Reading retrieved passages with a trained HotpotQA-style model, and merging its answers.

The passages become one `StructuredExample` in the HotpotQA construction (each passage a document
with its untitled paragraphs and their sentences, in the order they stand in their files: the model
was trained on documents read in order, and a chain "A works for B." ... "B is based in C." read
backwards is not what it learned), so the task's own feature
builder and model read them (`longdoc.tasks.hotpotqa.features` / `.model`, named through the task
registry); an example longer than the encoder is read in several windows. The outputs are read
with the task's own decoder (`longdoc.tasks.hotpotqa.decode`, through the registry too):

- answer type: the type probabilities averaged over windows; "yes"/"no" when one of them is the
  most probable (then the answer has no location: `file`, `start`, `end` are null);
- span answers: the best `SPANS_PER_WINDOW` spans of each window inside one sentence run of one
  passage, at most the model's `max_answer_length` wordpieces, each scored by its probability
  (start softmax x end softmax over the window's tokens) times the span type's probability; spans
  with the same text (case and spacing aside) are merged, keeping the best location and score;
  those under `min_score` are dropped, and when none is left the answer list is empty: "no answer
  found", never an invented span;
- support: the sentences whose supporting-fact probability (the highest over the windows that
  hold them) reaches the model's threshold (its `task_options["sp_threshold"]`, else the
  decoder's default), best first, at least the best one.
Every location is mapped back to the file: `text == source.text[start:end]`.
"""

from dataclasses import dataclass, field
from typing import Sequence

import torch

from longdoc.ask.index import CorpusIndex, Hit
from longdoc.data.examples import Document, Paragraph, Span, StructuredExample
from longdoc.data.prediction import WindowScores, score_examples
from longdoc.data.text import split_paragraphs
from longdoc.tasks import get_task

SPANS_PER_WINDOW = 20
MIN_SCORE = 0.05
READER_TASK = "hotpotqa"


@dataclass
class Location:
    text: str
    file: str | None
    start: int | None
    end: int | None

    def to_json(self) -> dict:
        return {"text": self.text, "file": self.file, "start": self.start, "end": self.end}


@dataclass
class Answer:
    location: Location
    score: float
    support: list[Location] = field(default_factory=list)

    def to_json(self) -> dict:
        return {**self.location.to_json(), "score": self.score, "support": [s.to_json() for s in self.support]}


def load_structured_reader(model_dir):
    """(model, tokenizer) of a trained HotpotQA model folder; InputError saying what DIR is otherwise
    (a damaged weights file included: TaskModel.from_pretrained reads it through readable_weights)."""
    from pathlib import Path

    from longdoc.convert.checkpoint import read_tokenizer

    model = get_task(READER_TASK).load("model").from_pretrained(model_dir)
    return model.eval(), read_tokenizer(Path(model_dir))


def passages_example(question: str, corpus: CorpusIndex, hits: Sequence[Hit]) -> StructuredExample:
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
    return StructuredExample(id="question", question=question, documents=documents).validate()


def _location(corpus: CorpusIndex, hit: Hit, start: int, end: int) -> Location:
    """Characters [start, end) of the hit's passage text, as a location in its file."""
    document = corpus.documents[hit.document]
    offset = corpus.passage(hit).start
    return Location(document.source.text[offset + start:offset + end], document.source.path, offset + start,
                    offset + end)


def _normalised(text: str) -> str:
    return " ".join(text.lower().split())


def read_answers(question: str, corpus: CorpusIndex, hits: Sequence[Hit], model, tokenizer, *, top_k: int = 1,
                 min_score: float = MIN_SCORE, batch_size: int = 4) -> list[Answer]:
    """The answers the model reads in the passages `hits`, best first (at most `top_k`)."""
    task = get_task(READER_TASK)
    features_module, decode = task.load("features"), task.load("decode")
    if not hits:
        return []
    hits = sorted(hits, key=lambda hit: (hit.document, hit.passage))
    example = passages_example(question, corpus, hits)
    with torch.inference_mode():
        ((_, windows),) = score_examples(
            model, [example], tokenizer=tokenizer, settings=features_module.feature_settings(model.config),
            inputs=lambda _, features: features_module.window_inputs(features), collate=features_module.collate,
            batch_size=batch_size, progress=False)

    support = _support(corpus, hits, windows, model, decode)
    answer_type, type_probabilities = decode.answer_type(windows)
    if answer_type != "span":
        return [Answer(Location(answer_type, None, None, None), float(type_probabilities.max()), support)]

    max_length = model.task_options["max_answer_length"]
    best: dict[str, Answer] = {}
    for window in windows:
        length = len(window.features.long_input_ids)
        start_log_p = window.outputs["start_logits"][:length].log_softmax(-1)
        end_log_p = window.outputs["end_logits"][:length].log_softmax(-1)
        for _, first, last in decode.window_spans(window, max_length, k=SPANS_PER_WINDOW):
            score = float((start_log_p[first] + end_log_p[last]).exp())
            span = decode.char_span(window.features, first, last)
            if span is None or score < min_score:
                continue
            location = _location(corpus, hits[span.document], span.start, span.end)
            key = _normalised(location.text)
            if key not in best or score > best[key].score:
                best[key] = Answer(location, score * float(type_probabilities[0]), support)
    return sorted(best.values(), key=lambda answer: answer.score, reverse=True)[:top_k]


def _support(corpus: CorpusIndex, hits: Sequence[Hit], windows: Sequence[WindowScores], model, decode) -> list[Location]:
    threshold = model.task_options.get("sp_threshold")
    threshold = decode.DEFAULT_SP_THRESHOLD if threshold is None else float(threshold)
    sentence_spans = [(d, span) for d, hit in enumerate(hits) for span in corpus.passage(hit).sentences]
    probabilities = decode.sentence_item_probabilities(windows)
    ranked = sorted(probabilities, key=probabilities.get, reverse=True)
    chosen = [item for item in ranked if probabilities[item] >= threshold] or ranked[:1]
    locations = []
    for item in chosen:
        d, (start, end) = sentence_spans[item]
        passage_start = corpus.passage(hits[d]).start
        locations.append(_location(corpus, hits[d], start - passage_start, end - passage_start))
    return locations
