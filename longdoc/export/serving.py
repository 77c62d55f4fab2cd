"""`--runtime` of `longdoc predict` and `longdoc ask`: which runtime runs the model, and loading it.

- torch: the PyTorch model (longdoc.model.inference.place_model: --device, --dtype, --attention);
- onnx: the folder's model.onnx in ONNX Runtime (longdoc.export.runtime), float32, CUDA's provider
  where onnxruntime-gpu is installed and the device is a CUDA one, else the CPU's;
- auto (the default): onnx where the folder holds an exported graph and ONNX Runtime is the faster
  runtime on the device (`FASTER_RUNTIME`, from the figures in docs/export.md), else torch.

The --runtime flag is the command line's (longdoc.commands.model_flags); this module imports nothing
heavy, since the command line reads RUNTIMES for --help.
"""

from pathlib import Path

from longdoc.errors import InputError
from longdoc.model_folder import ModelFolder

RUNTIMES = ("auto", "torch", "onnx")
# The faster runtime per device type, as docs/export.md measured it (a device it does not name: torch).
# None today: on the CPU the figures there have ONNX Runtime slower than PyTorch's compiled attention
# kernel (except on short inputs) and larger in memory; no GPU has been measured.
FASTER_RUNTIME: dict[str, str] = {}


def resolve_runtime(name: str, model_dir: Path, device, dtype=None, attention: str | None = None) -> str:
    """"torch" or "onnx" for `--runtime name` on a model folder and device; InputError for onnx where it
    cannot run (no graph in the folder, ONNX Runtime not installed, a precision other than float32,
    an attention backend named)."""
    from longdoc.export.runtime import ONNX_FILE, has_onnx_model

    if name not in RUNTIMES:
        raise InputError(f"--runtime {name}: use one of {', '.join(RUNTIMES)}")
    if name == "auto":
        usable = has_onnx_model(model_dir) and _onnxruntime_installed() and (dtype is None or _is_float32(dtype))
        return "onnx" if usable and attention is None and FASTER_RUNTIME.get(device.type) == "onnx" else "torch"
    if name == "onnx":
        if not _onnxruntime_installed():
            raise InputError('--runtime onnx needs ONNX Runtime: pip install "longdoc[onnx]"')
        if not has_onnx_model(model_dir):
            raise InputError(f"{model_dir}: no {ONNX_FILE} for --runtime onnx; export the model first: "
                             f"longdoc export --model {model_dir} --out DIR")
        if dtype is not None and not _is_float32(dtype):
            raise InputError(f"--runtime onnx runs the exported float32 graph; --dtype {str(dtype).removeprefix('torch.')} "
                             "is for --runtime torch")
        if attention is not None:
            raise InputError(f"--attention {attention} chooses PyTorch's attention backend; the ONNX graph has its own")
    return name


def load_task_model(folder: ModelFolder, task_name: str, device):
    """The exported `task_name` model in `folder` (its config as already read) on ONNX Runtime; a
    ModelFolderError saying what the folder holds otherwise (as TaskModel.from_pretrained says it)."""
    from longdoc.export.runtime import load_onnx_model
    from longdoc.model.task_model import check_task

    check_task(folder.path, folder.task, task_name)
    return load_onnx_model(folder.path, device, config=folder.config)


def _onnxruntime_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("onnxruntime") is not None


def _is_float32(dtype) -> bool:
    return str(dtype).removeprefix("torch.") == "float32"
