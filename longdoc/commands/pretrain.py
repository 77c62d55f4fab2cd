"""`longdoc pretrain --train CORPUS --out DIR [options]`: continued pretraining (whole-word MLM + CPC over
sentence global tokens) of a global-local encoder on plain text, on the one training engine; under
torchrun it trains data-parallel. The output folder is an encoder that `--init` of any task accepts.

The options are the engine's (longdoc.train.options; the corpus is --train, residual attention is on
unless --no-residual-attention) plus the corpus and masking options below. Their defaults are those
of `longdoc.data.pretraining_corpus.PretrainingSettings` (a test keeps the two equal; this module imports
no torch, so `longdoc --help` stays fast).
"""

import dataclasses
from pathlib import Path

from longdoc.commands.train import run_and_report
from longdoc.train.options import ENGINE_OPTIONS, TrainOption, add_option_arguments, resolve_options

HELP = "continued pretraining (MLM + CPC) on plain text (resumes from --out; data-parallel under torchrun)"

_ENGINE_HELP = {
    "train": "the corpus: a text file, a folder of them, or a `datasets` dataset saved with save_to_disk "
             "(a 'text' column)",
    "dev": "a held-out corpus (same forms as --train): its MLM and CPC losses are logged every --eval-steps "
           "and at the end (default: the first --eval-rows inputs of --train)",
    "out": "output folder: the pretrained encoder (GlobalLocalModel + tokenizer, for --init of any task), "
           "checkpoints/, train_log.jsonl; rerunning the same command on it resumes",
    "init": "encoder to continue from (default: the packaged lifted MiniLM); a previous pretraining output "
            "brings its MLM and CPC heads",
    "residual_attention": "RealFormer residual attention on/off (default: on, as RealFormer pretrains)",
    "long_max_len": "long tokens per packed input (default: the --init encoder's; ETC: 4096)",
    "global_max_len": "sentences (global tokens) per packed input (default: the --init encoder's)",
}

PRETRAINING_OPTIONS: tuple[TrainOption, ...] = (
    *(dataclasses.replace(option, help=_ENGINE_HELP[option.name],
                          metavar="PATH" if option.name in ("train", "dev") else option.metavar)
      if option.name in _ENGINE_HELP else option for option in ENGINE_OPTIONS),
    TrainOption("one_per_line", bool, False, "one document per line of each file (else one per file)"),
    # argparse formats help texts with %: a percent sign is written %%.
    TrainOption("mask_rate", float, 0.15, "share of the tokens masked for MLM, whole words at a time "
                "(80%% [MASK], 10%% random, 10%% unchanged)", "R"),
    TrainOption("cpc_sentence_rate", float, 0.1, "share of each input's sentences masked whole for CPC "
                "(at least one, never all)", "R"),
    TrainOption("min_sentences", int, 2, "skip documents with fewer sentences", "N"),
    TrainOption("max_sentence_tokens", int, 128, "longer sentences are cut into pieces of at most this many "
                "tokens, each with its own global token", "N"),
    TrainOption("eval_rows", int, 16, "inputs the held-out losses are measured on", "N"),
    TrainOption("num_proc", int, None, "processes for preparing the corpus (datasets map)", "N"),
    TrainOption("cache_dir", Path, None, "where the prepared corpus is cached (default: the datasets cache)",
                "DIR"),
    TrainOption("mlm_head_from", Path, None, "a BERT-family folder whose MLM head (cls.predictions) starts the "
                "MLM transform (default: fresh, unless --init holds pretraining heads)", "DIR"),
)


def add_arguments(parser) -> None:
    parser.add_argument("--config", metavar="FILE", help="options in a JSON or YAML file; the command line overrides it")
    add_option_arguments(parser, PRETRAINING_OPTIONS)


def run(args) -> int:
    from longdoc.train.pretraining import pretrain

    given = {option.name: getattr(args, option.name) for option in PRETRAINING_OPTIONS}
    options = resolve_options(given, PRETRAINING_OPTIONS, args.config)

    def done(result) -> str:
        shown = ", ".join(f"{key} {value:.4f}" for key, value in result.metrics.items())
        return f"encoder in {options['out']} after {result.step} steps; held-out: {shown}"

    return run_and_report("pretrain", lambda: pretrain(options, progress=args.progress), done)
