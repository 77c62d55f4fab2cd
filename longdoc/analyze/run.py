"""`analyze_attention(options)`: a model folder and data -> OUT/analysis.json and the PNG plots.

The path: model folder -> encoder (any longdoc model: a bare or converted encoder, a trained task
model, a lifted reader; its encoder's weights) -> inputs (longdoc.analyze.data) -> the encoder with
its attention weights kept (`keep_attention_weights`: the weights the model computes, with the
backend it computes them with) -> statistics per batch (longdoc.analyze.collect) -> summary ->
analysis.json and plots, written into a temporary folder renamed to OUT, so OUT appears whole or not
at all.
"""

import datetime
from dataclasses import dataclass, field
from pathlib import Path

from longdoc.analyze import ANALYSIS_FILE, STATISTIC_GROUPS
from longdoc.analyze.summary import STATISTICS, Summary
from longdoc.errors import InputError
from longdoc.data.task import TaskLookup

FORMAT_VERSION = 1


@dataclass(frozen=True)
class AnalysisOptions:
    """model: a longdoc model folder; data: a task's file (with `task`) or plain text (a file or a
    folder); out: the folder to write (must not exist, or be empty); examples: how many model inputs
    (windows) of the data; statistics: the groups to compute (longdoc.analyze.STATISTIC_GROUPS);
    device, dtype, attention: as `longdoc predict` takes them (None: the defaults); plots: draw PNGs."""

    model: Path
    data: Path
    out: Path
    task: str | None = None
    examples: int = 64
    batch_size: int = 4
    statistics: tuple[str, ...] = STATISTIC_GROUPS
    device: str | None = None
    dtype: str | None = None
    attention: str | None = None
    plots: bool = True
    progress: bool = True


@dataclass
class AnalysisResult:
    out: Path
    analysis: dict = field(repr=False)


def _check(options: AnalysisOptions, config: dict, tasks: TaskLookup | None) -> dict[str, str]:
    """InputError for options that cannot give any figure; the statistics that do not apply (name -> why)."""
    from longdoc.analyze.plots import INSTALL_HINT, plotting_available

    if options.task is not None and (tasks is None or options.task not in tasks.names()):
        known = "no task registry given" if tasks is None else f"one of {', '.join(tasks.names())}"
        raise InputError(f"--task {options.task}: unknown task; {known}")
    if options.examples < 1:
        raise InputError(f"--examples must be >= 1, got {options.examples}")
    if options.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {options.batch_size}")
    unknown = sorted(set(options.statistics) - set(STATISTIC_GROUPS))
    if unknown or not options.statistics:
        raise InputError(f"--statistics {','.join(options.statistics)}: choose among {', '.join(STATISTIC_GROUPS)}")
    not_applicable = {}
    if not config.get("residual_attention", True) and "carried-share" in options.statistics:
        not_applicable["carried_share"] = (f"{options.model} has no residual attention (residual_attention false in "
                                           "its config.json): no scores are carried")
        if set(options.statistics) == {"carried-share"}:
            raise InputError(f"--statistics carried-share: not applicable: {not_applicable['carried_share']}; "
                             "nothing to analyse")
    if options.plots and not plotting_available():
        raise InputError(INSTALL_HINT)
    return not_applicable


def load_encoder(directory: Path):
    """The encoder of any longdoc model folder (a task model's or reader's heads left out)."""
    from longdoc.model.encoder_folder import readable_weights
    from longdoc.model.pretrained import GlobalLocalModel

    with readable_weights(directory):
        try:
            return GlobalLocalModel.from_pretrained(directory)
        except (OSError, ValueError) as error:
            raise InputError(f"{directory}: the encoder could not be loaded: {error}") from None


