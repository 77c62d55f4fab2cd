"""`longdoc ask [--model DIR] --question TEXT PATH... [--top-k K] [--json]`: answers from long documents;
`longdoc ask --extract FILE`: the text its answers' offsets count in.

With --model a lifted extractive QA reader (or a model trained on a task that reads passages, such as
hotpotqa), answers are spans; without it, the sentences nearest to the question (longdoc.ask.session).

Without --question: questions from standard input, interactively on a terminal (a prompt, line
editing and history through readline, Ctrl-D to leave), else one per line with no prompt (with
--json, one JSON object per line). A path that cannot be read gets a one-line error, and with other
files read, a line counting both; the others are answered from. Exit status 2 where nothing could be
answered: no file read, or a question refused.
"""

import argparse
import json
import sys
from pathlib import Path

from longdoc.commands.documents import tell_unreadable
from longdoc.cpu_memory import uncache_onednn_primitives
from longdoc.model import inference
from longdoc.ask.documents import SUPPORTED_SUFFIXES
from longdoc.commands.hints import require_reader_folder
from longdoc.errors import InputError
from longdoc.commands.model_flags import add_placement_arguments, add_runtime_argument
from longdoc.export.serving import resolve_runtime

SUPPORT_SHOWN = 3  # supporting sentences printed per answer (--json has all)
SENTENCE_MODE_NOTE = ("answering with sentences (no reader given); for answer spans, lift an extractive QA "
                      "checkpoint: `longdoc lift --from QA_CHECKPOINT --out READER`, then `longdoc ask --model READER`")

HELP = f"answer questions from long documents ({', '.join(SUPPORTED_SUFFIXES)}, folders) with the answer's exact location"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from longdoc.ask.retrieve import LEAST_PASSAGES, RETRIEVERS
    from longdoc.ask.session import MIN_EVIDENCE, PASSAGES_READ

    parser.add_argument("paths", nargs="*", metavar="PATH", help=f"files ({', '.join(SUPPORTED_SUFFIXES)}) and folders")
    parser.add_argument("--extract", type=Path, metavar="FILE",
                        help="print the text that answer offsets count in for FILE (for HTML, PDF and DOCX the "
                             "extracted text; `text[start:end]` is the answer) and stop")
    parser.add_argument("--model", type=Path, metavar="DIR",
                        help="the reader: an extractive QA checkpoint lifted with `longdoc lift --from QA_CHECKPOINT "
                             "--out DIR` (BertForQuestionAnswering, RobertaForQuestionAnswering, ...), or a model "
                             "trained with `longdoc train hotpotqa|multihop`; without it, answers are the sentences "
                             "nearest to the question")
    parser.add_argument("--question", help="the question; without it, questions are read from standard input")
    parser.add_argument("--top-k", type=int, default=1, metavar="K", help="answers to show per question (default 1)")
    parser.add_argument("--passages", type=int, default=PASSAGES_READ, metavar="N",
                        help=f"the most passages retrieved and read per question (default {PASSAGES_READ}): "
                             f"{LEAST_PASSAGES} when the rankings' best passages stand out, more when they are "
                             "near-ties; documents with no more passages than N, or that fit the model's input, "
                             "are read whole")
    parser.add_argument("--retrieval", choices=list(RETRIEVERS), default="hybrid",
                        help="how passages are ranked: hybrid (default: BM25 and MiniLM taking places in turn), "
                             "bm25 (words) or minilm (sentence embeddings)")
    parser.add_argument("--read-all", action="store_true",
                        help="read every passage instead of retrieving (a QA reader reads every window of 384 "
                             "wordpieces, stride 128, as the standard sliding-window reader does): slower, for "
                             "checking what retrieval misses")
    parser.add_argument("--max-answer-len", type=int, metavar="N",
                        help="a QA reader's longest answer, in wordpieces (default: the reader's, 15)")
    parser.add_argument("--handle-impossible-answer", action="store_true",
                        help="a SQuAD 2.0 reader may answer nothing: no answer when its null score beats every span")
    parser.add_argument("--min-score", type=float, metavar="P",
                        help="drop span answers whose score is lower; none left: 'no answer found'. The score "
                             "is a trained task model's span probability x its probability of a span answer "
                             "(default 0.05), or a QA reader's span probability (default: none dropped)")
    parser.add_argument("--min-evidence", type=float, metavar="C",
                        help=f"refuse ('no answer found') when no sentence read has a cosine similarity (MiniLM) of "
                             f"at least C with the question: the document does not speak of it (default {MIN_EVIDENCE}; "
                             "-1 answers everything)")
    parser.add_argument("--no-second-hop", dest="second_hop", action="store_false",
                        help="retrieve with the question only (no second hop from the first passages)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per question (answers, support, passages, with offsets; "
                             "found_by: the rankings that chose each passage and answer, as retriever, hop, rank)")
    add_placement_arguments(parser)  # the reader's; the MiniLM retriever runs on the CPU
    add_runtime_argument(parser)


def _where(place) -> str:
    """FILE:LINE:COLUMN of a location (longdoc.ask.answers.Location), in the text offsets count in; a PDF's
    FILE:pPAGE:LINE:COLUMN."""
    return (f"{place.file}:" + ("" if place.page is None else f"p{place.page}:") + f"{place.line}:{place.column}"
            + (" (extracted text)" if place.extracted else ""))


