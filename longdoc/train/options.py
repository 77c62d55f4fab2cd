"""Training options: the engine's record (`TrainingOptions`, shared by every `longdoc train TASK`
and extended by `longdoc pretrain`'s `PretrainingOptions`), a `--config` file that holds the same
options, and their resolution into records.

Resolution order, lowest first: the records' defaults (the engine's, and a task's options record),
then the `--config` file (JSON, or YAML for .yaml/.yml; or the name of a file the task ships in
tasks/<task>/configs/NAME.json), then what the command line gives. A name in the file that no
option has is an error naming the option and the file. Then the batch: where `effective_batch_size`
is set (the published configs state their paper's batch so), `grad_accum` is derived from it and
the number of processes torchrun starts (`accumulation_for`). The result is one frozen record per
class asked for; `recorded_options` is what `--out/train_options.json` holds (every option by its
long name with underscores, then `config`, the file they came from).

Errors name options by their fields (`longdoc.errors.OptionError`): the command line shows its flags.
This module imports no torch: the command line builds its parser from it.
"""

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from longdoc.errors import InputError, OptionError
from longdoc.data.options import Option, json_values, option, options_of, record_values
from longdoc.data.task import Task

RESOLVED_OPTIONS_FILE = "train_options.json"


@dataclass(frozen=True)
class TrainingOptions:
    """The engine's options (see the module docstring); checked when made."""

    train: Path | None = option(None, "training file (the task's official format)", "FILE")
    dev: Path | None = option(None, "dev file: evaluated with the official metric every --eval-steps and at the "
                              "end", "FILE")
    out: Path | None = option(None, "output folder: final model, checkpoints/, metrics.json, train_log.jsonl; "
                              "rerunning the same command on it resumes", "DIR")
    init: Path | None = option(None, "lifted encoder to start from (default: the packaged MiniLM, lifted with "
                               "--init-positions)", "DIR")
    init_positions: str | None = option(None, "without --init, the positions of the packaged MiniLM's lift: "
                                        "absolute (its table tiled to the long length, as Longformer; the default, "
                                        "it trained best on the multihop task), relative (ETC's tables, fresh) or "
                                        "both", "P")
    max_steps: int | None = option(None, "optimizer steps in all (default: --epochs over the training rows)", "N")
    epochs: float = option(1.0, "passes over the training rows when --max-steps is not given", "E")
    batch_size: int = option(8, "rows per forward pass per process", "B")
    grad_accum: int = option(1, "forward passes per process per optimizer step; effective batch = B x K x "
                             "processes", "K")
    effective_batch_size: int | None = option(None, "rows per optimizer step over all processes: sets "
                                              "--grad-accum to N / (B x processes), so a run keeps its batch under "
                                              "torchrun", "N")
    lr: float = option(5e-5, "peak learning rate (AdamW)", "X")
    warmup_ratio: float = option(0.1, "share of the steps with a linear warm-up; linear decay to 0 after", "R")
    weight_decay: float = option(0.01, "AdamW weight decay (not on biases and norms)", "X")
    max_grad_norm: float = option(1.0, "clip the gradient norm to this (0: no clipping)", "X")
    seed: int = option(42, "seed of the heads' initialisation, the data order and dropout", "S")
    eval_steps: int = option(0, "evaluate on --dev every N steps (0: only at the end)", "N")
    save_steps: int = option(500, "write a checkpoint every N steps (and at the end and on Ctrl-C)", "N")
    keep_last: int = option(2, "checkpoints kept (the oldest are removed)", "K")
    log_steps: int = option(10, "a train_log.jsonl line (loss, lr, examples/s) every N steps", "N")
    report_to: str | None = option(None, "also log train_log.jsonl's scalars to: tensorboard (event files in "
                                   "OUT/runs; needs the tensorboard package: pip install 'longdoc[tensorboard]'), "
                                   "or none (the default)", "TOOL")
    eval_batch_size: int | None = option(None, "windows per forward pass when evaluating (default: --batch-size)",
                                         "N")
    gradient_checkpointing: bool = option(False, "recompute activations in backward (less memory, slower)")
    bf16: bool | None = option(None, "bfloat16 autocast (default: on for GPUs that support it, off on CPU)")
    fsdp: bool = option(False, "shard parameters, gradients and optimizer state over processes (FSDP2) instead of "
                        "replicating them (DDP); for models too large for one device")
    residual_attention: bool | None = option(None, "RealFormer residual attention on/off for this run (default: "
                                             "as the --init encoder has it)")
    talking_heads: bool | None = option(None, "talking-heads attention on/off (new matrices start at identity; "
                                        "default: as the --init encoder has it)")
    long_max_len: int | None = option(None, "long tokens per window (default: the --init encoder's)", "N")
    global_max_len: int | None = option(None, "global tokens per window (default: the --init encoder's)", "N")
    attention: str | None = option(None, "the attention backend of this run: auto, eager, cpu, gpu or dense (default: "
                                   "the --init encoder's, normally auto; not saved with the model)", "NAME")
    compile: bool = option(False, "compile the model with torch.compile (a C++ compiler on the CPU, Triton on "
                           "CUDA; the first steps take longer)")
    config: str | None = None  # the config file the values came from (None: none)

    def __post_init__(self):
        if self.report_to == NO_REPORTING:
            object.__setattr__(self, "report_to", None)  # frozen: set once, before the checks
        check_options(self)

    def encoder_settings(self) -> dict[str, Any]:
        """The encoder switches this run sets at --init (they need no new weights, or start at identity)."""
        return {name: getattr(self, name) for name in ENCODER_SWITCHES if getattr(self, name) is not None}


