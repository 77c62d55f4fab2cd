"""An exported model served by ONNX Runtime, in the place of the PyTorch model: `OnnxModel`.

The decoders read a task model through three things, which `OnnxModel` has too: `config` (with
`task_options`), `forward_rows(rows, collate, batch_size)` (every task's `decode.predict`, through
`longdoc.data.prediction.decode_examples`; the same loop, `longdoc.model.task_model.run_rows`) and
a call `model(**batch)` whose result has the outputs as attributes (ask's span reader). So
`longdoc predict --runtime onnx` and `longdoc ask --runtime onnx` run the task's own decoding on the
graph's outputs: nothing of it is copied here.

A batch is fed by the graph's input names; an input of the graph the batch lacks gets its neutral
value (longdoc.export.signature.NEUTRAL), one the graph lacks is refused. The provider is CUDA's
where onnxruntime-gpu finds a GPU and a CUDA device is asked for, else the CPU's.

`load_onnx_model(DIR)` refuses, in one line naming the file, a folder without model.onnx, a graph
that is not readable, and a graph that does not match the folder's config.json (another model's
graph: its inputs, outputs, or the config it was exported with, field by field).
"""

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from longdoc.errors import InputError
from longdoc.export.signature import NEUTRAL

ONNX_FILE = "model.onnx"
CONFIG_KEY = "longdoc_config"  # the graph's metadata: the config it was exported with (JSON)
SIGNATURE_KEY = "longdoc_signature"  # and its signature (GraphSignature.to_json)
# Config fields that change no computation of the graph (a run-time choice, the decoders' settings).
UNTRACED_FIELDS = {"attention_backend", "task_options", "transformers_version", "architectures", "_name_or_path",
                   "torch_dtype", "dtype"}


class GraphOutputs(dict):
    """A graph's outputs by name, also as attributes (`output.start_logits`), as a task model's typed output."""

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _HookHandle:
    def __init__(self, hooks: list, hook):
        self.hooks, self.hook = hooks, hook

    def remove(self) -> None:
        self.hooks.remove(self.hook)


class OnnxModel:
    """An exported model folder run by ONNX Runtime (see the module docstring)."""

    def __init__(self, folder: Path, session, config, signature: dict):
        self.folder, self.session, self.config = folder, session, config
        self.input_names = tuple(spec["name"] for spec in signature["inputs"])
        self.input_dtypes = {spec["name"]: getattr(torch, spec["dtype"]) for spec in signature["inputs"]}
        self.output_names = tuple(signature["outputs"])
        self.kind = signature["kind"]
        self._hooks: list = []

    @property
    def task_options(self) -> dict[str, Any]:
        return self.config.task_options

    @property
    def device(self) -> torch.device:
        """Where the inputs go: the CPU (ONNX Runtime copies them to its provider's device)."""
        return torch.device("cpu")

    @property
    def provider(self) -> str:
        return self.session.get_providers()[0]

    def eval(self) -> "OnnxModel":
        return self

    def register_forward_hook(self, hook: Callable, *, with_kwargs: bool = False) -> _HookHandle:
        """`hook(model, args, kwargs, output)` (with_kwargs) or `hook(model, args, output)` after each
        call, as torch.nn.Module's forward hooks are called (the predict command counts windows so)."""
        entry = (hook, with_kwargs)
        self._hooks.append(entry)
        return _HookHandle(self._hooks, entry)

    def __call__(self, **batch: Tensor) -> GraphOutputs:
        unknown = sorted(set(batch) - set(self.input_names))
        if unknown:
            raise InputError(f"{self.folder / ONNX_FILE}: the graph takes no input {', '.join(unknown)} (it takes "
                             f"{', '.join(self.input_names)}); export the model again with this version of longdoc")
        feed = {name: self._input(name, batch) for name in self.input_names}
        results = self.session.run(list(self.output_names), feed)
        output = GraphOutputs({name: torch.from_numpy(value) for name, value in zip(self.output_names, results)})
        for hook, with_kwargs in list(self._hooks):
            hook(self, (), batch, output) if with_kwargs else hook(self, (), output)
        return output

    def _input(self, name: str, batch: dict[str, Tensor]):
        value = batch.get(name)
        if value is None:
            if name not in NEUTRAL:
                raise InputError(f"{self.folder / ONNX_FILE}: the batch has no {name}, which the graph needs")
            axis = "global" if name.startswith("global_") else "long"
            size = (batch["long_input_ids"].shape[0],
                    _length(batch, "global_input_ids") if axis == "global" else batch["long_input_ids"].shape[1])
            value = torch.full(size, NEUTRAL[name], dtype=self.input_dtypes[name])
        return value.detach().to("cpu", self.input_dtypes[name]).contiguous().numpy()

    def forward_rows(self, rows: Sequence[dict[str, Any]], collate: Callable, batch_size: int, progress: bool = True,
                     desc: str = "predicting") -> list[dict[str, Tensor]]:
        """The graph's outputs for each feature row, in the rows' order (as TaskModel.forward_rows)."""
        from longdoc.model.task_model import run_rows

        return run_rows(lambda batch: self(**batch), self.config, rows, collate, batch_size, progress, desc)