def model_kind(recorded: str | None, task) -> str:
    """What the model folder holds, for analysis.json: "encoder", or the task it was trained for, named
    as --task names it when that task runs the recorded one's parts (a multihop model records
    HotpotQA's, whose pipeline it runs)."""
    if not recorded:
        return "encoder"
    if task is not None and recorded in (task.name, task.pipeline_of):
        return task.name
    return recorded


def _model_record(directory: Path, config, kind: str, backend: str, device, dtype) -> dict:
    return {
        "path": str(directory), "kind": kind, "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads, "head_size": config.head_size, "hidden_size": config.hidden_size,
        "local_radius": config.local_radius, "long_max_len": config.long_max_len,
        "global_max_len": config.global_max_len, "residual_attention": config.residual_attention,
        "residual_attention_mean": config.residual_attention_mean, "talking_heads": config.talking_heads,
        "attention_backend": backend, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
    }


def analyze_attention(options: AnalysisOptions, tasks: TaskLookup | None = None) -> AnalysisResult:
    """Analyse the attention of `options.model` on `options.data` into `options.out` (module docstring).
    `tasks`: the registry `options.task` is found in (`longdoc.tasks.REGISTRY`; needed with a task)."""
    import torch
    from tqdm.auto import tqdm

    from longdoc.model import inference
    from longdoc.analyze import data
    from longdoc.analyze.collect import add_batch
    from longdoc.model_folder import read_tokenizer, refuse_existing, write_new_folder
    from longdoc.model.backends.resolution import resolve_backend
    from longdoc.model.encoder_folder import describe_checkpoint
    from longdoc.model.inputs import check_encoder_inputs, encoder_inputs

    found = describe_checkpoint(options.model)
    not_applicable = _check(options, found, tasks)
    refuse_existing(options.out)
    device, dtype = inference.resolve_placement(options.device, options.dtype)
    model = inference.place_model(load_encoder(options.model), device, dtype, options.model, options.attention)
    model.keep_attention_weights()
    config = model.config
    backend = resolve_backend(options.attention or config.attention_backend, device, dtype).name
    task = None if options.task is None else tasks.get(options.task)
    rows, collate = data.model_inputs(options.data, task, read_tokenizer(options.model), config,
                                      options.examples, options.progress)

    summary = Summary(config.num_attention_heads)
    groups = frozenset(options.statistics) - ({"carried-share"} if not_applicable else set())
    long_tokens = global_tokens = 0
    with tqdm(total=len(rows), desc="analysing attention", unit=" inputs", disable=not options.progress) as bar:
        for indices in data.batches(rows, options.batch_size):
            batch = collate([rows[index] for index in indices])
            check_encoder_inputs(batch, config)
            inputs = encoder_inputs(batch)
            long_mask = inputs.get("long_attention_mask", torch.ones_like(inputs["long_input_ids"]))
            global_mask = inputs.get("global_attention_mask", long_mask.new_zeros(len(indices), 0))
            with torch.no_grad():
                output = model(**{name: value.to(device) for name, value in inputs.items()})
            add_batch(summary, output.attention_weights, long_mask.to(device), global_mask.to(device), groups)
            long_tokens += int(long_mask.sum())
            global_tokens += int(global_mask.sum())
            bar.update(len(indices))

    chosen = tuple(statistic for statistic in STATISTICS if statistic.group in options.statistics)
    analysis = {
        "format": FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": _model_record(options.model, config, model_kind(found.get("task"), task), backend, device, dtype),
        "data": {"path": str(options.data), "task": options.task, "inputs": len(rows), "long_tokens": long_tokens,
                 "global_tokens": global_tokens},
        "statistics": summary.as_json(chosen, not_applicable),
    }

    def write(folder: Path) -> None:
        from longdoc.analyze.plots import draw_all
        from longdoc.io import atomic_write_json

        analysis["plots"] = draw_all(analysis, folder) if options.plots else []
        atomic_write_json(folder / ANALYSIS_FILE, analysis)

    write_new_folder(options.out, write)
    return AnalysisResult(options.out, analysis)
