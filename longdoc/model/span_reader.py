"""SpanReader: an extractive QA reader on the global-local encoder, a start/end span head over long tokens.

`longdoc lift --from DIR` writes one from a transformers QA checkpoint (BertForQuestionAnswering,
RobertaForQuestionAnswering, ...): the encoder lifted, and the checkpoint's `qa_outputs` (a Linear
hidden -> 2; output 0 the start logit, output 1 the end logit) as `span_head.projection`, unchanged.
The reader reads what its source read: the tokenizer's pair template in the long input ([CLS]
question [SEP] context [SEP] with token types 0 then 1 for BERT; <s> question </s></s> context </s>
for RoBERTa), and scores every long token as a start and an end.

Importing it (`from longdoc import SpanReader`) registers it with transformers'
AutoModelForQuestionAnswering, and its output is a
`QuestionAnsweringModelOutput` (start_logits, end_logits), so a reader loads and reads as a
transformers QA model does: `AutoModelForQuestionAnswering.from_pretrained(DIR)`, then
`model(**tokenizer(question, context, return_tensors="pt"))` (transformers' input names are the long
input's: longdoc.model.inputs.INPUT_ALIASES).

The head is `heads.SpanHead` under the name task models give theirs, `span_head`, so a task model
with a span head (HotpotQA's) started from the reader's folder starts with the reader's head:
`HotpotQAModel.from_encoder(READER_DIR)` (longdoc.model.task_model).
"""

from dataclasses import dataclass

from torch import Tensor
from transformers import AutoModelForQuestionAnswering
from transformers.modeling_outputs import QuestionAnsweringModelOutput

from longdoc.model.config import GlobalLocalConfig
from longdoc.model.heads import SpanHead, span_loss
from longdoc.model.task_model import SPAN_READER_TASK, TaskModel


@dataclass
class SpanReaderOutput(QuestionAnsweringModelOutput):
    """transformers' QA output: loss (scalar, with start/end positions); start_logits, end_logits [B, L]
    (masked to `answer_mask` where it is given); hidden_states and attentions are left None."""


class SpanReader(TaskModel):
    task_name = SPAN_READER_TASK
    # Answers of at most 15 tokens: the convention of transformers' run_qa and its former QA pipeline.
    default_task_options = {"max_answer_length": 15}

    def __init__(self, config):
        super().__init__(config)
        self.span_head = SpanHead(config.hidden_size)
        self.post_init()

    def forward(self, answer_mask: Tensor | None = None, start_positions: Tensor | None = None,
                end_positions: Tensor | None = None, **inputs: Tensor) -> SpanReaderOutput:
        """`inputs`: the encoder's (GlobalLocalModel.forward); answer_mask [B, L]: positions an answer may
        start or end at (None: all); start_positions, end_positions [B]: long-token targets
        (heads.IGNORE_INDEX for none)."""
        start_logits, end_logits = self.span_head(self.encode(inputs).long_hidden_state, answer_mask)
        loss = None if start_positions is None else span_loss(start_logits, end_logits, start_positions, end_positions)
        return SpanReaderOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)


# transformers' documented registration of a custom model (see modeling.py's).
AutoModelForQuestionAnswering.register(GlobalLocalConfig, SpanReader, exist_ok=True)