def _length(batch: dict[str, Tensor], name: str) -> int:
    value = batch.get(name)
    return 0 if value is None else value.shape[1]


def providers(device: torch.device | str | None = None) -> list[str]:
    """ONNX Runtime's execution providers for `device`: CUDA's first where asked for and installed
    (onnxruntime-gpu), the CPU's always."""
    import onnxruntime

    available = onnxruntime.get_available_providers()
    wanted = torch.device(device).type if device is not None else "cpu"
    chosen = ["CUDAExecutionProvider"] if wanted == "cuda" and "CUDAExecutionProvider" in available else []
    return chosen + ["CPUExecutionProvider"]


def has_onnx_model(folder: Path) -> bool:
    return (Path(folder) / ONNX_FILE).is_file()


def load_onnx_model(folder: str | Path, device: torch.device | str | None = None, threads: int | None = None,
                    config: Mapping[str, Any] | None = None) -> OnnxModel:
    """The exported model in `folder` on ONNX Runtime (see the module docstring for what is refused);
    `threads`: ONNX Runtime's threads within an operator (None: its default, one per core); `config`:
    the folder's config.json as already read (longdoc.model_folder.ModelFolder), None: read here."""
    import onnx
    import onnxruntime

    from longdoc.model.config import GlobalLocalConfig
    from longdoc.model.encoder_folder import describe_checkpoint

    folder = Path(folder)
    path = folder / ONNX_FILE
    found = describe_checkpoint(folder) if config is None else config  # (not a longdoc model: one line)
    if not path.is_file():
        raise InputError(f"{folder}: no {ONNX_FILE}; export the model first: longdoc export --model {folder} --out DIR")
    try:
        graph = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf's DecodeError, or an OSError
        raise InputError(f"{path}: not readable as an ONNX model ({str(error).splitlines()[0][:200]})") from None
    metadata = {entry.key: entry.value for entry in graph.metadata_props}
    if CONFIG_KEY not in metadata or SIGNATURE_KEY not in metadata:
        raise InputError(f"{path}: not exported by longdoc export (no {CONFIG_KEY} in its metadata)")
    signature = json.loads(metadata[SIGNATURE_KEY])
    _check_matches(path, graph, json.loads(metadata[CONFIG_KEY]), found, signature)
    try:
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(str(path), options, providers=providers(device))
    except Exception as error:  # onnxruntime's own exception types
        raise InputError(f"{path}: ONNX Runtime cannot load it ({str(error).splitlines()[0][:200]})") from None
    config = GlobalLocalConfig.from_dict(dict(found))
    config.task_options = found.get("task_options", {})
    return OnnxModel(folder, session, config, signature)


def _check_matches(path: Path, graph, exported: dict, config: dict, signature: dict) -> None:
    """InputError when the graph is not the one of the folder's config.json."""
    for name in sorted(set(exported) | set(config)):
        if name in UNTRACED_FIELDS:
            continue
        if exported.get(name) != config.get(name):
            raise InputError(f"{path}: does not match {path.parent / 'config.json'}: the graph was exported with "
                             f"{name} = {exported.get(name)!r}, the config has {config.get(name)!r}")
    graph_inputs = tuple(entry.name for entry in graph.graph.input)
    wanted = tuple(spec["name"] for spec in signature["inputs"])
    if graph_inputs != wanted:
        raise InputError(f"{path}: the graph's inputs ({', '.join(graph_inputs)}) are not those it was exported "
                         f"with ({', '.join(wanted)})")
    graph_outputs = tuple(entry.name for entry in graph.graph.output)
    if graph_outputs != tuple(signature["outputs"]):
        raise InputError(f"{path}: the graph's outputs ({', '.join(graph_outputs)}) are not those it was exported "
                         f"with ({', '.join(signature['outputs'])})")
