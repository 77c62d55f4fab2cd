"""Reading passages with a lifted extractive QA reader (`longdoc lift --from QA_CHECKPOINT`).

A Hub reader (BertForQuestionAnswering, RobertaForQuestionAnswering, ...) was trained on pairs
`[CLS] question [SEP] context [SEP]` of at most 384 wordpieces. It reads here exactly what it was
trained on: each passage `ask` retrieved becomes rows of the tokenizer's own pair template, at most
`ROW_LENGTH` wordpieces (less where the lifted reader's local window covers less, so that every row
is read exactly as the source model would), neighbouring rows sharing `STRIDE` wordpieces, all rows
in one batch. Global tokens would be fresh, untrained weights to such a reader, so it reads none.
What the global-local encoder adds here is what it reads: the passages retrieval chose (one to a
few rows each) rather than every window of the document.

The answer is the span with the best start + end logit over all rows (run_qa's and the former
question-answering pipeline's rule), inside the passage's text, at most `max_answer_len`
wordpieces; spans of the same text (case and spacing aside) are merged, keeping the best. Its score
is the pipeline's: start probability x end probability within its row. With `handle_impossible`
(SQuAD 2.0 readers), no answer is given when the rows' lowest null score (start + end logit at
their first token) beats the best span, as run_qa's post-processing and the pipeline's
`handle_impossible_answer` did.
"""

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

from longdoc.model.heads import top_spans

ROW_LENGTH = 384
STRIDE = 128
SPANS_PER_ROW = 20
# The question's share of a row: the question-answering pipeline's max_question_len. A longer
# question is cut (with a warning), as the tokenizer cannot cut it itself: truncating the passage
# alone cannot make room for a question that fills the row.
MAX_QUESTION_WORDPIECES = 64


@dataclass(frozen=True)
class SpanAnswer:
    context: int  # index into the contexts read
    start: int  # characters of that context
    end: int
    logit: float  # start + end logit: what answers are ranked by
    score: float  # start probability x end probability within the row


def row_length(model) -> int:
    """The longest row the reader reads exactly: ROW_LENGTH, or less where its window is narrower."""
    return min(ROW_LENGTH, model.config.local_radius + 1)


def read_question(question: str, tokenizer, budget: int) -> str:
    """`question` cut after its first `budget` wordpieces (a warning says how much is read), or whole."""
    encoded = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    wordpieces = len(encoded["input_ids"])
    if wordpieces <= budget:
        return question
    read = question[:encoded["offset_mapping"][budget - 1][1]]
    warnings.warn(f"the question is {wordpieces} wordpieces long and the reader reads its first {budget} "
                  f"({len(read)} of its {len(question)} characters, up to {read[-30:]!r}): ask a shorter one",
                  stacklevel=2)
    return read


@torch.inference_mode()
def read_spans(question: str, contexts: Sequence[str], model, tokenizer, *, max_answer_len: int,
               handle_impossible: bool = False, batch_size: int = 16) -> list[SpanAnswer]:
    """Every distinct answer the reader finds in `contexts`, best first (empty: no answer)."""
    length = row_length(model)
    stride = min(STRIDE, length // 2)
    # [CLS] question [SEP] passage [SEP]: a row must hold more of the passage than the rows share.
    question = read_question(question, tokenizer, min(MAX_QUESTION_WORDPIECES, length - stride - 4))
    encoded = tokenizer([question] * len(contexts), list(contexts), truncation="only_second", max_length=length,
                        stride=stride, return_overflowing_tokens=True,
                        return_offsets_mapping=True, padding=True, return_tensors="pt")
    offsets = encoded["offset_mapping"]
    context_of_row = encoded["overflow_to_sample_mapping"].tolist()
    inputs = {"long_input_ids": encoded["input_ids"], "long_attention_mask": encoded["attention_mask"]}
    if "token_type_ids" in encoded:
        inputs["long_token_type_ids"] = encoded["token_type_ids"]
    device = model.device
    starts, ends = [], []
    for first in range(0, len(context_of_row), batch_size):
        rows = {name: value[first:first + batch_size].to(device) for name, value in inputs.items()}
        output = model(**rows)
        starts.append(output.start_logits.float().cpu())
        ends.append(output.end_logits.float().cpu())
    start_logits, end_logits = torch.cat(starts), torch.cat(ends)

    best: dict[str, SpanAnswer] = {}
    null_logit = float("inf")
    for row, context in enumerate(context_of_row):
        in_context = torch.tensor([sequence == 1 for sequence in encoded.sequence_ids(row)])
        groups = torch.where(in_context, 0, -1)
        row_start, row_end = start_logits[row], end_logits[row]
        real = encoded["attention_mask"][row].bool()
        start_p = row_start.masked_fill(~real, float("-inf")).softmax(-1)
        end_p = row_end.masked_fill(~real, float("-inf")).softmax(-1)
        null_logit = min(null_logit, float(row_start[0] + row_end[0]))
        for logit, first_token, last_token in top_spans(row_start, row_end, groups, max_answer_len, SPANS_PER_ROW):
            start, end = int(offsets[row, first_token, 0]), int(offsets[row, last_token, 1])
            answer = SpanAnswer(context, start, end, logit, float(start_p[first_token] * end_p[last_token]))
            key = " ".join(contexts[context][start:end].lower().split())
            if key not in best or logit > best[key].logit:
                best[key] = answer
    ranked = sorted(best.values(), key=lambda answer: answer.logit, reverse=True)
    if handle_impossible and ranked and null_logit > ranked[0].logit:
        return []
    return ranked
