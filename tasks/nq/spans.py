"""Natural Questions answer spans and the official rules for comparing them.

Rules from the official evaluation (google-research-datasets/natural-questions at commit c2c9b2fd,
eval_utils.py, class `Span`, `nonnull_span_equal`, `span_set_equal`, `is_null_span_list`):

- A span carries byte offsets and token offsets, each pair [start, end) or (-1, -1) for "not
  given". A span with neither pair is the null span (no answer).
- One side of a pair negative and the other not, or start >= end, is an error.
- Two non-null spans are equal when both carry byte offsets and these agree, *or* when both carry
  token offsets and these agree. The official check falls through from bytes to tokens, so spans
  whose byte offsets differ still match on equal token offsets. Simplified-format gold has token
  offsets only, so there every comparison is on tokens.
- Two span lists are equal as sets: null spans are dropped, then every span on each side must
  equal some span on the other (duplicates do not matter).
"""

import math
from dataclasses import dataclass
from typing import Any, Callable

from longdoc.errors import InputError

NOT_GIVEN = -1
OFFSET_PAIRS = (("start_byte", "end_byte"), ("start_token", "end_token"))


@dataclass(frozen=True)
class Span:
    """[start, end) offsets in bytes and in tokens; NOT_GIVEN (-1) where a pair is absent."""

    start_byte: float = NOT_GIVEN
    end_byte: float = NOT_GIVEN
    start_token: float = NOT_GIVEN
    end_token: float = NOT_GIVEN

    @property
    def has_bytes(self) -> bool:
        return self.start_byte >= 0 and self.end_byte >= 0

    @property
    def has_tokens(self) -> bool:
        return self.start_token >= 0 and self.end_token >= 0

    @property
    def is_null(self) -> bool:
        return not self.has_bytes and not self.has_tokens


NULL_SPAN = Span()


@dataclass(frozen=True)
class AnswerLabel:
    """One annotator's answer, or one prediction (the official `NQLabel` without scores).

    `yes_no` is lowercased ("yes", "no", "none"), as the official reader does for gold and
    predictions alike.
    """

    long_span: Span
    short_spans: tuple[Span, ...]
    yes_no: str

    @property
    def has_long_answer(self) -> bool:
        return not self.long_span.is_null

    @property
    def has_short_answer(self) -> bool:
        # A yes/no answer counts as a short answer (official `gold_has_short_answer` and
        # `score_short_answer` both test "non-null span list or yes_no != 'none'").
        return not is_null_span_list(self.short_spans) or self.yes_no != "none"


def is_null_span_list(spans: tuple[Span, ...]) -> bool:
    """True when the list is empty or holds only null spans."""
    return all(span.is_null for span in spans)


def spans_equal(a: Span, b: Span) -> bool:
    """Official equality of two spans: equal bytes, or else equal tokens (a null span equals nothing)."""
    if a.has_bytes and b.has_bytes and (a.start_byte, a.end_byte) == (b.start_byte, b.end_byte):
        return True
    return a.has_tokens and b.has_tokens and (a.start_token, a.end_token) == (b.start_token, b.end_token)


def span_sets_equal(gold: tuple[Span, ...], predicted: tuple[Span, ...]) -> bool:
    """Official set equality: null spans dropped, each side covered by the other."""
    gold = [span for span in gold if not span.is_null]
    predicted = [span for span in predicted if not span.is_null]
    return all(any(spans_equal(p, g) for g in gold) for p in predicted) and all(
        any(spans_equal(p, g) for p in predicted) for g in gold
    )


def _offset(record: dict, key: str, where: Callable[[], str]) -> float:
    # Any JSON number is an offset, as in the official script: floats compare by value (3.0
    # equals 3) and booleans are the integers 0 and 1. Strings or null made the official script
    # stop with a TypeError; here they are a clear error instead.
    value = record.get(key, NOT_GIVEN)
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        raise InputError(f"{where()}: field {key!r} must be a number, got {value!r}")
    return value


def parse_span(record: Any, where: Callable[[], str]) -> Span:
    """A Span from a JSON record {start_byte, end_byte, start_token, end_token}.

    A missing pair counts as not given (-1): simplified-format gold has no byte offsets, and the
    official prediction format says participants need not supply both pairs. `where()` names the
    file and record for error messages.
    """
    if not isinstance(record, dict):
        raise InputError(f"{where()}: a span must be a JSON object, got {record!r}")
    values = {key: _offset(record, key, where) for pair in OFFSET_PAIRS for key in pair}
    for start_key, end_key in OFFSET_PAIRS:
        start, end = values[start_key], values[end_key]
        # The two consistency checks of the official `Span.__init__`.
        if (start < 0) != (end < 0):
            raise InputError(f"{where()}: inconsistent null span: {start_key}={start}, {end_key}={end}")
        if start >= 0 and start >= end:
            raise InputError(f"{where()}: empty or reversed span: {start_key}={start} >= {end_key}={end}")
    return Span(**values)


def parse_yes_no(value: Any, where: Callable[[], str]) -> str:
    """The lowercased yes/no answer; the official reader lowercases both gold and predictions."""
    if not isinstance(value, str):
        raise InputError(f"{where()}: field 'yes_no_answer' must be a string, got {value!r}")
    return value.lower()
