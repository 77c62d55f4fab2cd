"""Training options: one list shared by every `longdoc train TASK` (and reused by `longdoc pretrain`),
a `--config` file that holds the same options, and their resolution.

Resolution order, lowest first: the defaults below (and a task's `Task.train_options` defaults),
then the `--config` file (JSON, or YAML for .yaml/.yml; or the name of a file the task ships in
tasks/<task>/configs/NAME.json), then what the command line gives. A name in the file that no
option has is an error naming the option and the file. Then the batch: where `effective_batch_size`
is set (the published configs state their paper's batch so), `grad_accum` is derived from it and
the number of processes torchrun starts (`accumulation_for`). The resolved options are a plain dict keyed
by the options' long names with underscores (`batch_size`), written to `--out/train_options.json`.

This module imports no torch: the command line builds its parser from it.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from longdoc.errors import InputError

RESOLVED_OPTIONS_FILE = "train_options.json"


@dataclass(frozen=True)
class TrainOption:
    """One training option: `--NAME` on the command line, `NAME` (with underscores or dashes) in a config file."""

    name: str
    type: Any  # int, float, str, Path, or bool (a --flag/--no-flag switch)
    default: Any
    help: str
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


ENGINE_OPTIONS: tuple[TrainOption, ...] = (
    TrainOption("train", Path, None, "training file (the task's official format)", "FILE"),
    TrainOption("dev", Path, None, "dev file: evaluated with the official metric every --eval-steps and at the end",
                "FILE"),
    TrainOption("out", Path, None, "output folder: final model, checkpoints/, metrics.json, train_log.jsonl; "
                "rerunning the same command on it resumes", "DIR"),
    TrainOption("init", Path, None, "lifted encoder to start from (default: the packaged MiniLM, lifted with "
                "--init-positions)", "DIR"),
    TrainOption("init_positions", str, None, "without --init, the positions of the packaged MiniLM's lift: "
                "absolute (its table tiled to the long length, as Longformer; the default, it trained best on "
                "the multihop task), relative (ETC's tables, fresh) or both", "P"),
    TrainOption("max_steps", int, None, "optimizer steps in all (default: --epochs over the training rows)", "N"),
    TrainOption("epochs", float, 1.0, "passes over the training rows when --max-steps is not given", "E"),
    TrainOption("batch_size", int, 8, "rows per forward pass per process", "B"),
    TrainOption("grad_accum", int, 1, "forward passes per process per optimizer step; effective batch = "
                "B x K x processes", "K"),
    TrainOption("effective_batch_size", int, None, "rows per optimizer step over all processes: sets --grad-accum "
                "to N / (B x processes), so a run keeps its batch under torchrun", "N"),
    TrainOption("lr", float, 5e-5, "peak learning rate (AdamW)", "X"),
    TrainOption("warmup_ratio", float, 0.1, "share of the steps with a linear warm-up; linear decay to 0 after", "R"),
    TrainOption("weight_decay", float, 0.01, "AdamW weight decay (not on biases and norms)", "X"),
    TrainOption("max_grad_norm", float, 1.0, "clip the gradient norm to this (0: no clipping)", "X"),
    TrainOption("seed", int, 42, "seed of the heads' initialisation, the data order and dropout", "S"),
    TrainOption("eval_steps", int, 0, "evaluate on --dev every N steps (0: only at the end)", "N"),
    TrainOption("save_steps", int, 500, "write a checkpoint every N steps (and at the end and on Ctrl-C)", "N"),
    TrainOption("keep_last", int, 2, "checkpoints kept (the oldest are removed)", "K"),
    TrainOption("log_steps", int, 10, "a train_log.jsonl line (loss, lr, examples/s) every N steps", "N"),
    TrainOption("eval_batch_size", int, None, "windows per forward pass when evaluating (default: --batch-size)",
                "N"),
    TrainOption("gradient_checkpointing", bool, False, "recompute activations in backward (less memory, slower)"),
    TrainOption("bf16", bool, None, "bfloat16 autocast (default: on for GPUs that support it, off on CPU)"),
    TrainOption("fsdp", bool, False, "shard parameters, gradients and optimizer state over processes (FSDP2) "
                "instead of replicating them (DDP); for models too large for one device"),
    TrainOption("residual_attention", bool, None, "RealFormer residual attention on/off for this run "
                "(default: as the --init encoder has it)"),
    TrainOption("talking_heads", bool, None, "talking-heads attention on/off (new matrices start at identity; "
                "default: as the --init encoder has it)"),
    TrainOption("long_max_len", int, None, "long tokens per window (default: the --init encoder's)", "N"),
    TrainOption("global_max_len", int, None, "global tokens per window (default: the --init encoder's)", "N"),
    TrainOption("attention", str, None, "the attention backend of this run: auto, eager, cpu, gpu or dense (default: "
                "the --init encoder's, normally auto; not saved with the model)", "NAME"),
)
# Encoder settings a run may change at --init (they need no new weights, or start at identity).
ENCODER_SWITCHES = ("residual_attention", "talking_heads", "long_max_len", "global_max_len")
_POSITIVE = ("batch_size", "grad_accum", "save_steps", "keep_last", "log_steps")


def add_option_arguments(parser, options: Iterable[TrainOption], only_for: Mapping[str, str] | None = None) -> None:
    """Add each option to an argparse parser with default None, so that what the command line gave
    can be told apart from what it left to the config file and the defaults."""
    import argparse

    for option in options:
        where = f"{only_for[option.name]} only: " if only_for and option.name in only_for else ""
        default_text = "" if option.default is None else f" (default {option.default})"
        if option.type is bool:
            parser.add_argument(option.flag, dest=option.name, action=argparse.BooleanOptionalAction, default=None,
                                help=where + option.help + default_text)
        else:
            parser.add_argument(option.flag, dest=option.name, type=option.type, default=None,
                                metavar=option.metavar or option.type.__name__.upper(),
                                help=where + option.help + default_text)


def read_config_file(path: Path) -> dict[str, Any]:
    """A config file's options (JSON object, or YAML mapping for .yaml/.yml), keys as written."""
    if not path.is_file():
        raise InputError(f"--config {path}: no such file")
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
    raise InputError(f"--config {config}: no such file{known}")


