"""The flags that say where and how a loaded model runs, for every command that runs one: --device,
--dtype (--bf16) and --attention (predict, ask, serve, analyze; --attention alone: bench), and
--runtime (predict, ask), --compile (predict, bench; train's comes from its option). The library takes their values (longdoc.model.inference.resolve_placement,
place_model, check_attention; longdoc.export.serving.resolve_runtime), never the parser.

Nothing heavy is imported here: `longdoc --help` builds every parser.
"""

from longdoc.export.serving import RUNTIMES
from longdoc.model.backends import BACKEND_NAMES
from longdoc.model.inference import DEVICE_FORMS, DTYPE_NAMES


def add_placement_arguments(parser) -> None:
    """--device, --dtype and --bf16 (the same as --dtype bfloat16) and --attention on a command that predicts."""
    parser.add_argument("--device", metavar="DEV",
                        help=f"where the model runs: {DEVICE_FORMS} (default: cuda when torch finds a CUDA "
                             "device, else mps when it finds one, else cpu)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--dtype", choices=DTYPE_NAMES, help="the model's precision (default float32)")
    precision.add_argument("--bf16", dest="dtype", action="store_const", const="bfloat16",
                           help="the same as --dtype bfloat16 (on the CPU: where it has bfloat16 instructions, "
                                "AVX512_BF16 or AMX; refused elsewhere, where it is slower than float32)")
    add_attention_argument(parser)


def add_attention_argument(parser) -> None:
    """--attention: the attention backend (predict, ask, serve, analyze, bench)."""
    parser.add_argument("--attention", choices=BACKEND_NAMES,
                        help="how the attention is computed: auto (the C++ kernels on the CPU in float32 and "
                             "bfloat16, the GPU kernel on CUDA where available, else eager), eager (PyTorch ops), cpu, "
                             "gpu, dense (a float64 reference, slow); default: the model's own (attention_backend in "
                             "its config, normally auto)")


def add_runtime_argument(parser) -> None:
    """--runtime: PyTorch or the folder's exported graph in ONNX Runtime (predict, ask)."""
    parser.add_argument("--runtime", choices=RUNTIMES, default="auto",
                        help="what runs the model: torch (PyTorch), onnx (the folder's model.onnx, written by "
                             "`longdoc export`, in ONNX Runtime), or auto: onnx where the folder has one and it is "
                             "the faster runtime on the device (docs/export.md), else torch (default auto)")


def add_compile_argument(parser) -> None:
    """--compile: the model compiled with torch.compile (predict, bench)."""
    parser.add_argument("--compile", action="store_true",
                        help="compile the model with torch.compile (needs a C++ compiler on the CPU, Triton on CUDA; "
                             "the first batches take longer)")
