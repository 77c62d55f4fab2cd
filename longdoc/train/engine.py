"""The one training loop: every `longdoc train TASK`, `scripts/train_<task>.py` and `longdoc pretrain` runs here.

A short loop of our own on plain torch, in the manner of nanoGPT's train.py, rather than
accelerate or transformers' Trainer: every piece of state that decides the next step (weights,
AdamW moments, the schedule's position, each process's RNG streams, the position in the data) is
saved and restored explicitly, so a resumed run ends bit for bit where an uninterrupted one does on
CPU, and the same lines run one process, DDP or FSDP2 under torchrun (torch's own stack).

The job interface (what a caller builds; see `longdoc.train.finetune.build_task_job` for a task,
and `longdoc.train.pretraining.build_pretraining_job` for continued pretraining):

    TrainingJob(
        name,        str: what is trained (the task name); recorded in checkpoints, and an --out
                     holding another name's checkpoint is refused
        model,       nn.Module, built identically on every process (seed first); model(**batch)
                     returns an output with `.loss` (a scalar mean over the batch)
        rows,        Sequence: the training rows (any objects; the same list on every process)
        collate,     rows -> dict[str, Tensor], a batch for model(**batch) (bind the pad id yourself)
        out_dir,     Path: checkpoints/, train_log.jsonl, train_options.json (the options), eval/
                     and the final model go here
        options,     TrainingOptions: the resolved options (longdoc.train.options: max_steps,
                     epochs, batch_size, grad_accum, lr, warmup_ratio, weight_decay, max_grad_norm,
                     seed, eval_steps, save_steps, keep_last, log_steps, gradient_checkpointing, bf16,
                     fsdp)
        task_options, optional record: a task's options, recorded beside the engine's in
                     train_options.json and the checkpoints
        evaluate,    optional (model, folder) -> dict[str, float]: called in eval mode under
                     no_grad every `eval_steps` and at the end, on rank 0 (on every rank under FSDP,
                     where a forward needs all shards; only rank 0's folder is kept); writes its
                     prediction files into `folder` (out_dir itself at the end, out_dir/eval/step-N
                     before) and returns the metrics
        save_model,  optional (model, folder, state_dict) -> None: writes the final model; default
                     model.save_pretrained(folder, state_dict=state_dict) (safetensors)
        identity,    optional dict that must match to resume (default: model class and config shape)
        logged_outputs, optional names of 0-dim fields of the model's output (e.g. the parts of a
                     loss and their accuracies), each logged beside the loss every `log_steps`: its
                     mean over the window's micro-batches, of all processes, where it is not None
        progress,    whether the main process shows the training progress bar (default True)
    )
    run_training(job) -> TrainingResult(step, total_steps, metrics, interrupted, checkpoint)

Data order: each epoch is a permutation of the rows drawn from `seed + epoch`; optimizer step s
takes the next `batch_size x grad_accum x processes` rows of it, the process of rank r taking
micro-batch k's slice `(k x processes + r) x batch_size ...`. The effective batch, the rows each
step sees and the averaged gradient are therefore the same for one process with accumulation K x N
as for N processes with accumulation K. The rest of an epoch too short for a full step is skipped.
The position in the data is the step count: a checkpoint's step says where to continue.

Schedule: AdamW (no decay on biases and norm weights, i.e. tensors of one dimension), linear
warm-up over `warmup_ratio` of the steps, linear decay to zero (BERT's schedule), gradient norm
clipped to `max_grad_norm`.
"""

import contextlib
import json
import math
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from longdoc.errors import DeviceMemoryError, InputError, OptionError
from longdoc.io import atomic_write_json, atomic_write_text
from longdoc.model.inputs import batch_shape, check_encoder_inputs, checked_batches
from longdoc.train import checkpoints as ckpt
from longdoc.distributed import ProcessInfo, barrier, gather_objects, start_processes, stop_processes
from longdoc.train.options import RESOLVED_OPTIONS_FILE, TrainingOptions, recorded_options

