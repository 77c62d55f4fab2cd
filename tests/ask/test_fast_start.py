"""Sentence-mode `longdoc ask` imports what a question needs and nothing more: transformers (its model
classes, `transformers.modeling_utils` and BertModel, took several times `import torch`'s time to
import) and the reader's modules are left unloaded (docs/ask.md, "A fast start"), while transformers'
output stays set by the program for whatever imports it later."""

import json
import logging
import os
import subprocess
import sys

from tests.conftest import new_cache

# What a question in sentence mode does not need: transformers (MiniLM runs on torch alone), the reader.
UNNEEDED = ("transformers", "transformers.modeling_utils", "transformers.models.bert.modeling_bert",
            "transformers.models.auto.modeling_auto", "transformers.tokenization_utils_base",
            "longdoc.model.modeling", "longdoc.model.span_reader", "longdoc.model.task_model",
            "longdoc.ask.reader", "longdoc.ask.span_reading")

PROGRAM = """
import json, sys
from longdoc.cli import main

status = main(["ask", "--quiet", "--json", "--question", "Where is Orbix Group based?", sys.argv[1]])
modules = sorted(sys.modules)
from transformers.utils import logging  # as a reader's loading would find it: set by the program
print(json.dumps({"status": status, "modules": modules,
                  "transformers_output": [logging.get_verbosity(), logging.is_progress_bar_enabled()]}))
"""


def test_sentence_mode_leaves_transformers_and_the_reader_unimported(tmp_path):
    document = tmp_path / "notes.txt"
    document.write_text("Ada Quell works for Orbix Group.\n\nOrbix Group is based in Tallinnford.\n")
    environment = {**os.environ, "LONGDOC_CACHE": str(new_cache(tmp_path / "cache"))}
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(document)], capture_output=True, text=True,
                            timeout=300, env=environment)
    assert result.returncode == 0, result.stderr
    answer_line, report_line = result.stdout.strip().splitlines()
    assert json.loads(answer_line)["answers"][0]["text"] == "Orbix Group is based in Tallinnford."
    report = json.loads(report_line)
    assert report["status"] == 0
    assert [name for name in UNNEEDED if name in report["modules"]] == []
    assert "torch" in report["modules"]  # the check sees the process that embedded
    assert report["transformers_output"] == [logging.ERROR, False]
