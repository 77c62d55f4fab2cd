"""The device check of the GPU attention, one part per subcommand; scripts/gpu_check.sh runs them all
on a CUDA GPU. Each part writes a Markdown table into the output folder (--out, default gpu-check/),
headed with the GPU's name, torch's and Triton's versions and the date.

  python scripts/gpu_check.py environment   what this machine has and lacks (exit 2: no CUDA GPU, or a
                                            module the check needs is missing)
  python scripts/gpu_check.py tests --junit FILE
                                            pytest's results on the GPU (its JUnit XML) as a table
  python scripts/gpu_check.py etc [--device cpu]
                                            the converted ETC fixtures (tests/fixtures/etc) on the GPU
                                            against CPU float32 on the same inputs: float32, bfloat16
                                            weights, and float32 weights under bfloat16 autocast; beside
                                            them transformers' BertModel with MiniLM's weights, where the
                                            package is installed (what the precisions cost a model we did
                                            not write); --device cpu: the same on the CPU
  python scripts/gpu_check.py softmax       one layer's two softmaxes (ETC-base sizes), the gpu against
                                            the eager backend: time and peak memory, forward and
                                            forward+backward
  python scripts/gpu_check.py tiles         the same with other tile sizes of the kernels (without
                                            talking heads): time, and the outputs' gap from eager's
  python scripts/gpu_check.py attention     one layer's attention at 8k and 16k tokens: the gpu and the eager
                                            backend against BERT's with SDPA, time and peak memory, and the
                                            kernels' score traffic per second
  python scripts/gpu_check.py tasks [--data DIR] [--tokenizer DIR]
                                            every task's `longdoc train` (2 steps) and `longdoc predict`,
                                            and `longdoc pretrain`, as a user runs them
  python scripts/gpu_check.py hotpotqa [--data DIR] [--tokenizer DIR]
                                            `longdoc train hotpotqa` at 4096 in ETC-base's shape against
                                            Longformer-base's training step

(`longdoc bench --device cuda` against Longformer, BigBird and BERT is the command itself:
scripts/gpu_check.sh runs it.) Every part but `etc --device cpu` refuses to run without a CUDA GPU
(one line, exit 2); the functions behind them take a device, so the tests run them on the CPU, the
gpu backend's kernels in its interpreter mode (tests/scripts/test_gpu_check.py).
"""

import argparse
import copy
import datetime
import importlib
import importlib.metadata
import os
import statistics
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:  # (longdoc is imported where a part runs, after the environment's check)
    from longdoc.model.config import GlobalLocalConfig

REPOSITORY = Path(__file__).resolve().parents[1]
ETC_FIXTURES = REPOSITORY / "tests" / "fixtures" / "etc"
DEFAULT_OUT = Path("gpu-check")
# Modules the check imports (module -> its distribution on PyPI), and those it does without.
REQUIRED = {"torch": "torch", "triton": "triton", "transformers": "transformers", "numpy": "numpy",
            "safetensors": "safetensors", "tqdm": "tqdm", "pytest": "pytest", "google_crc32c": "google-crc32c"}
OPTIONAL = {"xdist": ("pytest-xdist", "the tests run in one process"),
            "ninja": ("ninja", "the C++ kernels are not built: their tests skip")}
# How the model computes: its weights' dtype (`predict --bf16` and `ask --bf16` cast them to bfloat16),
# and whether bfloat16 autocast is on (what `longdoc train` runs: float32 weights, bfloat16 products);
# outputs within tolerance * (1 + |reference|) of CPU float32's, element by element.
PRECISIONS = {"float32": (torch.float32, False), "bfloat16": (torch.bfloat16, False),
              "bfloat16 autocast": (torch.float32, True)}
TOLERANCES = {"float32": 1e-4, "bfloat16": 1e-2, "bfloat16 autocast": 1e-2}
# The reference the precisions' cost is set beside: transformers' own BERT on this repository's README.
BERT_CASE = "transformers BertModel, all-MiniLM-L6-v2's weights, README.md's first 512 wordpieces"


class Refusal(Exception):
    """The check cannot run here: one line for the user, exit status 2."""


@dataclass(frozen=True)
class Machine:
    """What every table is headed with."""

    device: str
    torch: str
    triton: str
    date: str

    @classmethod
    def here(cls, device: torch.device) -> "Machine":
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
        return cls(name, torch.__version__, _version("triton") or "not installed", datetime.date.today().isoformat())


def _cpu_name() -> str:
    """The CPU's model name and the cores this process may use (Linux's /proc/cpuinfo)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "CPU")
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


@dataclass(frozen=True)
class Table:
    """One part's result: written as OUT/`name`.md."""

    name: str
    title: str
    columns: tuple[str, ...]
    rows: list[tuple]
    notes: str = ""

    def markdown(self, machine: Machine) -> str:
        lines = [f"# {self.title}", "",
                 f"{machine.device}; torch {machine.torch}, Triton {machine.triton}; {machine.date}", ""]
        if self.notes:
            lines += [self.notes, ""]
        lines += ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def write(self, machine: Machine, out: Path) -> Path:
        from longdoc.io import atomic_write_text

        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{self.name}.md"
        atomic_write_text(path, self.markdown(machine))
        return path


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if value and (abs(value) < 1e-2 or abs(value) >= 1e4) else f"{value:.4g}"
    return "-" if value is None else str(value).replace("|", "\\|")


