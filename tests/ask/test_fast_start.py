"""Sentence-mode `longdoc ask` imports what a question needs and nothing more: transformers (its model
classes, `transformers.modeling_utils` and BertModel, took several times `import torch`'s time to
import) and the reader's modules are left unloaded (docs/ask.md, "A fast start"), while transformers'
output stays set by the program for whatever imports it later. With a lifted reader, the reader runs
on torch alone (longdoc.model.plain_reader), transformers' model classes unloaded, and reads exactly
what the transformers model (SpanReader) reads."""

import json
import logging
import os
import subprocess
import sys

import torch

from longdoc.ask.span_reading import read_spans
from longdoc.model.plain_reader import load_span_reader
from longdoc.model.span_reader import SpanReader
from longdoc.model_folder import read_model_folder, read_tokenizer
from tests.conftest import new_cache

# What a question in sentence mode does not need: transformers (MiniLM runs on torch alone), the reader.
UNNEEDED = ("transformers", "transformers.modeling_utils", "transformers.models.bert.modeling_bert",
            "transformers.models.auto.modeling_auto", "transformers.tokenization_utils_base",
            "longdoc.model.modeling", "longdoc.model.span_reader", "longdoc.model.task_model",
            "longdoc.ask.reader", "longdoc.ask.span_reading")

PROGRAM = """
import json, sys
from longdoc.cli import main

status = main(["ask", "--quiet", "--json", "--question", "Where is Orbix Group based?", *sys.argv[1:]])
modules = sorted(sys.modules)
from transformers.utils import logging  # as a reader's loading would find it: set by the program
print(json.dumps({"status": status, "modules": modules,
                  "transformers_output": [logging.get_verbosity(), logging.is_progress_bar_enabled()]}))
"""


DOCUMENT = "Ada Quell works for Orbix Group.\n\nOrbix Group is based in Tallinnford.\n"
# What a question with a lifted reader does not need: transformers' model classes, the reader's transformers
# model, the task models and the reader of trained task models.
UNNEEDED_BY_A_READER = ("transformers.modeling_utils", "transformers.modeling_layers", "transformers.activations",
                        "longdoc.model.pretrained",
                        "longdoc.model.span_reader", "longdoc.model.task_model", "longdoc.ask.reader")


def ask(tmp_path, *arguments: str) -> tuple[dict, dict]:
    """(the answer, the report of PROGRAM) of a question about DOCUMENT, `arguments` before the file."""
    document = tmp_path / "notes.txt"
    document.write_text(DOCUMENT)
    environment = {**os.environ, "LONGDOC_CACHE": str(new_cache(tmp_path / "cache"))}
    result = subprocess.run([sys.executable, "-c", PROGRAM, *arguments, str(document)], capture_output=True,
                            text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr
    answer_line, report_line = result.stdout.strip().splitlines()
    return json.loads(answer_line), json.loads(report_line)


def test_sentence_mode_leaves_transformers_and_the_reader_unimported(tmp_path):
    answer, report = ask(tmp_path)
    assert answer["answers"][0]["text"] == "Orbix Group is based in Tallinnford."
    assert report["status"] == 0
    assert [name for name in UNNEEDED if name in report["modules"]] == []
    assert "torch" in report["modules"]  # the check sees the process that embedded
    assert report["transformers_output"] == [logging.ERROR, False]


def test_a_lifted_reader_answers_without_transformers_model_classes(lifted_reader, tmp_path):
    answer, report = ask(tmp_path, "--model", str(lifted_reader / "lifted"))
    assert answer["mode"] == "span" and DOCUMENT[answer["answers"][0]["start"]:answer["answers"][0]["end"]] != ""
    assert report["status"] == 0
    assert "longdoc.model.plain_reader" in report["modules"]  # the check sees the process that read
    assert [name for name in UNNEEDED_BY_A_READER if name in report["modules"]] == []


def test_the_reader_on_torch_alone_reads_exactly_what_the_transformers_model_reads(lifted_reader):
    folder = read_model_folder(lifted_reader / "lifted")
    plain = load_span_reader(folder.path, folder.model_config())
    model = SpanReader.from_pretrained(folder.path).eval()
    assert list(plain.state_dict()) == list(model.state_dict())
    tokenizer = read_tokenizer(folder.path)
    question = "Who founded the northern mill?"
    contexts = ["The northern mill was founded by Ada Quell in 1871. " * 30, "Orbix Group is based in Tallinnford."]
    # rows of several lengths, padded (the first context overflows into strided rows)
    encoded = tokenizer([question] * 2, contexts, truncation="only_second", max_length=65, stride=16,
                        return_overflowing_tokens=True, padding=True, return_tensors="pt")
    inputs = {"long_input_ids": encoded["input_ids"], "long_attention_mask": encoded["attention_mask"],
              "long_token_type_ids": encoded["token_type_ids"]}
    with torch.inference_mode():
        expected, found = model(**inputs), plain(**inputs)
    assert encoded["input_ids"].shape[0] > 2
    assert torch.equal(found.start_logits, expected.start_logits)
    assert torch.equal(found.end_logits, expected.end_logits)
    assert read_spans(question, contexts, plain, tokenizer, max_answer_len=15) == read_spans(
        question, contexts, model, tokenizer, max_answer_len=15)