ENGINE_OPTIONS: tuple[Option, ...] = options_of(TrainingOptions)
# Encoder settings a run may change at --init (they need no new weights, or start at identity).
ENCODER_SWITCHES = ("residual_attention", "talking_heads", "long_max_len", "global_max_len")
# --report-to's choices: the logging tool and the package it needs; or "none", as transformers'
# TrainingArguments spells no logging tool.
REPORT_TO = {"tensorboard": "tensorboard"}
NO_REPORTING = "none"
_POSITIVE = ("batch_size", "grad_accum", "save_steps", "keep_last", "log_steps")


@dataclass(frozen=True)
class PretrainingOptions(TrainingOptions):
    """`longdoc pretrain`'s options: the engine's plus the corpus and masking ones, whose defaults are
    `longdoc.data.pretraining_corpus.PretrainingSettings`' (a test keeps the two equal)."""

    one_per_line: bool = option(False, "one document per line of each file (else one per file)")
    # argparse formats help texts with %: a percent sign is written %%.
    mask_rate: float = option(0.15, "share of the tokens masked for MLM, whole words at a time (80%% [MASK], "
                              "10%% random, 10%% unchanged)", "R")
    cpc_sentence_rate: float = option(0.1, "share of each input's sentences masked whole for CPC (at least one, "
                                      "never all)", "R")
    min_sentences: int = option(2, "skip documents with fewer sentences", "N")
    max_sentence_tokens: int = option(128, "longer sentences are cut into pieces of at most this many tokens, each "
                                      "with its own global token", "N")
    eval_rows: int = option(16, "inputs the held-out losses are measured on", "N")
    num_proc: int | None = option(None, "processes for preparing the corpus (datasets map)", "N")
    cache_dir: Path | None = option(None, "where the prepared corpus is cached (default: the datasets cache)", "DIR")
    mlm_head_from: Path | None = option(None, "a BERT-family folder whose MLM head (cls.predictions) starts the MLM "
                                        "transform (default: fresh, unless --init holds pretraining heads)", "DIR")


def read_config_file(path: Path) -> dict[str, Any]:
    """A config file's options (JSON object, or YAML mapping for .yaml/.yml), keys as written."""
    if not path.is_file():
        raise OptionError("{config} {path}: no such file", path=path)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise InputError(f"{path}: not valid YAML: {error}") from None
    else:
        from longdoc.io import read_json

        values = read_json(path)
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise InputError(f"{path}: a config file holds one mapping of option names to values")
    return values


