"""A toy task for the engine's tests: every pipeline part of the Task contract, tiny and self-made,
so the engine's tests depend on no real task.

Data: JSON lines {"id", "text", "label"}; `text` is words w0..w39 of a word-level tokenizer; the
label is 1 when the text holds more odd-numbered words than even ones. Features: the words as the
long input, one global token (CLS) that sees everything; the head classifies from that global token.
Prediction file {id: label}; metric: accuracy.

`make_init(folder)` writes a tiny lifted-encoder folder (GlobalLocalModel + tokenizer) to start from;
`write_data(path, n, seed)` a data file. `register_toy_tasks()` adds the task to the registry (as
"toy" and, for the other-task tests, "toy-other" and "toy-alias"): the `toy_tasks` fixture of
tests/train/conftest.py does so for one test, and takes them out after it.
"""

import json
import random
import signal
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers.utils import ModelOutput

from longdoc.data.batching import collate_features
from longdoc.data.prediction import PredictionFile
from longdoc.io import atomic_write_json, iter_jsonl, read_json
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.inputs import InputSpec
from longdoc.model.pretrained import GlobalLocalModel
from longdoc.model.task_model import TaskModel
from longdoc.data.options import option, stored_defaults
from longdoc.data.task import Task
from longdoc.tasks import register, unregister
from tests.model.conftest import tiny_config as model_tiny_config

WORDS = [f"w{i}" for i in range(40)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]"]
LABEL = InputSpec("labels", ("batch",), torch.long, pad=-100)


def tiny_config(**overrides) -> GlobalLocalConfig:
    """tests/model's tiny encoder, for the toy vocabulary and inputs, with dropout (resuming must
    restore its random streams)."""
    return model_tiny_config(**{"vocab_size": len(SPECIAL) + len(WORDS), "num_hidden_layers": 2,
                                "num_attention_heads": 2, "long_max_len": 32, "global_max_len": 4,
                                "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, **overrides})


def make_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIAL + WORDS)}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]")


def make_init(folder: Path, **config_overrides) -> Path:
    """A lifted-encoder folder: a tiny GlobalLocalModel (seed 0) and the toy tokenizer."""
    torch.manual_seed(0)
    GlobalLocalModel(tiny_config(**config_overrides)).save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return folder


def write_data(path: Path, n: int, seed: int) -> Path:
    generator = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for index in range(n):
            numbers = [generator.randrange(len(WORDS)) for _ in range(generator.randrange(4, 30))]
            label = int(sum(number % 2 for number in numbers) * 2 > len(numbers))
            handle.write(json.dumps({"id": f"e{index}", "text": " ".join(f"w{n}" for n in numbers),
                                     "label": label}) + "\n")
    return path


# reader: official file -> examples
def read_examples(path):
    for _, record in iter_jsonl(path):
        yield record


# features
def _row(example, tokenizer, config) -> dict:
    ids = tokenizer(example["text"], add_special_tokens=False)["input_ids"][: config.long_max_len]
    return {"long_input_ids": ids, "long_attention_mask": [1] * len(ids), "sentence_ids": [0] * len(ids),
            "global_input_ids": [tokenizer.cls_token_id], "global_attention_mask": [1], "global_sees_all": [True]}


def training_features(path, tokenizer, config, options=None, progress=True):
    return [{**_row(example, tokenizer, config), "labels": example["label"]} for example in read_examples(path)]


def collate(rows, pad_token_id):
    return collate_features(rows, pad_token_id, extra=(LABEL,))


def collate_interrupting_at(call: int):
    """`collate` that sends this process SIGINT (Ctrl-C) during its `call`-th batch: that step
    finishes, then the run stops."""
    calls = []

    def collate_then_interrupt(rows, pad_token_id):
        calls.append(1)
        if len(calls) == call:
            signal.raise_signal(signal.SIGINT)
        return collate_features(rows, pad_token_id, extra=(LABEL,))  # (`collate` is what this replaces)

    return collate_then_interrupt


# model
@dataclass
class ToyOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None


@dataclass(frozen=True)
class ToyOptions:
    label_smoothing: float = option(0.0, "label smoothing of the toy loss")


class ToyModel(TaskModel):
    task_name = "toy"
    default_task_options = stored_defaults(ToyOptions)

    def __init__(self, config):
        super().__init__(config)
        self.classifier = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, labels: Tensor | None = None, **inputs: Tensor) -> ToyOutput:
        logits = self.classifier(self.encode(inputs).global_hidden_state[:, 0])
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits, labels, label_smoothing=self.task_options["label_smoothing"])
        return ToyOutput(loss=loss, logits=logits)


class OtherToyModel(ToyModel):
    task_name = "toy-other"


# decode
def predict(model, data_path, out_path, *, tokenizer, options=None, tune=False, batch_size=8, progress=True):
    examples = list(read_examples(data_path))
    outputs = model.forward_rows([_row(example, tokenizer, model.config) for example in examples], collate,
                                 batch_size, progress=False)
    atomic_write_json(out_path, {example["id"]: int(output["logits"].argmax()) for example, output
                                 in zip(examples, outputs)})
    return PredictionFile(Path(out_path), len(examples))


# metric
def evaluate_files(gold_path, pred_path, **options):
    predictions = read_json(pred_path)
    gold = list(read_examples(gold_path))
    return {"accuracy": sum(predictions.get(example["id"]) == example["label"] for example in gold) / len(gold)}


def _task(name: str, model: str) -> Task:
    return Task(name=name, description="toy classification for the engine tests", reader=__name__,
                metric=__name__, headline_metric="accuracy", features=__name__, model=f"{__name__}:{model}",
                decode=__name__, configs=Path(__file__).parent / "toy_configs",
                options=ToyOptions)


# "toy-alias" trains the "toy" model under another name, as multihop trains HotpotQA's model.
TOY_TASKS = (_task("toy", "ToyModel"), _task("toy-other", "OtherToyModel"), _task("toy-alias", "ToyModel"))


def register_toy_tasks() -> None:
    for task in TOY_TASKS:
        register(task)


def unregister_toy_tasks() -> None:
    for task in TOY_TASKS:
        unregister(task.name)
