"""`longdoc bench --profile`: where one forward and one forward+backward spend their time, by part of
the model, for our encoder and for BERT with SDPA in the same process.

Each model runs one warm-up step, then `repeats` steps under torch.profiler. Every operator the
profiler records is given to the part of the model that called it: the innermost labelled module
around it (a projection, the feed-forward, a layer norm, the embeddings), or for our attention the
softmax it belongs to. The labels are record_function ranges opened by forward hooks and by a
wrapper of the attention backend's `attend`, both installed for the profiled steps only and removed
after them, so that a model that is not profiled runs without them. A backward operator is given to
the part whose forward operator made its autograd node (the two share the node's sequence number).
What no label covers (residual adds, masks, relative terms, reshapes, Python) is "glue". Each
operator's self time counts once, so the parts sum to the profiled step's time (on the profiler's
clock: the step itself, without the profiler's start and stop).
"""

import contextlib
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from typing import Iterator

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from longdoc.bench.models import build_runner
from longdoc.bench.settings import BERT, FORWARD, MODES, REFERENCE, BenchSettings, Job, Variant
from longdoc.bench.worker import step_for
from longdoc.cpu_memory import configure_allocator

EMBEDDINGS = "embeddings"
PROJECTIONS = "projections"
LONG_SOFTMAX = "long softmax (l2l, l2g)"
GLOBAL_SOFTMAX = "global softmax (g2g, g2l)"
SDPA = "attention (SDPA)"
FEED_FORWARD = "feed-forward"
LAYER_NORMS = "layer norms"
GLUE = "glue"
PARTS = (EMBEDDINGS, PROJECTIONS, LONG_SOFTMAX, GLOBAL_SOFTMAX, SDPA, FEED_FORWARD, LAYER_NORMS, GLUE)
_LABEL_PREFIX = "part: "
_STEP_LABEL = "profiled step"
# Modules whose whole forward is one part, by class name (ours, then transformers' BERT).
_MODULE_PARTS = {
    "GlobalLocalEmbeddings": EMBEDDINGS, "BertEmbeddings": EMBEDDINGS,
    "FeedForward": FEED_FORWARD, "BertIntermediate": FEED_FORWARD, "BertOutput": FEED_FORWARD,
    "LayerNorm": LAYER_NORMS,
}
# Operators that are a part by themselves (BERT's attention is one call).
_OPERATOR_PARTS = {"aten::scaled_dot_product_attention": SDPA}
BACKWARD_PREFIX = "autograd::engine::evaluate_function"


@dataclass(frozen=True)
class StepProfile:
    """One model's step in one mode: the time of the fastest of its profiled steps (milliseconds) and
    that step's time by part (every part in PARTS, 0 where the model has none), and of that the time
    of the backward's operators by part (all 0 in a forward)."""

    model: str
    mode: str
    total_ms: float
    parts_ms: dict
    backward_ms: dict

    def share(self, part: str) -> float:
        return self.parts_ms[part] / self.total_ms if self.total_ms else 0.0


def module_parts(model: nn.Module) -> dict[str, str]:
    """{qualified module name: part} for the modules of `model` that get a label: those of
    _MODULE_PARTS, and the linear layers outside them (the attention's projections)."""
    parts = {name: _MODULE_PARTS[type(module).__name__] for name, module in model.named_modules()
             if type(module).__name__ in _MODULE_PARTS}
    for name, module in model.named_modules():
        inside_labelled = any(name.startswith(labelled + ".") for labelled in parts)
        if isinstance(module, nn.Linear) and not inside_labelled:
            parts[name] = PROJECTIONS
    return parts