TRAIN_LOG_FILE = "train_log.jsonl"
TENSORBOARD_FOLDER = "runs"  # `tensorboard --logdir OUT/runs`, where transformers' Trainer writes its events
EVAL_FOLDER = "eval"
# Config fields that decide the weights' shapes and the computation they were trained for.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "relative_vocab_size", "position_embedding_type", "talking_heads", "global_feature_size",
                "residual_attention", "local_radius")
# What lowers the memory a batch takes (DeviceMemoryError; options named by field).
TRAINING_REMEDIES = ("lower {batch_size} (raise {grad_accum} as much to keep the effective batch), lower {long_max_len}, "
                     "or turn on {gradient_checkpointing} or {bf16}")
EVALUATION_REMEDIES = "lower {eval_batch_size} (default: {batch_size})"
# Options that, changed between a run and its resumption, would make the resumed run another run.
_TRAJECTORY_OPTIONS = ("lr", "warmup_ratio", "weight_decay", "max_grad_norm", "seed", "gradient_checkpointing",
                       "bf16")


@dataclass
class TrainingJob:
    """What to train and where (see the module docstring for each field)."""

    name: str
    model: nn.Module
    rows: Sequence[Any]
    collate: Callable[[list], dict[str, torch.Tensor]]
    out_dir: Path
    options: TrainingOptions
    evaluate: Callable[[nn.Module, Path], dict[str, float]] | None = None
    save_model: Callable[[nn.Module, Path, dict], None] | None = None
    identity: dict[str, Any] | None = None
    logged_outputs: Sequence[str] = ()
    progress: bool = True
    task_options: Any = None

    def recorded_options(self) -> dict[str, Any]:
        """The options train_options.json and the checkpoints hold."""
        return recorded_options(self.options, self.task_options)


@dataclass
class TrainingResult:
    step: int
    total_steps: int
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation's (the final one)
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM, with a checkpoint
    checkpoint: Path | None = None  # the last checkpoint written
    is_main: bool = True  # rank 0 (writes the run's files)


def model_identity(name: str, model: nn.Module) -> dict[str, Any]:
    config = getattr(model, "config", None)
    shape = {key: getattr(config, key) for key in SHAPE_FIELDS if hasattr(config, key)}
    if not shape:  # not a transformers model: the parameters' names and shapes are its shape
        shape = {key: list(value.shape) for key, value in model.state_dict().items()}
    return {"task": name, "model": type(model).__name__, "shape": shape}


def _describe_shape(shape: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in shape.items())


def check_resumable(out_dir: Path, found: Mapping[str, Any], wanted: Mapping[str, Any], where: Path) -> None:
    """Refuse to resume a checkpoint (or a final model) of another task or another model shape."""
    if found.get("task") != wanted["task"]:
        raise OptionError(
            "{out} {out_dir} holds a {found!r} checkpoint ({where}), not a {wanted!r} one; give another {out}, or "
            "remove that folder to start over", out_dir=out_dir, found=found.get("task"), where=where,
            wanted=wanted["task"])
    if found.get("shape") != wanted["shape"] or found.get("model") != wanted["model"]:
        differing = {key for key in set(found.get("shape", {})) | set(wanted["shape"])
                     if found.get("shape", {}).get(key) != wanted["shape"].get(key)}
        theirs = {key: found.get("shape", {}).get(key) for key in sorted(differing)}
        ours = {key: wanted["shape"].get(key) for key in sorted(differing)}
        raise OptionError(
            "{out} {out_dir} holds a checkpoint of another model shape ({where}: {model} with {theirs}); this run "
            "builds {ours_model} with {ours}; give another {out}, or the {init} and model options of that run",
            out_dir=out_dir, where=where, model=found.get("model"), theirs=_describe_shape(theirs),
            ours_model=wanted["model"], ours=_describe_shape(ours))


