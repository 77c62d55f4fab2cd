"""Reading retrieved passages with a trained HotpotQA-style model, and merging its answers.

The passages become one `StructuredExample` in the HotpotQA construction (each passage a document
with its untitled paragraphs and their sentences, in the order they stand in their files: the model
was trained on documents read in order, and a chain "A works for B." ... "B is based in C." read
backwards is not what it learned), so the task's own feature
builder and model read them (`longdoc.tasks.hotpotqa.features` / `.model`, named through the task
registry); an example longer than the encoder is read in several windows. From the outputs:

- answer type: the type probabilities averaged over windows; "yes"/"no" when one of them is the
  most probable (then the answer has no location: `file`, `start`, `end` are null);
- span answers: the best `SPANS_PER_WINDOW` spans of each window inside one sentence run of one
  passage (`longdoc.model.heads.top_spans`), each scored by its probability (start softmax x end
  softmax over the window's allowed tokens); spans with the same text (case and spacing aside) are
  merged, keeping the best location and score; those under `min_score` are dropped, and when none
  is left the answer list is empty: "no answer found", never an invented span;
- support: the sentences whose supporting-fact probability reaches the model's threshold (its
  `task_options["sp_threshold"]`, else 0.5), best first, at least the best one.
Every location is mapped back to the file: `text == source.text[start:end]`.
"""

from dataclasses import dataclass, field
from typing import Sequence

import torch

from longdoc.ask.index import CorpusIndex, Hit
from longdoc.data.examples import Document, Paragraph, Span, StructuredExample
from longdoc.data.features import GlobalKind, GlobalMarkers, build_features
from longdoc.data.spans import TokenSpan, token_span_to_char_span
from longdoc.data.text import split_paragraphs
from longdoc.model.heads import top_spans
from longdoc.tasks import get_task

SPANS_PER_WINDOW = 20
MIN_SCORE = 0.05
DEFAULT_SP_THRESHOLD = 0.5
READER_TASK = "hotpotqa"
ANSWER_TYPES = ("span", "yes", "no")  # the HotpotQA type head's classes, in its order


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


def load_reader(model_dir):
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
    features_module = get_task(READER_TASK).load("features")
    if not hits:
        return []
    hits = sorted(hits, key=lambda hit: (hit.document, hit.passage))
    example = passages_example(question, corpus, hits)
    windows = build_features(example, tokenizer, features_module.feature_settings(model.config),
                             GlobalMarkers.from_tokenizer(tokenizer))
    with torch.inference_mode():
        outputs = model.forward_rows([features_module.window_inputs(f) for f in windows], features_module.collate,
                                     batch_size, progress=False)

    support = _support(corpus, hits, windows, outputs, model)
    type_probabilities = torch.stack([o["type_logits"].float().softmax(-1) for o in outputs]).mean(0)
    answer_type = ANSWER_TYPES[int(type_probabilities.argmax())]
    if answer_type != "span":
        return [Answer(Location(answer_type, None, None, None), float(type_probabilities.max()), support)]

    max_length = model.config.task_options.get("max_answer_length", 30)
    best: dict[str, Answer] = {}
    for features, output in zip(windows, outputs):
        length = len(features.long_input_ids)
        is_sentence = [kind == GlobalKind.SENTENCE for kind in features.global_kinds]
        groups = torch.tensor([paragraph if owner >= 0 and is_sentence[owner] else -1
                               for owner, paragraph in zip(features.sentence_ids, features.long_paragraph_ids)])
        start_logits, end_logits = output["start_logits"][:length].float(), output["end_logits"][:length].float()
        start_log_p, end_log_p = start_logits.log_softmax(-1), end_logits.log_softmax(-1)
        for _, first, last in top_spans(start_logits, end_logits, groups, max_length, k=SPANS_PER_WINDOW):
            score = float((start_log_p[first] + end_log_p[last]).exp())
            span = token_span_to_char_span(features.long_offsets, features.long_source_ids, TokenSpan(first, last))
            if span is None or score < min_score:
                continue
            location = _location(corpus, hits[span.document], span.start, span.end)
            key = _normalised(location.text)
            if key not in best or score > best[key].score:
                best[key] = Answer(location, score * float(type_probabilities[0]), support)
    return sorted(best.values(), key=lambda answer: answer.score, reverse=True)[:top_k]


def _support(corpus, hits, windows, outputs, model) -> list[Location]:
    threshold = model.config.task_options.get("sp_threshold")
    threshold = DEFAULT_SP_THRESHOLD if threshold is None else float(threshold)
    sentence_spans = [(d, span) for d, hit in enumerate(hits) for span in corpus.passage(hit).sentences]
    probabilities: dict[int, float] = {}
    for features, output in zip(windows, outputs):
        for g, (kind, item) in enumerate(zip(features.global_kinds, features.global_item_ids)):
            if kind == GlobalKind.SENTENCE:
                probability = float(torch.sigmoid(output["sp_logits"][g].float()))
                probabilities[item] = max(probability, probabilities.get(item, 0.0))
    ranked = sorted(probabilities, key=probabilities.get, reverse=True)
    chosen = [item for item in ranked if probabilities[item] >= threshold] or ranked[:1]
    locations = []
    for item in chosen:
        d, (start, end) = sentence_spans[item]
        passage_start = corpus.passage(hits[d]).start
        locations.append(_location(corpus, hits[d], start - passage_start, end - passage_start))
    return locations