def find_config(config: str | Path, shipped_folder: Path | None) -> Path:
    """A config file path, or the name of a file shipped in the task's configs folder."""
    path = Path(config)
    if path.is_file():
        return path
    if shipped_folder is not None and "/" not in str(config):
        shipped = shipped_folder / (path.name if path.suffix else f"{path.name}.json")
        if shipped.is_file():
            return shipped
    shipped_names = sorted(p.stem for p in shipped_folder.glob("*.json")) if shipped_folder and shipped_folder.is_dir() else []
    known = f"; shipped configs: {', '.join(shipped_names)}" if shipped_names else ""
    raise OptionError("{config} {given}: no such file{known}", given=config, known=known)


def _coerce(option: Option, value: Any, where: str) -> Any:
    if value is None:
        return None
    if option.type is bool:
        if not isinstance(value, bool):
            raise InputError(f"{where}: option {option.name!r} must be true or false, got {value!r}")
        return value
    if option.type is Path:
        if not isinstance(value, str):
            raise InputError(f"{where}: option {option.name!r} must be a path (text), got {value!r}")
        return Path(value)
    if option.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if option.type is float and isinstance(value, str):
        try:  # YAML 1.1 reads 5e-5 as text
            return float(value)
        except ValueError:
            pass
    if option.type in (int, float, str) and (isinstance(value, bool) or not isinstance(value, option.type)):
        raise InputError(f"{where}: option {option.name!r} must be {option.type.__name__}, got {value!r}")
    return value


def resolve_options(
    given: Mapping[str, Any],
    records: Sequence[type],
    config: str | Path | None = None,
    shipped_configs: Path | None = None,
    world_size: int | None = None,
) -> tuple:
    """Defaults < config file < `given` (command-line values; None means not given), as one record of
    each class in `records` (each takes its own fields; the engine's, which must come first, also
    `config`), checked; the accumulation for `world_size` processes (default: torchrun's WORLD_SIZE,
    else 1).

    Paths in a config file are taken relative to the current folder, as on the command line.
    """
    options = [option for record in records for option in options_of(record)]
    by_name = {option.name: option for option in options}
    resolved = {option.name: option.default for option in options}
    chosen = set()  # the options the config file or the command line set
    if config is not None:
        path = find_config(config, shipped_configs)
        for key, value in read_config_file(path).items():
            name = str(key).replace("-", "_")
            if name == "config":
                raise InputError(f"{path}: a config file cannot name another config file ('config')")
            if name not in by_name:
                raise InputError(f"{path}: unknown option {key!r}; known options: {', '.join(by_name)}")
            resolved[name] = _coerce(by_name[name], value, str(path))
            chosen.add(name)
        resolved["config"] = str(path)
    for name, value in given.items():
        if value is not None and name in by_name:
            resolved[name] = value
            chosen.add(name)
    made = [record(**{field.name: resolved[field.name] for field in dataclasses.fields(record)
                      if field.name in resolved}) for record in records]
    engine = made[0]
    if engine.effective_batch_size is not None:
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        made[0] = dataclasses.replace(engine, grad_accum=accumulation_for(
            engine.effective_batch_size, engine.batch_size, world_size,
            engine.grad_accum if "grad_accum" in chosen else None))
    return tuple(made)


def resolve_task_options(task: Task, given: Mapping[str, Any], config: str | Path | None = None,
                         world_size: int | None = None) -> tuple[TrainingOptions, Any]:
    """(the engine's options, the task's options record or None) of `longdoc train TASK`: defaults <
    the config file (a path, or the name of one the task ships) < `given`."""
    records = (TrainingOptions,) if task.options is None else (TrainingOptions, task.options)
    options, *own = resolve_options(given, records, config, task.configs, world_size)
    return options, (own[0] if own else None)