def _check_final_model(out_dir: Path, name: str) -> None:
    """An output folder without checkpoints may still hold another task's final model: refuse to overwrite it."""
    config_path = out_dir / "config.json"
    if not config_path.is_file():
        return
    try:
        task = json.loads(config_path.read_text(encoding="utf-8")).get("task")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return
    if task and task != name:
        raise OptionError("{out} {out_dir} holds a trained {task!r} model ({config_path}), not a {name!r} one; "
                          "give another {out}", out_dir=out_dir, task=task, config_path=config_path, name=name)


class _StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM asks the loop to stop after the current step, with a checkpoint;
    a second Ctrl-C stops at once."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handlers, no clean stop
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\nlongdoc train: {signal.Signals(signum).name} received: stopping after this step with a "
              "checkpoint (Ctrl-C again to stop at once)", file=sys.stderr)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    kind, keys, position, has_gauss, cached = numpy.random.get_state()
    state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), position, has_gauss, cached)
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        kind, keys, position, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), position, has_gauss, cached))


def _as_tuples(value):
    # torch.save keeps tuples, but be strict: random.setstate wants tuples all the way down.
    return tuple(_as_tuples(item) for item in value) if isinstance(value, (list, tuple)) else value


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


def build_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; no decay on tensors of one dimension (biases, norm weights)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)


