"""`longdoc leaderboard DIR... [--json]`: one table per task from the runs' metrics.json files."""

from longdoc.errors import InputError

HELP = "rank runs (their metrics.json files) per task beside the published ETC figures"


def add_arguments(parser) -> None:
    parser.add_argument("paths", metavar="DIR", nargs="+",
                        help="run folders (searched recursively for metrics.json) or metrics.json files")
    parser.add_argument("--json", action="store_true", help="print the tables as one JSON object, every digit kept")
    parser.add_argument("--columns", metavar="KEY,...",
                        help="metric columns to show after the headline metric (default: all)")


def run(args) -> int:
    from longdoc.evaluate.leaderboard import build_leaderboards, find_runs, leaderboards_json, leaderboards_markdown
    from longdoc.tasks import REGISTRY

    runs = find_runs(args.paths, REGISTRY)
    if not runs:
        raise InputError(f"no metrics.json found under {', '.join(args.paths)}")
    columns = [key.strip() for key in args.columns.split(",") if key.strip()] if args.columns else None
    boards = build_leaderboards(runs, REGISTRY, columns=columns)
    print(leaderboards_json(boards) if args.json else leaderboards_markdown(boards))
    return 0