def recorded_options(options: TrainingOptions, *more) -> dict[str, Any]:
    """The options of a run as JSON values, for train_options.json, checkpoints and metrics.json:
    every option of `options` and of the records `more` (a task's) by name, then `config`."""
    values = record_values(options)
    for record in more:
        if record is not None:
            values.update(record_values(record))
    return json_values({**values, "config": options.config})


def accumulation_for(effective_batch_size: int, batch_size: int, world_size: int,
                     grad_accum: int | None = None) -> int:
    """The forward passes per process per optimizer step that make `effective_batch_size` rows with
    `batch_size` rows per pass on `world_size` processes; `grad_accum`, when the run also sets it,
    must be that number."""
    per_pass = batch_size * world_size
    processes = f"{world_size} process{'es' if world_size > 1 else ''}"
    if effective_batch_size % per_pass:
        raise OptionError(
            "{effective_batch_size} {effective} is not a multiple of {batch_size} {batch} x {processes} = {per_pass}: "
            "change {batch_size}, the number of processes or {effective_batch_size}",
            effective=effective_batch_size, batch=batch_size, processes=processes, per_pass=per_pass)
    accumulation = effective_batch_size // per_pass
    if grad_accum is not None and grad_accum != accumulation:
        raise OptionError(
            "{grad_accum} {accumulation} and {effective_batch_size} {effective} disagree: {batch_size} {batch} x "
            "{processes} x {grad_accum} {accumulation} = {rows} rows per step; give one of them",
            accumulation=grad_accum, effective=effective_batch_size, batch=batch_size, processes=processes,
            rows=per_pass * grad_accum)
    return accumulation


def check_options(options: TrainingOptions) -> None:
    """Refuse impossible engine option values, naming the option."""
    for name in _POSITIVE:
        if getattr(options, name) is None or getattr(options, name) < 1:
            raise OptionError("{%s} must be >= 1, got {got}" % name, got=getattr(options, name))
    for name in ("effective_batch_size", "max_steps", "eval_batch_size"):
        if getattr(options, name) is not None and getattr(options, name) < 1:
            raise OptionError("{%s} must be >= 1, got {got}" % name, got=getattr(options, name))
    if options.init_positions is not None:
        from longdoc.convert.lift import POSITION_CHOICES

        if options.init_positions not in POSITION_CHOICES:
            raise OptionError("{init_positions} must be one of {choices}, got {got!r}",
                              choices=", ".join(POSITION_CHOICES), got=options.init_positions)
        if options.init is not None:
            raise OptionError("{init_positions} chooses the lift of the packaged MiniLM; it does not apply with "
                              "{init} {got}", got=options.init)
    if options.report_to is not None:
        if options.report_to not in REPORT_TO:
            raise OptionError("{report_to} must be one of {choices}, got {got!r}",
                              choices=", ".join([*REPORT_TO, NO_REPORTING]), got=options.report_to)
        if importlib.util.find_spec(REPORT_TO[options.report_to]) is None:
            raise OptionError("{report_to} {tool} needs the {package} package: pip install 'longdoc[{tool}]'",
                              tool=options.report_to, package=REPORT_TO[options.report_to])
    if options.epochs is not None and options.epochs <= 0:
        raise OptionError("{epochs} must be > 0, got {got}", got=options.epochs)
    if options.lr is not None and options.lr <= 0:
        raise OptionError("{lr} must be > 0, got {got}", got=options.lr)
    if options.warmup_ratio is not None and not 0 <= options.warmup_ratio < 1:
        raise OptionError("{warmup_ratio} must be in [0, 1), got {got}", got=options.warmup_ratio)
    for name in ("eval_steps", "weight_decay", "max_grad_norm"):
        if getattr(options, name) is not None and getattr(options, name) < 0:
            raise OptionError("{%s} must be >= 0, got {got}" % name, got=getattr(options, name))
    for name in ("train", "out"):
        if getattr(options, name) is None:
            raise OptionError("{%s} is required (on the command line or in the {config} file)" % name)
