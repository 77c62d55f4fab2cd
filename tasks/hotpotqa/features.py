"""HotpotQA examples -> training rows and batches: ETC's construction (Ainslie et al., 2020,
arXiv:2004.08483, section 4; google-research/google-research etcmodel/models/hotpotqa/generate_tf_examples_lib.py).

Long input: [CLS] question [SEP] then each context paragraph (title + sentences) [SEP]; global
input: CLS, one token per question wordpiece, and per paragraph one paragraph token followed by
one token per sentence (`longdoc.data.features.build_features` lays them out). Hard g2l and the
"other paragraph" relative id come from the encoder config (`hard_g2l`) and the paragraph ids
the feature builder writes (ETC, Ainslie et al., 2020, section 4; each HotpotQA context entry is
its own paragraph).

Per training window (row), beside the model inputs:
- `answer_mask` [L]: 1 on long tokens of context sentences, where a span may start and end
  (never the question, titles, [CLS]/[SEP]);
- `sentence_mask` [G]: 1 on sentence global tokens, the ones that get a supporting-fact logit;
- `question_mask` [G]: 1 on question global tokens, which the answer-type head averages;
- `sp_labels` [G]: 1 / 0 for a sentence that is / is not a supporting fact, -1 elsewhere;
- `answer_type`: 0 span, 1 yes, 2 no (`ANSWER_TYPES`);
- `start_positions`, `end_positions`: first and last long token of the first gold answer
  occurrence (the reader lists those in supporting sentences first) that lies whole in this
  window, -1 when none does.
Span answers the reader could not find in the context keep their type label and their place in
evaluation but give no span target; one warning counts them.

Feature settings (`stride`, `max_question_len`) are the model's `task_options`; lengths are the
encoder config's `long_max_len` and `global_max_len`.
"""

import warnings
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from longdoc.data.batching import collate_features
from longdoc.data.examples import StructuredExample
from longdoc.data.features import FeatureSettings, Features, GlobalKind, GlobalMarkers, build_features, window_settings
from longdoc.data.spans import char_span_to_token_span
from longdoc.model.heads import IGNORE_INDEX
from longdoc.model.inputs import InputSpec
from longdoc.tasks.hotpotqa.reader import read_examples

ANSWER_TYPES = ("span", "yes", "no")
# The rows' keys beside the encoder inputs, as `collate` batches them (labels only in training rows).
EXTRA_INPUTS = (
    InputSpec("answer_mask", ("batch", "long"), torch.long, pad=0),
    InputSpec("sentence_mask", ("batch", "global"), torch.long, pad=0),
    InputSpec("question_mask", ("batch", "global"), torch.long, pad=0),
    InputSpec("sp_labels", ("batch", "global"), torch.long, pad=IGNORE_INDEX),
    InputSpec("answer_type", ("batch",), torch.long),
    InputSpec("start_positions", ("batch",), torch.long),
    InputSpec("end_positions", ("batch",), torch.long),
)


def feature_settings(config) -> FeatureSettings:
    """The window settings of a model config (a GlobalLocalConfig with the task's `task_options`)."""
    return window_settings("hotpotqa", config, ("stride", "max_question_len"))


def answer_type(example: StructuredExample) -> int:
    return ANSWER_TYPES.index(example.labels["answer"]) if example.labels["answer"] in ("yes", "no") else 0


def sentence_facts(example: StructuredExample) -> list[tuple[str, int]]:
    """(title, sentence index) of every sentence, in the flat order `global_item_ids` uses."""
    facts = []
    for d, p, s in example.sentence_locations():
        document = example.documents[d]
        title = document.paragraphs[p].title
        facts.append((document.text[title.start:title.end], s))
    return facts


def window_inputs(features: Features) -> dict[str, Any]:
    """The model inputs of one window plus the masks the heads need (no labels)."""
    row = features.model_inputs()
    is_sentence = [kind == GlobalKind.SENTENCE for kind in features.global_kinds]
    row["answer_mask"] = [int(owner >= 0 and is_sentence[owner]) for owner in features.sentence_ids]
    row["sentence_mask"] = [int(flag) for flag in is_sentence]
    row["question_mask"] = [int(kind == GlobalKind.QUESTION) for kind in features.global_kinds]
    return row


def window_row(example: StructuredExample, features: Features, facts: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """One training row: `window_inputs` plus the labels of the module docstring."""
    row = window_inputs(features)
    gold = {(title, index) for title, index in example.labels["supporting_facts"]}
    row["sp_labels"] = [int(facts[item] in gold) if kind == GlobalKind.SENTENCE else IGNORE_INDEX
                        for kind, item in zip(features.global_kinds, features.global_item_ids)]
    row["answer_type"] = answer_type(example)
    row["start_positions"] = row["end_positions"] = IGNORE_INDEX
    for answer in example.answers:
        tokens = char_span_to_token_span(features.long_offsets, features.long_source_ids, answer)
        if tokens is not None and row["answer_mask"][tokens.first] and row["answer_mask"][tokens.last]:
            row["start_positions"], row["end_positions"] = tokens.first, tokens.last
            break
    return row


def training_features(path, tokenizer, config, options=None, progress: bool = True) -> list[dict[str, Any]]:
    """Every window of every example in the HotpotQA file `path`, as labelled rows."""
    settings = feature_settings(config)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    rows, not_found, span_answers = [], 0, 0
    for example in tqdm(read_examples(path), desc=f"features {path}", unit=" examples",
                        disable=not progress):
        facts = sentence_facts(example)
        if answer_type(example) == 0:
            span_answers += 1
            not_found += not example.answers
        rows.extend(window_row(example, features, facts)
                    for features in build_features(example, tokenizer, settings, markers))
    if not_found:
        warnings.warn(f"{path}: {not_found} of {span_answers} span answers do not occur in their context: kept for "
                      "evaluation, not trained on as spans", stacklevel=2)
    return rows


def collate(rows: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """A padded batch of rows (labelled or not) that goes straight into `HotpotQAModel(**batch)`."""
    return collate_features(rows, pad_token_id, EXTRA_INPUTS)
