"""`longdoc convert etc|realformer --from DIR --out DIR`: Google's released TF checkpoints -> longdoc models.

`etc`: an ETC checkpoint folder (etcmodel: `model.ckpt-N.*`, `etc_config.json`, the vocabulary) ->
a GlobalLocalModel folder. `realformer`: a RealFormer checkpoint folder (`model.ckpt-N.*`,
`bert_config.json`, `vocab.txt`) -> a dense-equivalent GlobalLocalModel with residual attention and,
where the checkpoint has it, the MLM head for `longdoc pretrain --init`. TensorFlow is not needed.
Bad input (no checkpoint, a damaged shard, a config field longdoc cannot honour, the other family's
checkpoint) is one line naming the file or field, exit status 2, and nothing under --out.
"""

import argparse
import json
import sys
import time

HELP = "convert Google's ETC or RealFormer TF checkpoint into a longdoc model folder (no TensorFlow needed)"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive length, got {text}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", required=True, metavar="DIR",
                        help="the released checkpoint folder (model.ckpt-N.index and .data-* files, config, vocabulary), "
                             "or the checkpoint's prefix DIR/model.ckpt-N")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to create (must not exist, or be empty)")
    parser.add_argument("--vocab", metavar="FILE",
                        help="the vocabulary, a WordPiece vocab.txt or a SentencePiece *.model (default: the folder's "
                             "vocab.txt, its only *vocab*.txt or its only *.model)")
    parser.add_argument("--lower-case", action=argparse.BooleanOptionalAction, default=True,
                        help="lower-case text before WordPiece, as BERT uncased (default: on); a SentencePiece "
                             "model normalizes text by its own rules, as etcmodel's tokenizer does")
    parser.add_argument("--json", action="store_true", help="print the conversion summary as one JSON object")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    families = parser.add_subparsers(dest="family", required=True, metavar="FAMILY")
    etc = families.add_parser("etc", help="an ETC checkpoint (etcmodel, etc_config.json)",
                              description="an ETC checkpoint (etcmodel, etc_config.json) -> a longdoc model folder")
    _common(etc)
    # Defaults are LengthOptions' (ETC's pretraining lengths), repeated here as argparse defaults.
    etc.add_argument("--long-max-len", type=_positive, default=4096, help="long input length the model accepts (default: 4096)")
    etc.add_argument("--global-max-len", type=_positive, default=256, help="global input length the model accepts (default: 256)")
    etc.add_argument("--encoder-only", action="store_true",
                     help="convert the encoder and drop the variables outside etc_document_bert/ (a pretraining "
                          "checkpoint's MLM/CPC heads, which etcmodel's released code does not name; listed in the "
                          "model card); without it they are an error naming them")
    realformer = families.add_parser("realformer", help="a RealFormer checkpoint (BERT with residual attention)",
                                     description="a RealFormer checkpoint (bert_config.json) -> a longdoc model folder")
    _common(realformer)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    progress = args.progress and sys.stderr.isatty() and not args.json
    if args.family == "etc":
        from longdoc.convert.etc import LengthOptions, convert_etc

        summary = convert_etc(args.source, args.out, LengthOptions(args.long_max_len, args.global_max_len),
                              vocab=args.vocab, lower_case=args.lower_case, progress=progress,
                              encoder_only=args.encoder_only)
    else:
        from longdoc.convert.realformer import convert_realformer

        summary = convert_realformer(args.source, args.out, vocab=args.vocab, lower_case=args.lower_case,
                                     progress=progress)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        heads = " and pretraining heads" if summary["pretraining_heads"] else ""
        print(f"converted {args.family} {summary['checkpoint']} ({summary['variables_read']} variables, "
              f"{summary['bytes_read'] / 1e6:.1f} MB) -> {summary['out']}: encoder{heads}, tokenizer, "
              f"model card ({len(summary['dropped'])} dropped variables: see README.md) "
              f"in {summary['seconds']} s")
    return 0