def _print_extracted(path: Path) -> int:
    from longdoc.ask.documents import load_sources

    if path.is_dir():
        raise InputError(f"{path}: a folder; --extract takes one file")
    sources, errors = load_sources([path])
    if errors:
        raise InputError(str(errors[0]))
    sys.stdout.write(sources[0].text)
    return 0


def _one_line(text: str) -> str:
    # Display only: a sentence that starts under a heading spans two lines of its file.
    return " ".join(text.split())


def _print_result(result) -> None:
    if not result.answers:
        print("no answer found")
    for answer in result.answers:
        place = "" if answer.location.file is None else f"  at {_where(answer.location)}"
        print(f"{_one_line(answer.location.text)}  (score {answer.score:.2f}){place}")
        # A model whose supporting-fact threshold came out low marks most sentences: the best few
        # are what a reader looks at (HotpotQA questions have 2 to 4 supporting facts).
        for sentence in answer.support[:SUPPORT_SHOWN]:
            print(f"    because {_where(sentence)}: {_one_line(sentence.text)}")
        if len(answer.support) > SUPPORT_SHOWN:
            hidden = len(answer.support) - SUPPORT_SHOWN
            print(f"    ... and {hidden} more supporting sentences (--json lists them all)")
    sys.stdout.flush()


def _questions(interactive: bool):
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        while True:
            try:
                line = input("question> ")
            except EOFError:
                print(file=sys.stderr)
                return
            if line.strip():
                yield line
    else:
        for line in sys.stdin:
            if line.strip():
                yield line.rstrip("\r\n")


def run(args: argparse.Namespace) -> int:
    uncache_onednn_primitives()  # texts of every length: a shape a batch (longdoc/cpu_memory.py)
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.index import read_corpus
    from longdoc.ask.session import AskSession, ReaderPlacement, question_problem
    from longdoc.model_folder import read_model_folder
    from longdoc.tasks import REGISTRY

    if args.extract is not None:
        if args.paths or args.question is not None or args.model is not None:
            raise InputError("--extract FILE prints one file's text: give no PATH, --question or --model with it")
        return _print_extracted(args.extract)
    if not args.paths:
        raise InputError("give the documents to ask: longdoc ask [--question TEXT] PATH... (or --extract FILE)")
    if args.top_k < 1 or args.passages < 1:
        raise InputError(f"--top-k and --passages must be >= 1, got {args.top_k} and {args.passages}")
    if args.max_answer_len is not None and args.max_answer_len < 1:
        raise InputError(f"--max-answer-len must be >= 1, got {args.max_answer_len}")
    if args.question is not None and question_problem(args.question) is not None:
        raise InputError(f"--question {question_problem(args.question)}")
    folder = None
    if args.model is not None:  # a wrong folder is told before the documents are indexed
        require_reader_folder(args.model)
        folder = read_model_folder(args.model)
    device, dtype = inference.resolve_placement(args.device, args.dtype)
    runtime = "torch" if args.model is None else resolve_runtime(
        args.runtime, args.model, device, dtype if args.dtype else None, args.attention)
    embedder = SentenceEmbedder()
    sources, errors = read_corpus(args.paths, embedder)
    tell_unreadable("ask", errors, len(sources), "answering from")
    if not sources:
        return 2
    session = AskSession(sources, folder, passages=args.passages, second_hop=args.second_hop,
                         progress=args.progress, placement=ReaderPlacement(device, dtype, args.attention, runtime),
                         tasks=REGISTRY, named_by=args.paths, embedder=embedder)
    changes = session.corpus.changes.describe()
    if changes is not None and args.progress:
        print(f"longdoc ask: index updated: {changes}", file=sys.stderr)
    if session.mode == "sentence":
        print(f"longdoc ask: {SENTENCE_MODE_NOTE}", file=sys.stderr)
    else:  # which reader answers: the one given, never one found elsewhere
        kind = "a lifted extractive QA reader" if session.reading is None else f"a trained {folder.task} model"
        print(f"longdoc ask: reading with {args.model} ({kind}, runtime {runtime})", file=sys.stderr)
        generated = folder.generated_data_note()
        if generated is not None:
            print(f"longdoc ask: note: {args.model}'s model card says it was trained on generated data "
                  f"({generated!r}): its answers on real documents may be wrong", file=sys.stderr)
    refused = False
    questions = [args.question] if args.question is not None else _questions(sys.stdin.isatty())
    for question in questions:
        problem = question_problem(question)
        if problem is not None:  # one of standard input's: told, and the others answered
            print(f"longdoc ask: error: a question of standard input {problem}", file=sys.stderr)
            refused = True
            continue
        result = session.answer(question, top_k=args.top_k, min_score=args.min_score, min_evidence=args.min_evidence,
                             max_answer_len=args.max_answer_len, handle_impossible=args.handle_impossible_answer,
                             retrieval=args.retrieval, read_all=args.read_all)
        if args.json:
            print(json.dumps(result.to_json(), ensure_ascii=False), flush=True)
        else:
            _print_result(result)
    return 2 if refused else 0