@contextlib.contextmanager
def labelled(model: nn.Module):
    """Inside: every labelled module's forward (module_parts) and every call of our attention
    backend's attend run in a record_function range named after their part. Outside: neither."""
    handles, ranges, patched = [], [], []
    modules = dict(model.named_modules())
    for name, part in module_parts(model).items():
        def enter(module, args, part=part):
            ranges.append(record_function(_LABEL_PREFIX + part).__enter__())

        def leave(module, args, output):
            ranges.pop().__exit__(None, None, None)

        handles.append(modules[name].register_forward_pre_hook(enter))
        handles.append(modules[name].register_forward_hook(leave))
    backend = _attention_backend(model)
    if backend is not None:
        attend = backend.attend

        def labelled_attend(self, operands):
            with record_function(_LABEL_PREFIX + (LONG_SOFTMAX if operands.window_block else GLOBAL_SOFTMAX)):
                return attend(self, operands)

        backend.attend = labelled_attend
        patched.append((backend, attend))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for backend, attend in patched:
            backend.attend = attend


def _attention_backend(model: nn.Module):
    """The attention backend class our encoder resolves to here, or None for a peer."""
    config = getattr(model, "config", None)
    if getattr(config, "attention_backend", None) is None:
        return None
    from longdoc.model.backends.resolution import resolve_backend

    parameter = next(model.parameters())
    return resolve_backend(config.attention_backend, parameter.device, parameter.dtype)


def _label_of(event) -> str | None:
    if event.name.startswith(_LABEL_PREFIX):
        return event.name[len(_LABEL_PREFIX):]
    return _OPERATOR_PARTS.get(event.name)


def parts_of(events) -> tuple[float, dict[str, float], dict[str, float]]:
    """The profiled step in `events` (a profiler's events): its milliseconds, those by part, and the
    backward's share of each part: each event's self time goes to its innermost label, a backward's
    events to the part of the forward operator that made their node, the rest to glue."""
    step = next(event for event in events if event.name == _STEP_LABEL)
    inside = [event for event in events if event.time_range.start >= step.time_range.start
              and event.time_range.end <= step.time_range.end and event.thread == step.thread]
    part_of = {}

    def resolve(event) -> str | None:
        """The part of `event` from its own label or its ancestors', None in the glue."""
        if id(event) in part_of:
            return part_of[id(event)]
        label = _label_of(event)
        if label is None and event.cpu_parent is not None:
            label = resolve(event.cpu_parent)
        part_of[id(event)] = label
        return label

    # The part of each autograd node, from the forward operator that made it: the last operator
    # recorded with the node's sequence number (the ops before it that saw the same number made none).
    node_parts, backward_parts = {}, {}
    for event in sorted(inside, key=lambda event: event.time_range.start):
        if event.sequence_nr >= 0 and not event.name.startswith(BACKWARD_PREFIX) and not _in_backward(event):
            node_parts[event.sequence_nr] = resolve(event)
    for event in inside:
        if event.name.startswith(BACKWARD_PREFIX):
            backward_parts[id(event)] = node_parts.get(event.sequence_nr)
    totals, backward_totals = defaultdict(float), defaultdict(float)
    for event in inside:
        part = _label_of(event)
        ancestor = event
        while part is None and ancestor is not None:
            part = backward_parts.get(id(ancestor)) if id(ancestor) in backward_parts else _label_of(ancestor)
            ancestor = ancestor.cpu_parent
        totals[part or GLUE] += event.self_cpu_time_total / 1e3
        if event.name.startswith(BACKWARD_PREFIX) or _in_backward(event):
            backward_totals[part or GLUE] += event.self_cpu_time_total / 1e3
    return (step.cpu_time_total / 1e3, {part: totals.get(part, 0.0) for part in PARTS},
            {part: backward_totals.get(part, 0.0) for part in PARTS})


def _in_backward(event) -> bool:
    ancestor = event.cpu_parent
    while ancestor is not None:
        if ancestor.name.startswith(BACKWARD_PREFIX):
            return True
        ancestor = ancestor.cpu_parent
    return False