def _version(module: str) -> str | None:
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise Refusal(f"no CUDA GPU here (torch {torch.__version__}): the check runs on one")


# --- environment ---------------------------------------------------------------------------------

def environment_table() -> Table:
    """Each module the check uses: its version, or missing (and what that costs)."""
    rows = []
    for module, distribution in REQUIRED.items():
        rows.append((module, _module_version(module, distribution) or "missing", "required"))
    for module, (distribution, without) in OPTIONAL.items():
        rows.append((module, _module_version(module, distribution) or "missing", f"optional: without it {without}"))
    return Table("environment", "What the check needs", ("module", "version", "role"), rows,
                 notes=f"Python {sys.version.split()[0]}; CUDA {torch.version.cuda}")


def _module_version(module: str, distribution: str) -> str | None:
    try:
        imported = importlib.import_module(module)
    except ImportError:
        return None
    return _version(distribution) or getattr(imported, "__version__", "installed")


def missing_modules(table: Table) -> list[str]:
    return [f"{module} ({REQUIRED[module]})" for module, version, role in table.rows
            if role == "required" and version == "missing"]


# --- tests -----------------------------------------------------------------------------------------

def tests_table(junit: Path) -> Table:
    """pytest's JUnit XML -> per test file: passed, failed, skipped; then each failure's first line."""
    counts: dict[str, Counter] = {}
    failures = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        where = case.get("classname", "").replace(".", "/") + ".py"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                message = (child.get("message") or "").splitlines()
                failures.append(f"- `{case.get('name')}` ({where}): {message[0] if message else child.tag}")
            elif child.tag == "skipped":
                outcome = "skipped"
        counts.setdefault(where, Counter())[outcome] += 1
    rows = [(where, c["passed"], c["failed"], c["skipped"]) for where, c in sorted(counts.items())]
    rows.append(("all", *(sum(c[outcome] for c in counts.values()) for outcome in ("passed", "failed", "skipped"))))
    notes = "Compiled kernels (TRITON_INTERPRET unset)." + ("\n\nFailures:\n" + "\n".join(failures) if failures else "")
    return Table("tests", "The attention's tests on the GPU", ("test file", "passed", "failed", "skipped"), rows, notes)


# --- the converted ETC fixtures ------------------------------------------------------------------

def etc_table(device: torch.device, cases: list[Path] | None = None, backends=("gpu", "eager"),
              precisions=tuple(PRECISIONS), bert: bool = True) -> Table:
    """Each converted ETC fixture's long and global outputs at real tokens on `device`, per precision
    (PRECISIONS) and backend, against the same model's on the CPU in float32 (the eager backend) on the
    same inputs; with `bert`, BERT_CASE's rows after them (bert_rows)."""
    import numpy as np

    from longdoc.convert.etc import LengthOptions, etcmodel_inputs, read_etc

    rows = []
    for case in cases or sorted(path for path in ETC_FIXTURES.iterdir() if path.is_dir()):
        model = read_etc(case, LengthOptions(long_max_len=64, global_max_len=8)).model.eval()
        valid = np.load(case / "outputs.npz")
        inputs = etcmodel_inputs(np.load(case / "inputs.npz"), valid["long_valid"], valid["global_valid"])
        real = [torch.from_numpy(valid[name].astype(bool)) for name in ("long_valid", "global_valid")]
        reference = _etc_outputs(model, "eager", inputs, real)
        for precision in precisions:
            dtype, autocast = PRECISIONS[precision]
            for backend in backends:
                outputs = _etc_outputs(copy.deepcopy(model).to(device, dtype), backend, inputs, real, autocast)
                rows.append(_compared(case.name, precision, backend, outputs, reference))
    if bert:
        rows += bert_rows(device, precisions)
    return Table("etc", f"Converted ETC fixtures: {'GPU' if device.type == 'cuda' else 'CPU'} against CPU float32", (
        "case", "precision", "backend", "max abs diff, long", "max abs diff, global", "largest diff / tolerance",
        "within"), rows, notes=(
        "Outputs at real tokens of each `tests/fixtures/etc` case converted with `read_etc` (long 64, global 8), "
        "on the device named above with the attention backend named, against the same model on the CPU in "
        "float32 (eager backend), same inputs. Precision: the weights' dtype (bfloat16: what `predict --bf16` "
        "runs), or float32 weights under bfloat16 autocast (what `longdoc train` runs). Tolerance per element: t * (1 + |CPU output|), t = "
        + ", ".join(f"{t:g} in {precision}" for precision, t in TOLERANCES.items())
        + "; the eager rows show what the precision alone costs, the last rows what it costs transformers' "
        "BertModel (MiniLM's weights, its own eager attention; against itself on the CPU in float32)."))


def bert_rows(device: torch.device, precisions=tuple(PRECISIONS)) -> list[tuple]:
    """BERT_CASE's last hidden states on `device` per precision against the same model's on the CPU in
    float32: none where the packaged MiniLM is not installed (the GPU machine lacks it)."""
    try:
        from longdoc.convert.pretrained import minilm_path

        path = minilm_path()
    except ImportError:
        return []
    from transformers import AutoTokenizer, BertModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # (its weight-loading bar would end up in the check's log)
    text = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    inputs = AutoTokenizer.from_pretrained(path)(text, truncation=True, max_length=512, return_tensors="pt")
    model = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    reference = _bert_output(model, inputs)
    rows = []
    for precision in precisions:
        dtype, autocast = PRECISIONS[precision]
        output = _bert_output(copy.deepcopy(model).to(device, dtype), inputs, autocast)
        rows.append(_compared(BERT_CASE, precision, "transformers (eager)", [output], [reference]))
    return rows


