"""A longdoc model folder -> an exported folder: the checked ONNX graph beside the model, and a card.

`export_folder(model_dir, out, tasks, opset)`: load the model (a trained task model, a lifted span reader,
a converted ETC checkpoint or a plain encoder), export its graph (longdoc.export.graph), check it
against the model (longdoc.export.check), and only then write `out`, atomically:
- model.onnx: the graph, with the config and the signature it was exported with in its metadata
  (what longdoc.export.runtime checks the folder's config.json against);
- config.json, model.safetensors, the tokenizer: the model folder itself, so that the folder
  serves both runtimes (`--runtime torch` and `--runtime onnx` of predict and ask);
- export.json: what was exported, the opset, the lengths checked and the largest differences, the
  versions of torch, onnx and onnxruntime, the date; README.md: the same, for people.
"""

import datetime
import json
import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Callable

from longdoc.errors import InputError
from longdoc.export.check import TOLERANCE, LengthCheck, compare
from longdoc.export.graph import DEFAULT_OPSET, export_onnx, traced_length
from longdoc.export.runtime import CONFIG_KEY, ONNX_FILE, SIGNATURE_KEY
from longdoc.export.signature import KIND_ENCODER, GraphSignature, signature_of
from longdoc.data.task import TaskLookup
from longdoc.model_folder import ModelFolder

CARD_FILE = "export.json"
MODEL_FILES = ("config.json", "model.safetensors")
# The config fields a card names (those that shape the graph).
HIGHLIGHTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "local_radius", "long_max_len",
              "global_max_len", "position_embedding_type", "residual_attention", "talking_heads", "hard_g2l",
              "hard_l2g", "cross_kv_projections", "pre_layer_norm", "global_feature_size")


def load_model(folder: ModelFolder, tasks: TaskLookup):
    """The PyTorch model a longdoc folder holds (its config as already read): a task model of its task
    (the class `tasks`, the registry, gives; the span reader's), or a bare encoder."""
    from longdoc.model.encoder_folder import readable_weights
    from longdoc.model.pretrained import GlobalLocalModel
    from longdoc.model.span_reader import SpanReader

    task, model_dir = folder.task, folder.path
    if not (model_dir / "model.safetensors").is_file():
        raise InputError(f"{model_dir}: no model.safetensors; expected a longdoc model folder (config.json + "
                         "model.safetensors)")
    if task == SpanReader.task_name:
        model_class = SpanReader
    elif task:
        try:
            model_class = tasks.get(task).load("model")
        except (KeyError, LookupError) as error:
            raise InputError(f"{model_dir}: a model of task {task!r}, which cannot be loaded here ({error})") from None
    else:
        model_class = GlobalLocalModel
    with readable_weights(model_dir):
        return model_class.from_pretrained(model_dir, config=folder.model_config()).float().eval()


def export_folder(model_dir: str | Path, out: str | Path, tasks: TaskLookup, opset: int = DEFAULT_OPSET,
                  progress: Callable[[str], None] | None = None) -> dict:
    """Export the model in `model_dir` to the folder `out` (see the module docstring); the card's record.
    `tasks`: the registry a task model's class is found in. Nothing is written when the export or its
    check fails."""
    import onnx
    import onnxruntime

    from longdoc.model_folder import read_model_folder, read_tokenizer, refuse_existing, write_new_folder

    model_dir, out = Path(model_dir), Path(out)
    refuse_existing(out)
    tell = progress or (lambda text: None)
    folder = read_model_folder(model_dir)
    model = load_model(folder, tasks)
    tokenizer = read_tokenizer(model_dir)
    signature = signature_of(model)
    tell(f"exporting {signature.kind} (opset {opset}, traced at {traced_length(model.config)} long tokens)")
    graph = export_onnx(model, signature, opset)
    onnx.helper.set_model_props(graph, {CONFIG_KEY: json.dumps(dict(folder.config), sort_keys=True),
                                        SIGNATURE_KEY: json.dumps(signature.to_json())})
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    checks = compare(model, session, signature, progress=tell)
    card = card_record(model.config, signature, opset, checks)

    def write(folder: Path) -> None:
        for name in MODEL_FILES:
            shutil.copyfile(model_dir / name, folder / name)
        tokenizer.save_pretrained(folder)
        onnx.save_model(graph, str(folder / ONNX_FILE))
        (folder / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
        (folder / "README.md").write_text(model_card(card, model_dir), encoding="utf-8")

    write_new_folder(out, write)
    return card


def card_record(config, signature: GraphSignature, opset: int, checks: list[LengthCheck]) -> dict:
    """What export.json holds (see the module docstring)."""
    largest = {name: max(check.max_difference[name] for check in checks) for name in signature.outputs}
    return {
        "format": "onnx",
        "model": signature.kind,
        "task_options": dict(getattr(config, "task_options", {}) or {}),
        "config": {name: getattr(config, name) for name in HIGHLIGHTS},
        "opset": opset,
        "signature": signature.to_json(),
        "traced_length": traced_length(config),
        "checks": [check.to_json() for check in checks],
        "tolerance": TOLERANCE,
        "max_difference": {name: float(f"{value:.3g}") for name, value in largest.items()},
        "versions": {name: version(name) for name in ("longdoc", "torch", "onnx", "onnxruntime", "onnxscript")},
        "date": datetime.date.today().isoformat(),
    }


def model_card(card: dict, source: Path) -> str:
    """README.md of an exported folder."""
    what = "A bare encoder (GlobalLocalModel)" if card["model"] == KIND_ENCODER else f"A {card['model']} task model"
    inputs = ", ".join(f"`{entry['name']}` [{', '.join(map(str, entry['axes']))}] {entry['dtype']}"
                       for entry in card["signature"]["inputs"])
    rows = "\n".join(f"| {check['length']} | {check['global_tokens']} | {check['batch']} | "
                     + ", ".join(f"{name} {value:.2g}" for name, value in check["max_difference"].items()) + " |"
                     for check in card["checks"])
    highlights = ", ".join(f"{name} {value}" for name, value in card["config"].items())
    versions = ", ".join(f"{name} {value}" for name, value in card["versions"].items())
    return f"""# ONNX export of {source.name}

{what} exported from `{source}` by `longdoc export` on {card['date']}, with torch's exporter
(torch.export, dynamo) in ONNX opset {card['opset']}: `{ONNX_FILE}`. Beside it the PyTorch model
(`config.json`, `model.safetensors`) and the tokenizer, so that `longdoc predict` and `longdoc ask`
run this folder with `--runtime onnx` (ONNX Runtime) or `--runtime torch`.

- Config: {highlights}.
- Task options: {json.dumps(card['task_options']) if card['task_options'] else 'none'}.
- Inputs (every axis dynamic: batch, long length from 2 to long_max_len, global tokens): {inputs}.
- Outputs: {', '.join(f'`{name}`' for name in card['signature']['outputs'])}.
- Versions: {versions}.

## How it was checked

Traced at {card['traced_length']} long tokens; then run in ONNX Runtime (CPU) beside the PyTorch
model (eager attention) on random batches of 2 rows, the second padded, with structure (sentence
and mention links, paragraphs, global tokens that see all). Largest absolute difference per output
(the export refuses a difference over {card['tolerance']:g}, relative to values over 1):

| long tokens | global tokens | rows | largest difference |
|---|---|---|---|
{rows}

Machine-readable: `{CARD_FILE}`.
"""
