"""`longdoc pretrain --train CORPUS --out DIR [options]`: continued pretraining (whole-word MLM + CPC over
sentence global tokens) of a global-local encoder on plain text, on the one training engine; under
torchrun it trains data-parallel. The output folder is an encoder that `--init` of any task accepts.

The options are `longdoc.train.options.PretrainingOptions`: the engine's (the corpus is --train,
residual attention is on unless --no-residual-attention) plus the corpus and masking options, whose
defaults are those of `longdoc.data.pretraining_corpus.PretrainingSettings` (a test keeps the two
equal; this module imports no torch, so `longdoc --help` stays fast). Some of the engine's flags
say here what they mean for pretraining.
"""

import dataclasses

from longdoc.commands.train import add_option_arguments, run_and_report
from longdoc.data.options import options_of
from longdoc.train.options import PretrainingOptions, resolve_options

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

# The options as flags, the engine's with their pretraining help.
PRETRAINING_FLAGS = tuple(
    dataclasses.replace(option, help=_ENGINE_HELP[option.name],
                        metavar="PATH" if option.name in ("train", "dev") else option.metavar)
    if option.name in _ENGINE_HELP else option for option in options_of(PretrainingOptions))


def add_arguments(parser) -> None:
    parser.add_argument("--config", metavar="FILE", help="options in a JSON or YAML file; the command line overrides it")
    add_option_arguments(parser, PRETRAINING_FLAGS)


def run(args) -> int:
    from longdoc.train.pretraining import pretrain

    given = {option.name: getattr(args, option.name) for option in PRETRAINING_FLAGS}
    (options,) = resolve_options(given, (PretrainingOptions,), args.config)

    def done(result) -> str:
        shown = ", ".join(f"{key} {value:.4f}" for key, value in result.metrics.items())
        return f"encoder in {options.out} after {result.step} steps; held-out: {shown}"

    return run_and_report("pretrain", lambda: pretrain(options, progress=args.progress), done)