def _bert_output(model, inputs, autocast: bool = False) -> torch.Tensor:
    return _forward(model, inputs, autocast).last_hidden_state.float().cpu()


def _forward(model, inputs: dict, autocast: bool):
    """The model's output on `inputs` (moved to its device), without autograd, under bfloat16 autocast
    if `autocast`."""
    device = next(model.parameters()).device
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(**{name: tensor.to(device) for name, tensor in inputs.items()})


def _compared(case: str, precision: str, backend: str, outputs: list, reference: list) -> tuple:
    """A row of the etc table: each output's largest gap from its reference (long, then global: "-"
    for a model with one output), and the largest gap as a share of its tolerance."""
    gaps = [(got - want).abs() for got, want in zip(outputs, reference)]
    share = max(float((gap / (TOLERANCES[precision] * (1 + want.abs()))).max()) for gap, want in zip(gaps, reference))
    largest = [float(gap.max()) for gap in gaps] + [None] * (2 - len(gaps))
    return (case, precision, backend, *largest, share, "yes" if share <= 1 else "NO")


def _etc_outputs(model, backend: str, inputs: dict, real: list, autocast: bool = False) -> list:
    """The model's long and global outputs at real tokens, float32 on the CPU."""
    model.set_attention_backend(backend)
    output = _forward(model, inputs, autocast)
    return [hidden.float().cpu()[mask] for hidden, mask in zip(
        (output.long_hidden_state, output.global_hidden_state), real)]


# --- one layer's two softmaxes, timed ------------------------------------------------------------

def _etc_base():
    from longdoc.model.config import GlobalLocalConfig

    return GlobalLocalConfig.from_preset("base")


@dataclass(frozen=True)
class SoftmaxShape:
    """One layer's softmaxes: B inputs of the lengths and attention of `config` (ETC-base by default):
    L long and G global tokens (a sentence of L / G tokens per global token, hard g2l), h heads of d,
    local radius r, relative distance k."""

    batch: int = 8
    config: "GlobalLocalConfig" = field(default_factory=_etc_base)

    def describe(self) -> str:
        c = self.config
        return (f"B={self.batch}, L={c.long_max_len}, G={c.global_max_len}, h={c.num_attention_heads}, "
                f"d={c.head_size}, r={c.local_radius}, k={c.max_relative_distance}")