def linear_schedule(optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_steps`, then linear decay to zero at `total_steps` (BERT's schedule)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_step(
    model: nn.Module, batch_for: Callable[[int], Mapping[str, Any]], accumulation: int, optimizer, scheduler,
    max_grad_norm: float, autocast: Callable = contextlib.nullcontext, no_sync: Callable | None = None,
    on_output: Callable[[Any], None] | None = None,
) -> tuple[torch.Tensor, float]:
    """One optimizer step: forward and backward of `accumulation` micro-batches, then the update.

    Each micro-batch's loss is divided by `accumulation`; then come gradient clipping, AdamW and the
    schedule, and the gradients are freed.

    Args:
        model: the model trained (wrapped by DDP or FSDP under torchrun); `model(**batch)` returns
            an output with `.loss`.
        batch_for: micro-batch k's batch, on the model's device, for k in 0 .. accumulation - 1.
        accumulation: micro-batches whose gradients add up to this step's.
        optimizer: the AdamW optimizer.
        scheduler: the learning-rate schedule, stepped once.
        max_grad_norm: the gradient norm is clipped to it; 0 or less: no clipping.
        autocast: the context each forward runs in (bf16 autocast, or none).
        no_sync: DDP's, skips the gradient all-reduce on all but the last micro-batch; None: every
            backward syncs (one process, FSDP).
        on_output: sees each micro-batch's model output; None: nothing does.

    Returns:
        The step's loss (detached, float32: the mean of its micro-batches' losses) and the learning
        rate it used.

    Raises:
        DeviceMemoryError: a micro-batch the device has no memory for, naming its shape.
    """
    step_loss = None
    for micro in range(accumulation):
        batch = batch_for(micro)
        skip_sync = no_sync if no_sync is not None and micro < accumulation - 1 else contextlib.nullcontext
        try:
            with skip_sync():
                with autocast():
                    output = model(**batch)
                    loss = output.loss / accumulation
                loss.backward()
        except torch.OutOfMemoryError:
            raise DeviceMemoryError("training on", *batch_shape(batch), TRAINING_REMEDIES) from None
        if on_output is not None:
            on_output(output)
        step_loss = loss.detach().float() if step_loss is None else step_loss + loss.detach().float()
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    learning_rate = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss, learning_rate


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each layer's activations in backward (transformers' switch; non-reentrant
    checkpointing, which works under DDP/FSDP and with inputs that need no gradient)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 names it so
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _wrap(model: nn.Module, info: ProcessInfo, fsdp: bool) -> nn.Module:
    """DDP (replicated) or FSDP2 (sharded) across processes; the model itself in one process."""
    if not info.distributed:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        from transformers.modeling_layers import GradientCheckpointingLayer

        # One shard unit per transformer layer (gathered just before its use), then the rest.
        for module in model.modules():
            if isinstance(module, GradientCheckpointingLayer):
                fully_shard(module)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    # find_unused_parameters: a batch may leave a head out of the loss (no span labels in it).
    return DistributedDataParallel(model, device_ids=[info.local_rank] if info.device.type == "cuda" else None,
                                   find_unused_parameters=True)


def _full_state(model: nn.Module, wrapped: nn.Module, fsdp: bool, info: ProcessInfo) -> dict[str, torch.Tensor]:
    """Every weight, whole, on CPU (on rank 0; under FSDP every process takes part in gathering)."""
    if fsdp and info.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.state_dict()


def _optimizer_state(wrapped: nn.Module, optimizer, fsdp: bool, info: ProcessInfo) -> dict:
    if fsdp and info.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(wrapped, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def _load_optimizer_state(wrapped: nn.Module, optimizer, state: dict, fsdp: bool, info: ProcessInfo) -> None:
    if fsdp and info.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(wrapped, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)


def _save_final_model(job: TrainingJob, model: nn.Module, state_dict: dict) -> None:
    """The final model into out_dir, file by file atomically (longdoc.model_folder.write_into)."""
    from longdoc.model_folder import save_model, write_into

    def write(folder: Path) -> None:
        if job.save_model is None:
            save_model(folder, model, state_dict=state_dict)
        else:
            job.save_model(model, folder, state_dict)

    write_into(job.out_dir, write)


class _TrainLog:
    """train_log.jsonl, one JSON object per line, written by rank 0; on resume the lines past the
    checkpoint's step are dropped (and the final evaluation's, which every run ending does again),
    so the log reads as one run. With `report_to` "tensorboard", each line's numbers also go to
    TensorBoard event files in `OUT/runs` (TENSORBOARD_FOLDER), under train/NAME (loss, lr,
    examples_per_second, epoch, a job's logged outputs) and eval/METRIC, at the line's step; on
    resume, the events past the checkpoint's step are hidden (SummaryWriter's purge_step)."""

    def __init__(self, path: Path, resumed_step: int, total_steps: int, enabled: bool, report_to: str | None = None):
        self.path, self.enabled, self.writer = path, enabled, None
        if not enabled:
            return
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(path.parent / TENSORBOARD_FOLDER), purge_step=resumed_step + 1
                                        if resumed_step else None)
        kept = []
        if resumed_step and path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill
                    continue
                step = record.get("step", 0)
                if step < resumed_step or (step == resumed_step and not (step == total_steps and "eval" in record)):
                    kept.append(line)
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            group, values = ("eval", record["eval"]) if "eval" in record else ("train", record)
            for name, value in values.items():
                if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{group}/{name}", value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _plan(job: TrainingJob, info: ProcessInfo) -> tuple[int, int, int]:
    """(effective batch, steps per epoch, total steps)."""
    options = job.options
    effective = options.batch_size * options.grad_accum * info.world_size
    steps_per_epoch = len(job.rows) // effective
    if steps_per_epoch == 0:
        raise OptionError(
            "{rows} training rows are fewer than one effective batch ({batch} x {accumulation} x {processes} "
            "processes = {effective}); lower {batch_size} or {grad_accum}", rows=len(job.rows),
            batch=options.batch_size, accumulation=options.grad_accum, processes=info.world_size, effective=effective)
    total = options.max_steps or max(1, math.ceil(options.epochs * steps_per_epoch))
    return effective, steps_per_epoch, total


def _micro_batch_indices(step: int, micro: int, seed: int, steps_per_epoch: int, effective: int, n_rows: int,
                         batch_size: int, info: ProcessInfo, orders: dict) -> list[int]:
    """The indices of the rows this process takes for one micro-batch of an optimizer step.

    Each epoch is a permutation of the rows drawn from `seed + epoch`; step s takes the next
    `effective` rows of it, the process of rank r taking micro-batch k's slice starting at
    `(k x processes + r) x batch_size` (see the module docstring's data order).

    Args:
        step: optimizer steps done since the start of training (the position in the data).
        micro: the micro-batch's number within the step, from 0.
        seed: the run's seed; epoch e's permutation is drawn from `seed + e`.
        steps_per_epoch: full optimizer steps in one epoch (the rest of an epoch is skipped).
        effective: rows per optimizer step, `batch_size x grad_accum x processes`.
        n_rows: the training rows.
        batch_size: rows per micro-batch of one process.
        info: this process's rank and the number of processes.
        orders: the permutation of the current epoch by epoch number, kept between calls; replaced
            when a step starts a new epoch.

    Returns:
        `batch_size` indices into the training rows.
    """
    epoch, position = divmod(step, steps_per_epoch)
    if epoch not in orders:
        orders.clear()
        orders[epoch] = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    start = position * effective + (micro * info.world_size + info.rank) * batch_size
    return orders[epoch][start:start + batch_size]


def _to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    return {key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
            for key, value in batch.items()}


def run_training(job: TrainingJob) -> TrainingResult:
    """Train `job` to its last step (resuming from its --out when it holds a checkpoint), evaluate,
    save the final model; see the module docstring."""
    info = start_processes()
    try:
        return _run(job, info)
    finally:
        stop_processes(info)


@dataclass
class _Run:
    """What the step, checkpoint and evaluation functions of one run share; `step` is the number of
    optimizer steps done, which is also the position in the data."""

    job: TrainingJob
    info: ProcessInfo
    identity: dict[str, Any]
    effective: int
    steps_per_epoch: int
    total_steps: int
    fsdp: bool
    autocast: Callable
    wrapped: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    log: _TrainLog
    start_step: int
    step: int
    orders: dict = field(default_factory=dict)

    @property
    def model(self) -> nn.Module:
        return self.job.model

    @property
    def options(self) -> TrainingOptions:
        return self.job.options


def _run(job: TrainingJob, info: ProcessInfo) -> TrainingResult:
    run = _start(job, info)
    try:
        return _train(run)
    finally:
        run.log.close()


def _train(run: _Run) -> TrainingResult:
    """`run` from its step to the end: the steps (with their logs, checkpoints and evaluations), the
    final checkpoint, evaluation and model."""
    job, info = run.job, run.info
    metrics, checkpoint, interrupted = {}, None, False
    window = _LogWindow(job.logged_outputs)
    bar = tqdm(total=run.total_steps, initial=run.start_step, desc=f"train {job.name}", unit="step",
               disable=not (info.is_main and job.progress), dynamic_ncols=True)
    run.model.train()
    with _StopRequest() as stop:
        while run.step < run.total_steps:
            interrupted = _training_step(run, window, stop)
            bar.update(1)
            if run.step % run.options.log_steps == 0 or run.step == run.total_steps or interrupted:
                record = window.record(run)
                run.log.write(record)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                                ex_s=f"{record['examples_per_second'] or 0:.2f}")
            if interrupted:
                break
            if run.step % run.options.save_steps == 0 and run.step < run.total_steps:
                checkpoint = _save_checkpoint(run)
            if run.options.eval_steps and run.step % run.options.eval_steps == 0 and run.step < run.total_steps:
                metrics = _evaluate(run, final=False)
    bar.close()

    if interrupted:
        return TrainingResult(run.step, run.total_steps, metrics, True, _save_checkpoint(run), info.is_main)
    # The end: a checkpoint of the last step first, so a crash during evaluation or saving costs no training.
    if run.step > run.start_step:  # (a rerun after the end only re-evaluates and re-saves)
        checkpoint = _save_checkpoint(run)
    metrics = _evaluate(run, final=True)
    state_dict = _full_state(run.model, run.wrapped, run.fsdp, info)
    if info.is_main:
        _save_final_model(job, run.model, state_dict)
    barrier(info)
    return TrainingResult(run.step, run.total_steps, metrics, False, checkpoint, info.is_main)


def bf16_by_default(device: torch.device) -> bool:
    """Whether a run without --bf16 or --no-bf16 autocasts to bfloat16: on a GPU that supports it;
    not on the CPU, where most CPUs have no bfloat16 instructions and it would run many times slower."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def _start(job: TrainingJob, info: ProcessInfo) -> _Run:
    """The run's plan, the model (resumed from the latest checkpoint in out_dir, if any) wrapped
    for the processes, its optimizer and schedule, the RNG streams and the log."""
    options = job.options
    use_bf16 = options.bf16
    if use_bf16 is None:
        use_bf16 = bf16_by_default(info.device)
    if options.attention is not None:  # this run's attention backend (the saved config keeps its own)
        from longdoc.model.inference import check_attention

        compute_dtype = torch.bfloat16 if use_bf16 else next(job.model.parameters()).dtype
        try:
            check_attention(options.attention, info.device, compute_dtype, options.attention)
        except InputError as error:  # named by the option's field: the command line shows its flag
            raise OptionError("{attention} {reason}", reason=error) from None
        job.model.set_attention_backend(options.attention)
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    identity = job.identity or model_identity(job.name, job.model)
    effective, steps_per_epoch, total_steps = _plan(job, info)
    fsdp = options.fsdp and info.distributed
    autocast = (lambda: torch.autocast(info.device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
    _seed(options.seed + info.rank)

    model = job.model
    if options.gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise OptionError("{gradient_checkpointing}: {model} does not support it", model=type(model).__name__)
        enable_gradient_checkpointing(model)

    resumed = ckpt.load_latest_checkpoint(out_dir, ckpt.read_checkpoint_files)
    start_step, training_state = 0, None
    if resumed is not None:
        where, (trainer_state, weights, training_state) = resumed
        check_resumable(out_dir, trainer_state.get("identity", {}), identity, where)
        _check_same_plan(trainer_state, effective, len(job.rows), total_steps, where)
        _warn_changed_options(trainer_state.get("options", {}), job.recorded_options(), where)
        model.load_state_dict(weights)
        start_step = trainer_state["step"]
        if info.is_main:
            print(f"longdoc train: resuming from {where} (step {start_step} of {total_steps})", file=sys.stderr)
    else:
        # The task name this run's config.json will hold: the model's (a task that runs another's
        # pipeline trains, and saves, that task's model), else the job's.
        _check_final_model(out_dir, getattr(getattr(model, "config", None), "task", None) or job.name)
    if info.is_main:
        atomic_write_json(out_dir / RESOLVED_OPTIONS_FILE, job.recorded_options())

    model.to(info.device)
    if options.compile:  # (in place: the state dict the checkpoints hold keeps its names)
        from longdoc.model.inference import compile_model

        try:
            compile_model(model, info.device)
        except InputError as error:  # named by the option's field: the command line shows its flag
            raise OptionError("{compile}: {reason}", reason=error) from None
    wrapped = _wrap(model, info, fsdp)
    optimizer = build_optimizer(wrapped, options.lr, options.weight_decay)
    scheduler = linear_schedule(optimizer, int(options.warmup_ratio * total_steps), total_steps)
    if training_state is not None:
        _load_optimizer_state(wrapped, optimizer, training_state["optimizer"], fsdp, info)
        scheduler.load_state_dict(training_state["scheduler"])
        rng_states = training_state["rng"]
        if len(rng_states) == info.world_size:
            _set_rng_state(rng_states[info.rank])
        elif info.is_main:
            print(f"longdoc train: the checkpoint was written by {len(rng_states)} processes, this run has "
                  f"{info.world_size}: dropout draws start afresh from the seed", file=sys.stderr)

    log = _TrainLog(out_dir / TRAIN_LOG_FILE, start_step, total_steps, info.is_main, options.report_to)
    return _Run(job, info, identity, effective, steps_per_epoch, total_steps, fsdp, autocast, wrapped, optimizer,
                scheduler, log, start_step, start_step)


class _LogWindow:
    """The training measurements since the last log line: the loss of each step (averaged over
    processes) and, for each of the job's `logged_outputs`, its sum and count over the micro-batches
    of every process where the model's output gave it."""

    def __init__(self, names: Sequence[str]):
        self.names = tuple(names)
        self._clear()

    def _clear(self) -> None:
        self.loss, self.steps, self.start = 0.0, 0, time.perf_counter()
        self.sums = dict.fromkeys(self.names, 0.0)
        self.counts = dict.fromkeys(self.names, 0.0)
        self.learning_rate = None

    def add(self, mean_loss: float, learning_rate: float, sums: Sequence[float], counts: Sequence[float]) -> None:
        self.loss += mean_loss
        self.steps += 1
        self.learning_rate = learning_rate
        for name, value, count in zip(self.names, sums, counts):
            self.sums[name] += value
            self.counts[name] += count

    def record(self, run: _Run) -> dict[str, Any]:
        """The log line of the window that ends at this step, and a new window."""
        elapsed = time.perf_counter() - self.start
        record = {"step": run.step, "epoch": round(run.step / run.steps_per_epoch, 4), "loss": self.loss / self.steps,
                  **{name: self.sums[name] / self.counts[name] for name in self.names if self.counts[name]},
                  "lr": self.learning_rate,
                  "examples_per_second": self.steps * run.effective / elapsed if elapsed > 0 else None}
        self._clear()
        return record


def _training_step(run: _Run, window: _LogWindow, stop: _StopRequest) -> bool:
    """One optimizer step of `run` at its data position, measured into `window`; True when any
    process was asked to stop (before the step ended)."""
    info, options, names = run.info, run.options, window.names
    sums = torch.zeros(len(names), device=info.device)
    counts = torch.zeros(len(names), device=info.device)

    def micro_batch(micro: int) -> dict[str, Any]:
        indices = _micro_batch_indices(run.step, micro, options.seed, run.steps_per_epoch, run.effective,
                                       len(run.job.rows), options.batch_size, info, run.orders)
        batch = run.job.collate([run.job.rows[i] for i in indices])
        check_encoder_inputs(batch, run.model.config)  # the values, here on the CPU, once (not again in forward)
        return _to_device(batch, info.device)

    def measure(output) -> None:
        for index, name in enumerate(names):
            value = getattr(output, name, None)
            if value is not None:
                sums[index] += value.detach().float()
                counts[index] += 1

    with checked_batches():
        step_loss, learning_rate = optimizer_step(
            run.wrapped, micro_batch, options.grad_accum, run.optimizer, run.scheduler, options.max_grad_norm,
            run.autocast, run.wrapped.no_sync if info.distributed and not run.fsdp else None, measure)
    run.step += 1
    # One collective per step: the loss, whether any process was asked to stop, the logged outputs.
    shared = torch.cat([torch.stack([step_loss, torch.tensor(float(stop.requested), device=info.device)]),
                        sums, counts])
    if info.distributed:
        dist.all_reduce(shared)
    values = shared.tolist()
    window.add(values[0] / info.world_size, learning_rate, values[2:2 + len(names)], values[2 + len(names):])
    return values[1] > 0


def _save_checkpoint(run: _Run) -> Path | None:
    """A checkpoint of `run` at its step (written by rank 0; every process takes part in gathering
    the state, and all raise together when the write failed); its path on rank 0."""
    info, options = run.info, run.options
    weights = _full_state(run.model, run.wrapped, run.fsdp, info)
    optimizer_state = _optimizer_state(run.wrapped, run.optimizer, run.fsdp, info)
    rng = gather_objects(info, _rng_state())
    path = None
    error = None
    if info.is_main:
        trainer_state = {"step": run.step, "total_steps": run.total_steps, "epoch": run.step / run.steps_per_epoch,
                         "effective_batch": run.effective, "rows": len(run.job.rows), "processes": info.world_size,
                         "identity": run.identity, "options": run.job.recorded_options()}
        try:
            path = ckpt.write_checkpoint(
                Path(run.job.out_dir), run.step, weights,
                {"optimizer": optimizer_state, "scheduler": run.scheduler.state_dict(), "rng": rng},
                trainer_state, options.keep_last)
        except ckpt.CheckpointError as failure:
            error = failure
    # Every process learns whether rank 0 managed, so all stop together on a failed write.
    failed = gather_objects(info, str(error) if error else None)[0]
    if failed:
        raise error if error else ckpt.CheckpointError(failed)
    return path


def _evaluate(run: _Run, final: bool) -> dict[str, float]:
    """The job's evaluation at the run's step, logged; its folder is out_dir at the end, else
    out_dir/eval/step-N."""
    job, info = run.job, run.info
    if job.evaluate is None:
        return {}
    out_dir = Path(job.out_dir)
    folder = out_dir if final else out_dir / EVAL_FOLDER / ckpt.checkpoint_name(run.step)
    result = {}
    if info.is_main or run.fsdp:
        import tempfile

        target = folder if info.is_main else Path(tempfile.mkdtemp(prefix="longdoc-eval-"))
        target.mkdir(parents=True, exist_ok=True)
        run.model.eval()
        # Evaluation in full precision: the metric of record should not depend on --bf16.
        with torch.no_grad():
            try:
                result = job.evaluate(run.wrapped if run.fsdp else run.model, target)
            except DeviceMemoryError as error:  # named by prediction's options; evaluating has its own
                raise DeviceMemoryError("evaluating on", error.rows, error.long_length, error.global_length,
                                        EVALUATION_REMEDIES) from None
        run.model.train()
        if not info.is_main:
            import shutil

            shutil.rmtree(target, ignore_errors=True)
    result = gather_objects(info, result)[0]
    run.log.write({"step": run.step, "eval": result})
    return result


def _check_same_plan(trainer_state: Mapping[str, Any], effective: int, rows: int, total_steps: int,
                     where: Path) -> None:
    """The position in the data is a step count: it means the same only with the same rows and batch."""
    if trainer_state.get("rows") != rows:
        raise OptionError("{where} was trained on {theirs} training rows, this run has {rows}: resume with the same "
                          "{train} file and feature options, or give another {out}", where=where,
                          theirs=trainer_state.get("rows"), rows=rows)
    if trainer_state.get("effective_batch") != effective:
        raise OptionError("{where} was trained with an effective batch of {theirs} (batch x accumulation x "
                          "processes), this run has {effective}: resume with the same {batch_size}, {grad_accum} and "
                          "number of processes, or give another {out}", where=where,
                          theirs=trainer_state.get("effective_batch"), effective=effective)
    if trainer_state.get("total_steps") != total_steps:
        raise OptionError("{where} belongs to a run of {theirs} steps, this run has {total} ({max_steps}/{epochs}): "
                          "the schedule would differ; resume with the same options, or give another {out}",
                          where=where, theirs=trainer_state.get("total_steps"), total=total_steps)


def _warn_changed_options(saved: Mapping[str, Any], now: Mapping[str, Any], where: Path) -> None:
    import warnings

    changed = [name for name in _TRAJECTORY_OPTIONS if name in saved and saved[name] != now.get(name)]
    if changed:
        warnings.warn(f"resuming {where} with changed option(s) {', '.join(changed)}: the result will differ from "
                      "an uninterrupted run of either setting", stacklevel=3)