@contextlib.contextmanager
def _without_profiler_trace_lines() -> Iterator[None]:
    """What the process writes to stderr meanwhile, less the lines torch's profiler library (Kineto)
    writes there itself as it starts and stops ("USDT:... profiler_start"), which no setting turns
    off: the table's reader needs none of them."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith("USDT:")]
            sys.stderr.write("".join(kept))


def profile_step(runner, mode: str) -> tuple[float, dict[str, float], dict[str, float]]:
    """One step of `runner` in `mode` under the profiler, labelled: (its ms, its ms by part, its
    backward's ms by part)."""
    step = step_for(runner, mode)
    profiler = profile(activities=[ProfilerActivity.CPU])
    with labelled(runner.model):
        with _without_profiler_trace_lines():
            profiler.start()
        try:
            with record_function(_STEP_LABEL):
                step()
        finally:
            with _without_profiler_trace_lines():
                profiler.stop()
    return parts_of(profiler.events())


def run_profile(settings: BenchSettings, length: int, variants: tuple[Variant, ...]) -> list[StepProfile]:
    """Each of `variants` at `length` tokens in both modes: one warm-up step, then settings.repeats
    profiled steps, the fastest kept, in this process (each peer reading the same L tokens as ours, as in --plain)."""
    configure_allocator()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    settings = replace(settings, plain_process=True)
    profiles = []
    for variant in variants:
        runner = build_runner(Job(settings, variant, length, FORWARD))
        for mode in MODES:
            step_for(runner, mode)()
            # The fastest, not the median: under the profiler the heap grows for several steps (its
            # own records take memory between the steps' tensors), and the kernel zeroes the new pages
            # inside whichever operator first touches them. Measured on an Intel Xeon, 2 threads,
            # ours(res) at 4096: resident memory 2.7 -> 4.6 GB over six profiled forward+backward steps
            # (2.7 GB throughout without the profiler), 30,000-225,000 minor faults and 0.5-3.8 s of
            # system time in five of them, whose 2.6-4.0 s (against 2.0 s) went mostly to the long
            # softmax (1.2-2.7 s against 0.72 s in the steps without faults).
            steps = [profile_step(runner, mode) for _ in range(settings.repeats)]
            profiles.append(StepProfile(variant.name, mode, *min(steps, key=lambda step: step[0])))
        del runner
    return profiles


def profiled_variants(settings: BenchSettings) -> tuple[Variant, ...]:
    """Ours (the reference variant) and, unless the run has no peers, BERT with SDPA."""
    bert = tuple(variant for variant in settings.variants if variant.family == BERT)
    return (REFERENCE,) + bert[:1]


def describe_machine(settings: BenchSettings) -> str:
    """The CPU, the threads, the instruction set torch dispatches to and our linear layers' GEMM."""
    from longdoc.bench.run import machine_info
    from longdoc.model import linear

    info = machine_info(settings, settings.threads or torch.get_num_threads())
    vector_code = f"; {info['vector_code']}" if info["vector_code"] else ""
    return (f"{info['cpu']}, {info['threads']} threads, torch kernels at {torch.backends.cpu.get_cpu_capability()}, "
            f"our linear layers on {linear.backend()}{vector_code}")


def render_profile(profiles: list[StepProfile], length: int, settings: BenchSettings, machine: str) -> str:
    """A part per line, a column per (model, mode): milliseconds and share of the step."""
    columns = [f"{p.model} {'fwd' if p.mode == FORWARD else 'fwd+bwd'}" for p in profiles]
    width = max(22, *(len(column) + 2 for column in columns))
    used = [part for part in PARTS if any(p.parts_ms[part] > 0 for p in profiles)]
    lines = [
        f"profile at {length} long tokens, {settings.shape.num_layers} layers, hidden {settings.shape.hidden_size}; "
        f"the fastest of {settings.repeats} profiled steps after a warm-up; {machine}",
        "ms (share of the step); the parts sum to the step's time under the profiler",
        "part".ljust(26) + "".join(column.rjust(width) for column in columns),
    ]
    for part in used:
        cells = [f"{p.parts_ms[part]:.0f} ({100 * p.share(part):.0f}%)" for p in profiles]
        lines.append(part.ljust(26) + "".join(cell.rjust(width) for cell in cells))
    lines.append("total".ljust(26) + "".join(f"{p.total_ms:.0f}".rjust(width) for p in profiles))
    return "\n".join(lines)


def profile_json(profiles: list[StepProfile], length: int, settings: BenchSettings, machine: str) -> dict:
    return {"length": length, "repeats": settings.repeats, "machine": machine,
            "steps": [asdict(profile_) for profile_ in profiles]}