def layer_operands(shape: SoftmaxShape, device: torch.device, dtype: torch.dtype, residual: bool, talking: bool,
                   train: bool) -> tuple[list, list]:
    """The long and the global softmax's operands of one layer, random, with the masks and relative ids
    the model builds; and, if `train`, the gradients of their outputs for a backward."""
    from longdoc.model.backends.base import SoftmaxOperands
    from longdoc.model.inputs import check_and_collect
    from longdoc.model.side_inputs import build_side_inputs

    config, batch = shape.config, shape.batch
    length, globals_, head_size = config.long_max_len, config.global_max_len, config.head_size
    sentence = max(1, length // max(globals_, 1))
    ids = lambda count: torch.ones(batch, count, dtype=torch.long, device=device)  # noqa: E731
    structure = check_and_collect(config, dict(
        long_input_ids=ids(length), global_input_ids=ids(globals_),
        sentence_ids=(torch.arange(length, device=device) // sentence).clamp(max=globals_ - 1).expand(batch, -1)))
    side = build_side_inputs(structure, local_radius=config.local_radius,
                             max_relative_distance=config.max_relative_distance, hard_g2l=True, hard_l2g=False,
                             local_attention_within_paragraph=False, dtype=dtype)
    hidden, heads, vocabulary = config.hidden_size, config.num_attention_heads, config.relative_vocab_size

    def leaf(*size: int, scale: float = 1.0, identity: bool = False) -> torch.Tensor:
        values = scale * torch.randn(*size, device=device) + (torch.eye(*size, device=device) if identity else 0)
        return values.to(dtype).requires_grad_(train)

    long_qkv = leaf(batch, side.padded_length, 3 * hidden)
    global_qkv = leaf(batch, globals_, 3 * hidden)
    operands, gradients = [], []
    for own, other, block, mask, relative_ids in (
            (long_qkv, global_qkv, side.block_size, side.long_mask_bias, side.long_relative_ids),
            (global_qkv, long_qkv, 0, side.global_mask_bias, side.global_relative_ids)):
        scores = (batch, heads, *mask.shape[2:])
        mixes = [leaf(heads, heads, scale=0.1, identity=True) if talking else None for _ in range(2)]
        operands.append(SoftmaxOperands(
            own, other, heads, block, mask, relative_ids, leaf(vocabulary, heads, head_size, scale=0.5),
            leaf(vocabulary, heads, scale=0.5), side.relative_layout, side.links,
            leaf(*scores) if residual else None, *mixes, keep_summed=residual))
        if train:
            gradients.append((torch.randn(*own.shape[:2], hidden, device=device, dtype=dtype),
                              torch.randn(*scores, device=device, dtype=dtype) if residual else None))
    return operands, gradients


def softmax_step(backend_name: str, operands: list, gradients: list) -> Callable[[], None]:
    """One layer's two softmaxes on backend `backend_name`: a forward without autograd, or with the
    outputs' gradients a forward and a backward (the inputs' gradients then dropped)."""
    from longdoc.model.backends.resolution import BACKENDS

    backend_class = BACKENDS[backend_name]
    if not gradients:
        def forward() -> None:
            with torch.no_grad():
                backend = backend_class(reuse_buffers=True)
                for one in operands:
                    backend.attend(one)
        return forward

    def forward_backward() -> None:
        backend = backend_class()
        outputs, output_gradients = [], []
        for one, (grad_context, grad_summed) in zip(operands, gradients):
            result = backend.attend(one)
            outputs.append(result.context)
            output_gradients.append(grad_context)
            if result.summed is not None:
                outputs.append(result.summed)
                output_gradients.append(grad_summed)
        torch.autograd.backward(outputs, output_gradients)
        for one in operands:
            for tensor in (one.own, one.relative_key, one.relative_bias, one.talking_heads_pre, one.talking_heads_post):
                if tensor is not None:
                    tensor.grad = None
    return forward_backward


# The bytes of a pair's relative id (int32), which the heads share with its mask bias.
ID_BYTES = 4


def score_traffic(shape: "SoftmaxShape", residual: bool, train: bool, element: int = 2) -> tuple[int, float]:
    """(pairs, bytes) of one layer's two softmaxes: query-key pairs of every head, and the bytes the
    kernels move on them (forward, or forward and backward; docs/gpu/kernel.md), scores and mask of
    `element` bytes. Per pair and head: the pair's id and mask bias, shared by the heads; with
    residual attention the carried score read and the summed score written; in the backward the
    summed score and the gradient carried back read, and the summed scores' gradient written (the
    relative terms' gradient comes from it, with or without residual attention)."""
    c = shape.config
    block = c.local_radius + 1
    padded = -(-c.long_max_len // block) * block
    globals_, heads = c.global_max_len, c.num_attention_heads
    pairs = shape.batch * heads * (padded * (3 * block + globals_) + globals_ * (globals_ + padded))
    shared = (ID_BYTES + element) / heads
    forward = shared + (2 * element if residual else 0)
    backward = shared + (3 * element if residual else element)
    return pairs, pairs * (forward + (backward if train else 0))


def softmax_table(device: torch.device, shape: SoftmaxShape | None = None, dtype: torch.dtype = torch.bfloat16,
                  repeats: int = 10, warmups: int = 2, backends=("gpu", "eager")) -> Table:
    """Median seconds and peak memory of one layer's two softmaxes per (residual, talking heads,
    mode, backend), each backend's time as a ratio to the last one's (eager), and the gpu kernels'
    score traffic per second. `shape`: ETC-base's by default."""
    shape = shape or SoftmaxShape()
    rows = []
    for residual in (True, False):
        for talking in (False, True):
            for mode, train in (("forward", False), ("forward+backward", True)):
                measured = {backend: _measure(backend, shape, device, dtype, residual, talking, train, repeats,
                                              warmups) for backend in backends}
                baseline = measured[backends[-1]][0]
                _, traffic = score_traffic(shape, residual, train, element=dtype.itemsize)
                for backend, (seconds, peak_mib) in measured.items():
                    rows.append(("on" if residual else "off", "on" if talking else "off", mode, backend,
                                 seconds * 1e3, seconds / baseline, peak_mib,
                                 traffic / seconds / 1e12 if backend == "gpu" else None))
    return Table("softmax", "One layer's two softmaxes: gpu against eager backend", (
        "residual", "talking heads", "mode", "backend", "median ms", f"time / {backends[-1]}", "peak MiB",
        "score traffic TB/s"), rows,
        notes=(f"{shape.describe()}, {str(dtype).removeprefix('torch.')}; the long softmax's queries in blocks of "
               f"r + 1 over [3(r + 1) window keys | G globals], the global softmax's over [G | all long keys], hard "
               f"g2l. Median of {repeats} after {warmups} warm-up runs; forward without autograd, forward+backward "
               "with the outputs' gradients given; peak memory above the inputs. Score traffic: the bytes the "
               "gpu kernels move on the pairs' scores, ids and mask (score_traffic, docs/gpu/kernel.md) over the "
               "median time."))


def _measure(backend: str, shape: SoftmaxShape, device: torch.device, dtype: torch.dtype, residual: bool,
             talking: bool, train: bool, repeats: int, warmups: int) -> tuple[float, float | None]:
    """(median seconds, peak MiB) of softmax_step's step on fresh operands."""
    from longdoc.bench.memory import PeakMemory
    from longdoc.bench.worker import timed

    torch.manual_seed(0)
    operands, gradients = layer_operands(shape, device, dtype, residual, talking, train)
    # Without autograd the summed scores are written over the carried ones: each step gets a copy.
    step = lambda: softmax_step(backend, _fresh_carried(operands), gradients)  # noqa: E731
    for _ in range(warmups):  # (the first builds the kernels)
        timed(step(), device)
    seconds = statistics.median(timed(step(), device) for _ in range(repeats))
    prepared = step()
    with PeakMemory(str(device)) as peak:
        prepared()
    return seconds, peak.peak_mib


def _fresh_carried(operands: list) -> list:
    return [one if one.carried is None else replace(one, carried=one.carried.detach().clone().requires_grad_(
        one.carried.requires_grad)) for one in operands]


# --- one layer's attention at long lengths, against BERT's with SDPA -------------------------------

ATTENTION_LENGTHS = (8192, 16384)


def attention_table(device: torch.device, lengths=ATTENTION_LENGTHS, batch: int = 1,
                    dtype: torch.dtype = torch.bfloat16, repeats: int = 10, warmups: int = 2,
                    config: "GlobalLocalConfig | None" = None) -> Table:
    """One layer's attention at each of `lengths` long tokens (L / 16 globals, ETC-base's heads by
    default), forward and forward+backward: our two softmaxes (residual attention) on the gpu
    backend and on the eager one, and BERT's attention over the L tokens with torch's
    scaled_dot_product_attention (what BERT-SDPA runs): median time, its ratio to SDPA's, peak
    memory, and for ours the score traffic the kernels move (score_traffic) per second."""
    config = config or _etc_base()
    rows = []
    for length in lengths:
        sized = copy.deepcopy(config)
        sized.long_max_len, sized.global_max_len = length, max(1, length // 16)
        shape = SoftmaxShape(batch, sized)
        for mode, train in (("forward", False), ("forward+backward", True)):
            sdpa_seconds, sdpa_mib = _measure_sdpa(shape, device, dtype, train, repeats, warmups)
            _, traffic = score_traffic(shape, residual=True, train=train, element=dtype.itemsize)
            for backend in ("gpu", "eager"):
                seconds, mib = _measure(backend, shape, device, dtype, True, False, train, repeats, warmups)
                rows.append((length, mode, f"ours, {backend} backend", seconds * 1e3, seconds / sdpa_seconds, mib,
                             traffic / 1e9, traffic / seconds / 1e12))
            rows.append((length, mode, "BERT, SDPA", sdpa_seconds * 1e3, 1.0, sdpa_mib, None, None))
    return Table("attention", "One layer's attention: ours against BERT's with SDPA", (
        "L", "mode", "attention", "median ms", "time / SDPA", "peak MiB", "score traffic GB", "TB/s"), rows, notes=(
        f"B={batch}, G=L/16, h={config.num_attention_heads}, d={config.head_size}, r={config.local_radius}, "
        f"{str(dtype).removeprefix('torch.')}. Ours: the long and the global softmax of one layer with residual "
        "attention, no talking heads; BERT: torch.nn.functional.scaled_dot_product_attention over the L tokens "
        f"(h heads of d, no mask). Median of {repeats} after {warmups} warm-up runs; forward without autograd, "
        "forward+backward with the outputs' gradients given; peak memory above the inputs. Score traffic: the "
        "bytes the kernels move on the pairs' scores, ids and mask (docs/gpu/kernel.md), the same figure for both "
        "backends; TB/s: that over the median time."))


def _measure_sdpa(shape: "SoftmaxShape", device: torch.device, dtype: torch.dtype, train: bool, repeats: int,
                  warmups: int) -> tuple[float, float | None]:
    """(median seconds, peak MiB) of scaled_dot_product_attention over shape's L tokens."""
    from longdoc.bench.memory import PeakMemory
    from longdoc.bench.worker import timed

    c = shape.config
    torch.manual_seed(0)
    size = (shape.batch, c.num_attention_heads, c.long_max_len, c.head_size)
    query, key, value = (torch.randn(size, device=device, dtype=dtype).requires_grad_(train) for _ in range(3))
    gradient = torch.randn(size, device=device, dtype=dtype)

    def step() -> None:
        with torch.set_grad_enabled(train):
            context = torch.nn.functional.scaled_dot_product_attention(query, key, value)
            if train:
                context.backward(gradient)
                for tensor in (query, key, value):
                    tensor.grad = None

    for _ in range(warmups):
        timed(step, device)
    seconds = statistics.median(timed(step, device) for _ in range(repeats))
    with PeakMemory(str(device)) as peak:
        step()
    return seconds, peak.peak_mib


# --- the GPU kernels' tiles, tried ----------------------------------------------------------------

# (queries, keys per tile, warps, pipelining stages: None for Triton's default) tried for the kernels
# without talking heads, after today's choice (longdoc.model.kernels.gpu.softmax.tiles_for).
TILE_CANDIDATES = ((32, 32, 4, None), (32, 32, 8, 2), (64, 32, 4, None), (64, 32, 8, None), (32, 64, 8, None),
                   (64, 64, 8, None), (128, 32, 8, None), (128, 64, 8, None))


def tiles_table(device: torch.device, shape: SoftmaxShape | None = None, dtype: torch.dtype = torch.bfloat16,
                repeats: int = 10, warmups: int = 2, candidates=TILE_CANDIDATES) -> Table:
    """One layer's two softmaxes (residual attention, no talking heads) on the gpu backend with each
    candidate's tiles in place of today's: median time forward and forward+backward, and the largest
    difference of the outputs from the eager backend's (a tiling the kernels do not support shows
    there, or fails to build)."""
    from longdoc.model.kernels.gpu import softmax as gpu_softmax

    shape, chosen, rows = shape or SoftmaxShape(), gpu_softmax.tiles_for, []
    for candidate in (None, *candidates):
        if candidate is not None:
            gpu_softmax.tiles_for = _tiles_with(chosen, *candidate)
        try:
            gap = _gap_to_eager(shape, device, dtype)
            forward, train = (_measure("gpu", shape, device, dtype, True, False, mode, repeats, warmups)[0]
                              for mode in (False, True))
            rows.append((_tiles_label(candidate), forward * 1e3, train * 1e3, gap, ""))
        except Exception as error:  # (a tiling that does not build or run: its row says why)
            rows.append((_tiles_label(candidate), None, None, None,
                         f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"))
        finally:
            gpu_softmax.tiles_for = chosen
    return Table("tiles", "The GPU kernels' tiles: one layer's two softmaxes per tiling", (
        "tiles (queries x keys, warps, stages)", "forward ms", "forward+backward ms", "largest diff from eager",
        "failure"), rows, notes=(
        f"{shape.describe()}, {str(dtype).removeprefix('torch.')}, residual attention, no talking heads; the first "
        f"row is today's choice (softmax.tiles_for), the others replace it in both softmaxes. Median of {repeats} "
        f"after {warmups} warm-up runs (the first builds the kernels). Largest diff: the context's and summed "
        "scores' largest absolute difference from the eager backend's on the same inputs."))


def _tiles_with(chosen: Callable, block_m: int, block_n: int, num_warps: int, num_stages: int | None) -> Callable:
    def tiles_for(num_queries: int, width: int, window: int, head_size: int, heads: int, talking: bool,
                  dtype: torch.dtype):
        tiles = chosen(num_queries, width, window, head_size, heads, talking, dtype)
        return tiles if talking else replace(tiles, block_m=block_m, block_n=block_n, num_warps=num_warps,
                                             num_stages=num_stages)
    return tiles_for


def _tiles_label(candidate: tuple | None) -> str:
    if candidate is None:
        return "today's (tiles_for)"
    block_m, block_n, num_warps, num_stages = candidate
    return f"{block_m} x {block_n}, {num_warps} warps, {num_stages or 'default'} stages"


def _gap_to_eager(shape: SoftmaxShape, device: torch.device, dtype: torch.dtype) -> float:
    """The largest absolute difference of the gpu backend's outputs (context, summed scores) from the
    eager backend's, both softmaxes, on the same operands (forward without autograd)."""
    from longdoc.model.backends.resolution import BACKENDS

    torch.manual_seed(0)
    operands, _ = layer_operands(shape, device, dtype, residual=True, talking=False, train=False)
    outputs = {}
    for name in ("gpu", "eager"):
        with torch.no_grad():
            backend = BACKENDS[name]()
            outputs[name] = [tensor.float() for one in _fresh_carried(operands)
                             for result in [backend.attend(one)] for tensor in (result.context, result.summed)]
    return max(float((got - want).abs().max()) for got, want in zip(outputs["gpu"], outputs["eager"]))


# --- every task's commands on the GPU ------------------------------------------------------------

@dataclass(frozen=True)
class TaskRun:
    """A task's training and prediction files, under the data folder (../shared/data's layout)."""

    task: str
    train: str
    predict: str
    batch_size: int = 2


TASK_RUNS = (
    TaskRun("wikihop", "wikihop/wikihop_train.first22.json", "wikihop/wikihop_dev.first28.json"),
    TaskRun("hotpotqa", "hotpotqa/hotpot_dev_distractor_v1.first53.json", "hotpotqa/hotpot_dev_distractor_v1.first53.json"),
    TaskRun("multihop", "hotpotqa/hotpot_dev_distractor_v1.first53.json", "hotpotqa/hotpot_dev_distractor_v1.first53.json"),
    TaskRun("nq", "natural_questions/simplified-nq-train.sample2.jsonl",
            "natural_questions/simplified-nq-train.sample2.jsonl"),
    TaskRun("openkp", "openkp/openkp_readme_example.jsonl", "openkp/openkp_readme_example.jsonl", batch_size=1),
)
LONGDOC = (sys.executable, "-m", "longdoc.cli")


def random_encoder(folder: Path, tokenizer: Path, preset: str | None = None, **sizes) -> Path:
    """A randomly initialised encoder (a preset's shape, or `sizes`) with `tokenizer`'s files, saved in
    `folder` as `--init` reads it."""
    from longdoc import GlobalLocalConfig, GlobalLocalModel
    from longdoc.model_folder import read_tokenizer

    config = GlobalLocalConfig.from_preset(preset, **sizes) if preset else GlobalLocalConfig(**sizes)
    torch.manual_seed(0)
    GlobalLocalModel(config).save_pretrained(folder)
    read_tokenizer(tokenizer).save_pretrained(folder)
    return folder


def _command(arguments: list, log: Path) -> tuple[int, float, str]:
    """(exit status, seconds, the last line of its error output) of `longdoc ARGUMENTS`; all output in `log`."""
    import subprocess
    import time

    start = time.perf_counter()
    with log.open("w") as output:
        completed = subprocess.run([*LONGDOC, *map(str, arguments)], stdout=output, stderr=subprocess.STDOUT)
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return completed.returncode, time.perf_counter() - start, lines[-1][:200] if lines else ""


def task_row(run: TaskRun, data: Path, init: Path, work: Path, device: str) -> tuple:
    """Two training steps of `run.task` (`longdoc train`, on whatever device the engine picks), then
    `longdoc predict --device DEVICE` with the trained model: exit statuses, seconds, last lines."""
    out = work / run.task
    trained = _command(["train", run.task, "--init", init, "--train", data / run.train, "--out", out, "--max-steps", 2,
                        "--batch-size", run.batch_size, "--long-max-len", 512, "--global-max-len", 128, "--log-steps", 1,
                        "--save-steps", 2], work / f"{run.task}-train.log")
    predicted = (_command(["predict", run.task, "--model", out, "--data", data / run.predict, "--out",
                           work / f"{run.task}-predictions", "--device", device], work / f"{run.task}-predict.log")
                 if trained[0] == 0 else (None, None, "not run: training failed"))
    return (run.task, trained[0], trained[1], predicted[0], predicted[1],
            trained[2] if trained[0] else predicted[2] if predicted[0] else "")


def tasks_table(device: torch.device, data: Path, tokenizer: Path, work: Path, runs=TASK_RUNS) -> Table:
    """Every task's `train` (2 steps) and `predict`, and `pretrain` (2 steps), as a user runs them, in
    parallel processes; a tiny random encoder (2 layers, hidden 64) with `tokenizer` is the --init."""
    from concurrent.futures import ThreadPoolExecutor

    work.mkdir(parents=True, exist_ok=True)
    init = random_encoder(work / "init", tokenizer, vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=128, local_radius=8, long_max_len=512,
                          global_max_len=128)
    with ThreadPoolExecutor(len(runs) + 1) as pool:
        pretraining = pool.submit(_command, ["pretrain", "--init", init, "--train", data / "README.md", "--out",
                                             work / "pretrain", "--max-steps", 2, "--batch-size", 2, "--long-max-len",
                                             512, "--global-max-len", 128, "--log-steps", 1], work / "pretrain.log")
        rows = list(pool.map(lambda run: task_row(run, data, init, work, str(device)), runs))
        pretrained = pretraining.result()
    rows.append(("(pretrain)", pretrained[0], pretrained[1], None, None, pretrained[2] if pretrained[0] else ""))
    return Table("tasks", "Every task's train and predict, and pretrain, on the GPU", (
        "task", "train exit", "train s", "predict exit", "predict s", "last line of a failure"), rows, notes=(
        "`longdoc train TASK --init INIT --max-steps 2 --batch-size 2 --long-max-len 512 --global-max-len 128` (OpenKP's one page: batch 1) "
        "on the task's sample in ../shared/data (the engine picks the GPU), then `longdoc predict TASK --device cuda` with "
        "the trained model; `longdoc pretrain` 2 steps on data/README.md. INIT: a random encoder (2 layers, hidden "
        "64) with MiniLM's tokenizer. All six run at once (seconds include start-up, features and the kernels' "
        "compilation)."))


# --- a HotpotQA training step at 4096, ours against Longformer-base ----------------------------

HOTPOTQA_EXAMPLES = 90447  # HotpotQA's training set


def longformer_step_rate(device: torch.device, batch_size: int, length: int, question: int, steps: int,
                         warmups: int = 2, shape: str = "base") -> float:
    """Examples/s of a Longformer-base question-answering training step as transformers' users run it:
    AdamW, bf16 autocast on float32 weights where `longdoc train` autocasts (a GPU that supports it; float32
    on the CPU, as ours), window 512, global attention on the question's tokens."""
    from transformers import LongformerConfig, LongformerForQuestionAnswering

    from longdoc.bench.worker import timed
    from longdoc.model.config import PRESETS
    from longdoc.train.engine import bf16_by_default

    sizes = PRESETS[shape]
    torch.manual_seed(0)
    config = LongformerConfig(vocab_size=50265, hidden_size=sizes["hidden_size"],
                              num_hidden_layers=sizes["num_hidden_layers"],
                              num_attention_heads=sizes["num_attention_heads"],
                              intermediate_size=sizes["intermediate_size"], attention_window=512, pad_token_id=1,
                              max_position_embeddings=length + 2)
    model = LongformerForQuestionAnswering(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    ids = torch.randint(5, config.vocab_size, (batch_size, length), device=device)
    global_mask = torch.zeros_like(ids)
    global_mask[:, :question] = 1
    positions = torch.randint(question, length, (batch_size,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_by_default(device)):
            loss = model(input_ids=ids, global_attention_mask=global_mask, start_positions=positions,
                         end_positions=positions).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmups):
        step()
    return batch_size * steps / timed(lambda: [step() for _ in range(steps)], device)


def our_step_rate(run: Path) -> float:
    """Examples/s of the last line of a `longdoc train` run's log (the first lines hold the compilation)."""
    import json

    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    return [record for record in records if record.get("examples_per_second")][-1]["examples_per_second"]


def hotpotqa_table(device: torch.device, data: Path, tokenizer: Path, work: Path, batch_size: int = 8,
                   steps: int = 15, log_steps: int = 5, preset: str = "base", length: int = 4096) -> Table:
    """HotpotQA training at `length` wordpieces (4096) in a preset's shape (ETC-base): `longdoc train
    hotpotqa --config published` from a random encoder, and Longformer's step at the same batch and length."""
    work.mkdir(parents=True, exist_ok=True)
    init = random_encoder(work / preset, tokenizer, preset, long_max_len=length, global_max_len=256)
    command = ["train", "hotpotqa", "--config", "published", "--init", init, "--train",
               data / "hotpotqa/hotpot_dev_distractor_v1.first53.json", "--out", work / "run", "--max-steps", steps,
               "--batch-size", batch_size, "--effective-batch-size", batch_size, "--log-steps", log_steps,
               "--save-steps", 10 * steps, "--long-max-len", length]
    status, seconds, last = _command(command, work / "hotpotqa-train.log")
    ours = our_step_rate(work / "run") if status == 0 else None
    try:
        theirs = longformer_step_rate(device, batch_size, length, question=64, steps=max(3, steps // 3), shape=preset)
    except torch.OutOfMemoryError as error:
        theirs, last = None, f"{last} Longformer: {str(error).splitlines()[0]}"
    windows = _windows_per_example(work / "hotpotqa-train.log")
    rows = [(name, batch_size, rate, HOTPOTQA_EXAMPLES * windows / rate / 3600 if rate else None)
            for name, rate in (("longdoc train hotpotqa (residual)", ours), ("Longformer QA", theirs))]
    if ours and theirs:
        rows.append(("ours / Longformer", "", ours / theirs, None))
    return Table("hotpotqa", f"A HotpotQA training step at {length} wordpieces, {preset} shape", (
        "model", "batch", "examples/s", "hours per epoch (90,447 examples)"), rows, notes=(
        f"Ours: `longdoc train hotpotqa --config published --long-max-len {length}` (global 256, residual attention, "
        f"bf16 autocast, AdamW) from a random encoder of the {preset} preset, {steps} steps of batch {batch_size}, "
        f"the engine's logged rate of the last {log_steps} steps (exit status {status}, {seconds:.0f} s in all"
        + (f"; {last}" if status else "") + "). Longformer: LongformerForQuestionAnswering of the same shape at "
        "random init, window 512, the first 64 tokens global (the question), bf16 autocast on float32 weights, "
        "AdamW, as transformers' users train it, 2 warm-up steps. An epoch: 90,447 examples at "
        f"{windows:.2f} windows each (the sample's rows per example at this length) for both."))


def _windows_per_example(log: Path, examples: int = 53) -> float:
    """Training rows per example of the HotpotQA sample (53 examples), from `longdoc train`'s log line."""
    import re

    found = re.search(r"(\d+) training rows", log.read_text(errors="replace"))
    return int(found.group(1)) / examples if found else 1.0


# --- the command line ------------------------------------------------------------------------------

PARTS = ("environment", "tests", "etc", "softmax", "attention", "tiles", "tasks", "hotpotqa")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the folder of the tables (default gpu-check/)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="etc: where the model runs (default cuda; cpu: the precisions' cost on the CPU, eager "
                             "backend); every other part runs on a CUDA GPU")
    parser.add_argument("--junit", type=Path, help="tests: pytest's --junitxml file")
    parser.add_argument("--repeats", type=int, default=10, help="softmax, attention, tiles: timed runs per "
                        "measurement")
    parser.add_argument("--data", type=Path, default=REPOSITORY.parent / "shared" / "data",
                        help="tasks, hotpotqa: the data samples (default ../shared/data)")
    parser.add_argument("--tokenizer", type=Path, help="tasks, hotpotqa: a folder with MiniLM's tokenizer files "
                        "(default: the packaged MiniLM's)")
    parser.add_argument("--work", type=Path, help="tasks, hotpotqa: where the runs are written (default OUT/PART)")
    args = parser.parse_args(argv)
    try:
        if args.part == "environment":
            check_environment(args.out)
            return 0
        device = torch.device(args.device)
        if device.type == "cpu" and args.part != "etc":
            raise Refusal("--device cpu: only the etc part runs on the CPU")
        if device.type == "cuda":
            require_cuda()
        tables = _run(args, device)
    except Refusal as refusal:
        print(f"gpu_check {args.part}: {refusal}", file=sys.stderr)
        return 2
    machine = Machine.here(device)
    for table in tables:
        print(f"wrote {table.write(machine, args.out)}")
    return 0


def check_environment(out: Path) -> None:
    """The environment table (written where there is a GPU to head it with); Refusal if a required
    module is missing or there is no CUDA GPU."""
    table = environment_table()
    if torch.cuda.is_available():
        print(f"wrote {table.write(Machine.here(torch.device('cuda')), out)}")
    missing = missing_modules(table)
    if missing:
        raise Refusal(f"missing {', '.join(missing)}: put their wheels in a folder and run with WHEELS=that folder")
    require_cuda()


def _run(args, device: torch.device) -> list[Table]:
    if args.part == "tests":
        if args.junit is None or not args.junit.is_file():
            raise Refusal(f"--junit: pytest's JUnit XML file not found: {args.junit}")
        return [tests_table(args.junit)]
    if args.part == "etc":  # (on the CPU the gpu backend would need Triton's interpreter)
        return [etc_table(device, backends=("gpu", "eager") if device.type == "cuda" else ("eager",))]
    if args.part in ("tasks", "hotpotqa"):
        if args.tokenizer is None:
            from longdoc.convert.pretrained import minilm_path

            args.tokenizer = Path(minilm_path())
        work = args.work or args.out / args.part
        if args.part == "tasks":
            return [tasks_table(device, args.data, args.tokenizer, work)]
        return [hotpotqa_table(device, args.data, args.tokenizer, work)]
    if args.part == "attention":
        return [attention_table(device, repeats=args.repeats)]
    if args.part == "tiles":
        return [tiles_table(device, repeats=args.repeats)]
    return [softmax_table(device, repeats=args.repeats)]

if __name__ == "__main__":
    sys.exit(main())
