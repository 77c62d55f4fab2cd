"""`longdoc lift --from SRC --out DIR`: a BERT/RoBERTa/MiniLM checkpoint -> a global-local checkpoint."""

import argparse

HELP = "turn a BERT-family checkpoint (transformers folder or hub id) into a global-local checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Defaults are ETC-base's (LiftOptions); they are repeated here only as argparse defaults.
    parser.add_argument("--from", dest="source", required=True, metavar="SRC",
                        help="transformers checkpoint folder, or a hub id where a hub is reachable")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to create (must not exist, or be empty)")
    parser.add_argument("--positions", choices=("relative", "absolute", "both"), default="relative",
                        help="relative: ETC tables, fresh; absolute: source table tiled to the long length; both "
                             "(default: relative)")
    parser.add_argument("--residual-attention", action=argparse.BooleanOptionalAction, default=True,
                        help="RealFormer residual attention (default: on)")
    parser.add_argument("--talking-heads", action="store_true", help="talking-heads attention (identity at start)")
    parser.add_argument("--radius", type=int, default=84, help="local attention radius (default: 84)")
    parser.add_argument("--long-max-len", type=int, default=4096, help="long input length (default: 4096)")
    parser.add_argument("--global-max-len", type=int, default=256, help="global input length (default: 256)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the freshly initialised tables (default: 0)")


def run(args: argparse.Namespace) -> int:
    from longdoc.convert.lift import LiftOptions, lift

    options = LiftOptions(
        positions=args.positions,
        residual_attention=args.residual_attention,
        talking_heads=args.talking_heads,
        local_radius=args.radius,
        long_max_len=args.long_max_len,
        global_max_len=args.global_max_len,
        seed=args.seed,
    )
    out = lift(args.source, args.out, options)
    print(f"lifted {args.source} -> {out} ({options.positions} positions); model card: {out / 'README.md'}")
    return 0
