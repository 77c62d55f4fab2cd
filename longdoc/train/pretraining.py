"""The job of `longdoc pretrain`: continued pretraining of a global-local encoder on the training engine.

The corpus and the masking of each batch are `longdoc.data.pretraining_corpus`, the model and its
losses (whole-word masked LM plus CPC over sentence globals, as ETC pretrains) are
`longdoc.model.pretraining`. `build_pretraining_job` reads the corpus, starts the model from
`--init` (`GlobalLocalForPretraining.from_encoder`) and hands `longdoc.train.engine` the rows, the
collator, a held-out evaluation and the writer of the output folder (a bare encoder that `--init`
takes, its tokenizer and the pretraining heads).
"""

import sys
import warnings
from collections import Counter
from pathlib import Path

import torch

from longdoc.data.pretraining_corpus import (
    PretrainingCollator,
    PretrainingSettings,
    cpc_sentence_count,
    prepare_corpus,
    read_corpus,
)
from longdoc.errors import OptionWarning
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.pretraining import HEADS_FILE, GlobalLocalForPretraining
from longdoc.train.options import PretrainingOptions


PRETRAINING_NAME = "pretrain"
# The fixed seed of the held-out batches' masking (drawn in a forked RNG, so evaluating never moves
# the training run's random streams, and every evaluation masks the same way).
EVALUATION_SEED = 1234
EVALUATION_FILE = "pretraining_eval.json"
# Logged every --log-steps beside the loss (train_log.jsonl), each the mean over the batches that
# have it: loss = mlm_loss + cpc_loss when every batch of the window has a CPC task (a batch with
# fewer than 2 CPC sentences has none, and adds mlm_loss alone to the loss).
LOGGED_OUTPUTS = ("mlm_loss", "mlm_accuracy", "cpc_loss", "cpc_accuracy")


def settings_from_options(options, config: GlobalLocalConfig) -> PretrainingSettings:
    return PretrainingSettings(
        long_length=config.long_max_len, global_max_len=config.global_max_len,
        max_sentence_tokens=options.max_sentence_tokens, min_sentences=options.min_sentences,
        mask_rate=options.mask_rate, cpc_sentence_rate=options.cpc_sentence_rate,
    )


def _prepared(path, tokenizer, settings, options, what: str):
    documents = read_corpus(path, one_per_line=options.one_per_line, cache_dir=options.cache_dir)
    inputs, report = prepare_corpus(documents, tokenizer, settings, num_proc=options.num_proc)
    print(f"longdoc pretrain: {what} {path}: {report.inputs} input(s), {report.sentences} sentences, "
          f"{report.tokens} tokens from {report.kept_documents} of {report.documents} document(s) in "
          f"{report.files} file(s); skipped {report.skipped_text(settings.min_sentences)}", file=sys.stderr)
    return inputs


