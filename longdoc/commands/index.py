"""`longdoc index PATH...`: builds or updates the corpus index that `longdoc ask PATH...` and
`longdoc serve PATH...` answer from (longdoc.ask.index), with a progress bar of files, words and
words a second.

Only what changed is indexed (a file whose size, times and inode are as recorded is not even read;
longdoc.ask.index): new and changed files, in chunks each committed whole, so a run
stopped by Ctrl-C or killed keeps the chunks committed, and running it again goes on from there.
A path that cannot be read gets a one-line error, and with other files read, a line counting both;
the others are indexed. Exit status 2 where no file could be read.
"""

import argparse
import sys

from longdoc.ask.documents import SUPPORTED_SUFFIXES
from longdoc.commands import INTERRUPTED_STATUS
from longdoc.commands.documents import tell_unreadable
from longdoc.cpu_memory import uncache_onednn_primitives
from longdoc.errors import InputError

HELP = (f"index documents ({', '.join(SUPPORTED_SUFFIXES)}, folders) for `longdoc ask` and `longdoc serve` "
        "with the same paths: only new and changed files are indexed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help=f"files ({', '.join(SUPPORTED_SUFFIXES)}) and folders")


def run(args: argparse.Namespace) -> int:
    uncache_onednn_primitives()  # texts of every length: a shape a batch (longdoc/cpu_memory.py)
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.index import corpus_store, read_corpus

    if not args.paths:
        raise InputError("give the documents to index: longdoc index PATH...")
    embedder = SentenceEmbedder()
    sources, errors = read_corpus(args.paths, embedder)
    tell_unreadable("index", errors, len(sources), "indexing")
    if not sources:
        return 2
    store = corpus_store(sources, embedder, named_by=args.paths)
    try:
        changes = store.update(sources, embedder, progress=args.progress)
    except KeyboardInterrupt:
        print(f"longdoc index: interrupted; {store.committed} of the files indexed by this run are kept in "
              f"{store.path}; running it again goes on from them", file=sys.stderr)
        return INTERRUPTED_STATUS
    files = "file" if len(sources) == 1 else "files"
    print(f"longdoc index: {len(sources)} {files} in {store.path}: {changes.describe() or 'nothing changed'}")
    return 0