def _coerce(option: TrainOption, value: Any, where: str) -> Any:
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
    options: Iterable[TrainOption],
    config: str | Path | None = None,
    shipped_configs: Path | None = None,
    world_size: int | None = None,
) -> dict[str, Any]:
    """Defaults < config file < `given` (command-line values; None means not given), checked; the
    accumulation for `world_size` processes (default: torchrun's WORLD_SIZE, else 1).

    Paths in a config file are taken relative to the current folder, as on the command line.
    """
    options = tuple(options)
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
    else:
        resolved["config"] = None
    for name, value in given.items():
        if value is not None and name in by_name:
            resolved[name] = value
            chosen.add(name)
    check_options(resolved)
    if resolved.get("effective_batch_size") is not None:
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        resolved["grad_accum"] = accumulation_for(
            resolved["effective_batch_size"], resolved["batch_size"], world_size,
            resolved["grad_accum"] if "grad_accum" in chosen else None)
    return resolved


def accumulation_for(effective_batch_size: int, batch_size: int, world_size: int,
                     grad_accum: int | None = None) -> int:
    """The forward passes per process per optimizer step that make `effective_batch_size` rows with
    `batch_size` rows per pass on `world_size` processes; `grad_accum`, when the run also sets it,
    must be that number."""
    per_pass = batch_size * world_size
    processes = f"{world_size} process{'es' if world_size > 1 else ''}"
    if effective_batch_size % per_pass:
        raise InputError(
            f"--effective-batch-size {effective_batch_size} is not a multiple of --batch-size {batch_size} x "
            f"{processes} = {per_pass}: change --batch-size, the number of processes or --effective-batch-size")
    accumulation = effective_batch_size // per_pass
    if grad_accum is not None and grad_accum != accumulation:
        raise InputError(
            f"--grad-accum {grad_accum} and --effective-batch-size {effective_batch_size} disagree: --batch-size "
            f"{batch_size} x {processes} x --grad-accum {grad_accum} = {per_pass * grad_accum} rows per step; "
            "give one of them")
    return accumulation


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse impossible engine option values, naming the option."""
    for name in _POSITIVE:
        if name in options and (options[name] is None or options[name] < 1):
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {options[name]}")
    if options.get("effective_batch_size") is not None and options["effective_batch_size"] < 1:
        raise InputError(f"--effective-batch-size must be >= 1, got {options['effective_batch_size']}")
    if options.get("init_positions") is not None:
        from longdoc.convert.lift import POSITION_CHOICES

        if options["init_positions"] not in POSITION_CHOICES:
            raise InputError(f"--init-positions must be one of {', '.join(POSITION_CHOICES)}, "
                             f"got {options['init_positions']!r}")
        if options.get("init") is not None:
            raise InputError(f"--init-positions chooses the lift of the packaged MiniLM; it does not apply with "
                             f"--init {options['init']}")
    if options.get("max_steps") is not None and options["max_steps"] < 1:
        raise InputError(f"--max-steps must be >= 1, got {options['max_steps']}")
    if options.get("epochs") is not None and options["epochs"] <= 0:
        raise InputError(f"--epochs must be > 0, got {options['epochs']}")
    if options.get("lr") is not None and options["lr"] <= 0:
        raise InputError(f"--lr must be > 0, got {options['lr']}")
    if options.get("warmup_ratio") is not None and not 0 <= options["warmup_ratio"] < 1:
        raise InputError(f"--warmup-ratio must be in [0, 1), got {options['warmup_ratio']}")
    for name in ("eval_steps", "weight_decay", "max_grad_norm"):
        if options.get(name) is not None and options[name] < 0:
            raise InputError(f"--{name.replace('_', '-')} must be >= 0, got {options[name]}")
    if options.get("eval_batch_size") is not None and options["eval_batch_size"] < 1:
        raise InputError(f"--eval-batch-size must be >= 1, got {options['eval_batch_size']}")
    for name in ("train", "out"):
        if name in options and options[name] is None:
            raise InputError(f"--{name} is required (on the command line or in the --config file)")


def options_json(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options as JSON values (paths as text), for train_options.json and checkpoints."""
    return {name: str(value) if isinstance(value, Path) else value for name, value in options.items()}