def evaluate_losses(model: GlobalLocalForPretraining, rows, collate, batch_size: int) -> dict[str, float]:
    """Mean MLM and CPC losses and accuracies over `rows`, each batch masked with a fixed seed (the
    same masks at every evaluation, so the numbers are comparable along a run and across runs)."""
    totals: Counter = Counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EVALUATION_SEED)
        for start in range(0, len(rows), batch_size):
            batch = collate([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            device = next(model.parameters()).device
            output = model(**{name: value.to(device) for name, value in batch.items()})
            mlm, cpc = int(output.mlm_tokens), int(output.cpc_sentences)
            totals.update(mlm_tokens=mlm, mlm_loss=float(output.mlm_loss) * mlm,
                          mlm_correct=float(output.mlm_accuracy) * mlm)
            if cpc >= 2:
                # CPC is a batch-level task (its candidates are the batch's sentences): averaged per batch.
                totals.update(cpc_batches=1, cpc_candidates=cpc, cpc_loss=float(output.cpc_loss),
                              cpc_accuracy=float(output.cpc_accuracy))
    result = {
        "mlm_loss": totals["mlm_loss"] / max(1, totals["mlm_tokens"]),
        "mlm_accuracy": totals["mlm_correct"] / max(1, totals["mlm_tokens"]),
    }
    if totals["cpc_batches"]:
        result.update(cpc_loss=totals["cpc_loss"] / totals["cpc_batches"],
                      cpc_accuracy=totals["cpc_accuracy"] / totals["cpc_batches"],
                      cpc_candidates=totals["cpc_candidates"] / totals["cpc_batches"])
    result["loss"] = result["mlm_loss"] + result.get("cpc_loss", 0.0)
    return result


def _warn_when_cpc_cannot_train(rows, settings: PretrainingSettings, batch_size: int) -> None:
    """CPC tells a masked sentence from the other CPC sentences of its forward pass: with fewer than
    2 in every pass (one row per pass, one CPC sentence per row) it never trains; say so up front."""
    if settings.cpc_sentence_rate == 0:
        return  # CPC switched off on purpose
    most = max(cpc_sentence_count(n, settings.cpc_sentence_rate) for n in rows["num_sentences"])
    if batch_size * most < 2:
        warnings.warn(OptionWarning(
            "CPC is not trained: a forward pass of {batch_size} {batch} holds at most {most} CPC sentence(s) (inputs "
            "of up to {sentences} sentences at {cpc_sentence_rate} {rate}) and needs 2, one to find and one to tell "
            "it from; raise {batch_size} or {cpc_sentence_rate}", batch=batch_size, most=batch_size * most,
            sentences=max(rows["num_sentences"]), rate=settings.cpc_sentence_rate), stacklevel=2)


def build_pretraining_job(options: PretrainingOptions, progress: bool = True):
    """The TrainingJob of `longdoc pretrain` with resolved options: the engine's and the corpus and
    masking ones; `progress`: show the training bar."""
    from longdoc.io import atomic_write_json
    from longdoc.model_folder import read_tokenizer
    from longdoc.convert.pretrained import initial_weights
    from longdoc.train.engine import TrainingJob
    init_dir = initial_weights(options)
    tokenizer = read_tokenizer(init_dir)
    encoder_config = options.encoder_settings()
    encoder_config.setdefault("residual_attention", True)
    torch.manual_seed(options.seed)  # fresh heads: the same on every process and every rerun
    model = GlobalLocalForPretraining.from_encoder(init_dir, encoder_config=encoder_config,
                                                   mlm_head_from=options.mlm_head_from)
    settings = settings_from_options(options, model.config)
    rows = _prepared(options.train, tokenizer, settings, options, "corpus")
    held_out = _prepared(options.dev, tokenizer, settings, options, "held-out corpus") \
        if options.dev is not None else rows
    held_out = held_out.select(range(min(options.eval_rows, len(held_out))))
    _warn_when_cpc_cannot_train(rows, settings, options.batch_size)
    collate = PretrainingCollator(tokenizer, settings, model.config)

    def evaluate(trained: GlobalLocalForPretraining, folder: Path) -> dict[str, float]:
        sums = trained.training_sums
        metrics = evaluate_losses(trained, held_out, collate, options.eval_batch_size or options.batch_size)
        if sums["batches"]:
            metrics["train_mlm_loss"] = sums["mlm_loss"] / sums["batches"]
        if sums["cpc_batches"]:
            # Over the batches that had a CPC task: one without (fewer than 2 sentences) adds no zero.
            metrics["train_cpc_loss"] = sums["cpc_loss"] / sums["cpc_batches"]
        sums.clear()
        atomic_write_json(folder / EVALUATION_FILE, metrics)
        return metrics

    def save(trained: GlobalLocalForPretraining, folder: Path, state_dict: dict) -> None:
        save_encoder(folder, trained, tokenizer, state_dict)

    return TrainingJob(name=PRETRAINING_NAME, model=model, rows=rows, collate=collate, out_dir=Path(options.out),
                       options=options, evaluate=evaluate, save_model=save, logged_outputs=LOGGED_OUTPUTS,
                       progress=progress)


def save_encoder(folder: Path, model: GlobalLocalForPretraining, tokenizer=None, state_dict: dict | None = None) -> None:
    """The bare encoder (GlobalLocalModel: config.json, model.safetensors) that `--init` takes, its
    tokenizer and the pretraining heads (HEADS_FILE) into `folder` (longdoc.model_folder)."""
    from longdoc.model_folder import save_model

    encoder_state, heads = model.split_state_dict(state_dict)
    save_model(folder, model.encoder, tokenizer, state_dict=encoder_state, extra_weights={HEADS_FILE: heads})


def pretrain(options: PretrainingOptions, progress: bool = True):
    """Continued pretraining with resolved `options`; returns the engine's TrainingResult."""
    from longdoc.train.engine import run_training

    return run_training(build_pretraining_job(options, progress))
