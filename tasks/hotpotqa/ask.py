"""HotpotQA's model reading `longdoc ask`'s passages (longdoc.data.task.SpanAnswerReading): each passage a
document of untitled paragraphs, laid out and windowed as the task's features are, decoded as its
predictions are (answer type averaged over windows, spans inside one paragraph's sentences,
supporting-fact probabilities), with the model's own threshold for support."""

from typing import Any, Sequence

from longdoc.data.examples import Document, StructuredExample
from longdoc.data.features import Features
from longdoc.data.prediction import WindowScores
from longdoc.tasks.hotpotqa import decode, features

# The protocol's functions that the task's features and decoder have as they are.
__all__ = ["passages_example", "feature_settings", "window_inputs", "collate", "fixed_answer", "window_spans",
           "char_span", "sentence_probabilities", "support_threshold", "max_answer_length"]
feature_settings, collate = features.feature_settings, features.collate
window_spans, char_span = decode.window_spans, decode.char_span


def passages_example(question: str, documents: Sequence[Document]) -> StructuredExample:
    return StructuredExample(id="question", question=question, documents=list(documents)).validate()


def window_inputs(example: StructuredExample, window: Features) -> dict[str, Any]:
    return features.window_inputs(window)


def fixed_answer(windows: Sequence[WindowScores]) -> tuple[str | None, float]:
    """"yes" or "no" with its probability when the type head puts it first; else (None, p(span))."""
    kind, probabilities = decode.answer_type(windows)
    return (None, float(probabilities[0])) if kind == "span" else (kind, float(probabilities.max()))


def sentence_probabilities(windows: Sequence[WindowScores]) -> dict[int, float]:
    return decode.sentence_item_probabilities(windows)


def support_threshold(model) -> float:
    """The threshold chosen on dev and stored with the model, else the decoder's default."""
    stored = model.task_options.get("sp_threshold")
    return decode.DEFAULT_SP_THRESHOLD if stored is None else float(stored)


def max_answer_length(model) -> int:
    return model.task_options["max_answer_length"]
