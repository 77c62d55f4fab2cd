"""`longdoc lift --from SRC --out DIR`: a BERT-family checkpoint -> a global-local checkpoint; a
transformers extractive QA checkpoint -> a span reader."""

import argparse

HELP = ("turn a BERT-family checkpoint (transformers folder or hub id) into a global-local checkpoint, "
        "a QA checkpoint (BertForQuestionAnswering, ...) into a span reader")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Options left out take the defaults for what SRC is (longdoc.convert.lift.default_options):
    # ETC-base's for an encoder, the source's own computation for a QA reader.
    parser.add_argument("--from", dest="source", required=True, metavar="SRC",
                        help="transformers checkpoint folder, or a hub id where a hub is reachable")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to create (must not exist, or be empty)")
    parser.add_argument("--positions", choices=("relative", "absolute", "both"),
                        help="relative: ETC tables, fresh; absolute: source table tiled to the long length; both "
                             "(default: relative for an encoder, absolute for a QA reader)")
    parser.add_argument("--residual-attention", action=argparse.BooleanOptionalAction,
                        help="RealFormer residual attention (default: on for an encoder, off for a QA reader)")
    parser.add_argument("--talking-heads", action="store_true", default=None,
                        help="talking-heads attention (identity at start)")
    parser.add_argument("--radius", dest="local_radius", type=int, help="local attention radius (default: 84)")
    parser.add_argument("--long-max-len", type=int, help="long input length (default: 4096)")
    parser.add_argument("--global-max-len", type=int, help="global input length (default: 256)")
    parser.add_argument("--seed", type=int, help="seed for the freshly initialised tables (default: 0)")
    parser.add_argument("--json", action="store_true",
                        help="print what was written as one JSON object (out, kind, source, architecture, options)")


def run(args: argparse.Namespace) -> int:
    import json
    from dataclasses import fields

    from longdoc.convert.lift import LiftOptions, lift
    from longdoc.model.span_reader import SpanReader

    names = ("positions", "residual_attention", "talking_heads", "local_radius", "long_max_len", "global_max_len",
             "seed")
    chosen = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    out = lift(args.source, args.out, chosen)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    architecture = config["architectures"][0]
    if args.json:
        # The options the folder was lifted with, as its config records them; the seed is not recorded there.
        options = {option.name: config["position_embedding_type" if option.name == "positions" else option.name]
                   for option in fields(LiftOptions) if option.name != "seed"}
        options["seed"] = chosen.get("seed", LiftOptions.seed)
        print(json.dumps({"out": str(out), "kind": "span reader" if architecture == SpanReader.__name__ else "encoder",
                          "source": args.source, "architecture": architecture, "options": options,
                          "model_card": str(out / "README.md")}))
        return 0
    residual = "on" if config["residual_attention"] else "off"
    print(f"lifted {args.source} -> {out} ({architecture}, {config['position_embedding_type']} "
          f"positions, residual attention {residual}); model card: {out / 'README.md'}")
    return 0
