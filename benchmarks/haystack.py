"""`longdoc ask` against Haystack, the framework users would pick instead, on the same corpus, questions
and weights (scripts/bench_haystack.py).

The corpus is the HotpotQA sample's paragraphs, one file each (a title line, then its sentences;
each title once, as `benchmarks.ask.hotpotqa_document` joins them), and the questions are the
sample's, with their gold answers and the files of their gold supporting paragraphs.

Each contender is a command line run as its users run it, each step in a fresh process:
- index: the corpus indexed from nothing (for `longdoc`, `longdoc index` where the command has it,
  else the first `longdoc ask`, which indexes then answers one question);
- first question: one question asked of the indexed corpus by a fresh process, start to exit;
- one process: every question on standard input, one JSON object printed per question; a question
  takes (last answer's arrival - first answer's) / (questions - 1), so loading is left out.
The answers printed in that one process are scored against the gold: HotpotQA's exact match and
F1 of the first answer (`longdoc.evaluate.answers`, the official rules), whether it holds the gold
answer, and retrieval hits: how often one, and how often all, of a question's gold supporting
paragraphs are among the passages read.

The Haystack side runs this module (`python -m benchmarks.haystack index|ask`) under the Python
where haystack-ai is installed, which the project does not depend on (with Haystack 3 also its
sentence-transformers-haystack and transformers-haystack integrations, where the embedders and the
extractive reader now live): the in-memory document store, its BM25 retriever and its embedding
retriever over the sentence-transformers embedders on MiniLM's weights (the folder longdoc reads),
both rankings fused by reciprocal rank into as many documents as `ask` reads at least (8), then
the extractive reader on the QA checkpoint that `longdoc lift` lifted (or, without one, the best
document as the answer). So the module imports nothing beyond the standard library at its top.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSAGES = 8  # Haystack's documents per question: `longdoc ask`'s least passages read (longdoc.ask.retrieve)


@dataclass(frozen=True)
class GoldQuestion:
    question: str
    answer: str
    supporting_files: frozenset[str]  # names of the files holding its gold supporting paragraphs


@dataclass(frozen=True)
class Corpus:
    folder: Path
    files: tuple[str, ...]
    questions: tuple[GoldQuestion, ...]


def write_paragraph_files(data: Path, folder: Path, records: int | None = None) -> Corpus:
    """One file per paragraph of the HotpotQA file `data` (of its first `records` questions, all by
    default), named 0001.txt, 0002.txt, ... in the order titles first appear, each title once: the
    title line, then the sentences joined as they are, then a newline."""
    examples = json.loads(Path(data).read_text(encoding="utf-8"))[:records]
    folder.mkdir(parents=True, exist_ok=True)
    file_of: dict[str, str] = {}
    for example in examples:
        for title, sentences in example["context"]:
            if title not in file_of:
                file_of[title] = f"{len(file_of) + 1:04d}.txt"
                (folder / file_of[title]).write_text(title + "\n" + "".join(sentences) + "\n", encoding="utf-8")
    questions = tuple(GoldQuestion(example["question"], example["answer"],
                                   frozenset(file_of[title] for title, _ in example["supporting_facts"]))
                      for example in examples)
    return Corpus(folder, tuple(file_of.values()), questions)


@dataclass(frozen=True)
class Contender:
    name: str
    index_command: tuple[str, ...]  # builds its index of the corpus from nothing
    ask_command: tuple[str, ...]  # answers `--question Q`, else each line of standard input: one JSON object each
    environment: dict[str, str]
    index_step: str  # what index_command does, for the table


@dataclass(frozen=True)
class TimedLines:
    arrivals: list[float]  # seconds from the process's start to each line of its standard output
    lines: list[str]
    seconds: float  # start to exit


def run_timed(command, environment: dict[str, str], input_text: str = "") -> TimedLines:
    """Run `command` from the checkout's root with `input_text` on standard input, stamping each line
    it prints; a failure raises with the end of what it wrote on standard error."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as errors:
        start = time.perf_counter()
        process = subprocess.Popen(list(command), cwd=ROOT, env=environment, text=True, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=errors)
        process.stdin.write(input_text)
        process.stdin.close()
        arrivals, lines = [], []
        for line in process.stdout:
            arrivals.append(time.perf_counter() - start)
            lines.append(line)
        status = process.wait()
        seconds = time.perf_counter() - start
        if status != 0:
            errors.seek(0)
            tail = errors.read()[-2000:]
            raise RuntimeError(f"{' '.join(command)} exited {status}:\n{tail}")
    return TimedLines(arrivals, lines, seconds)


def longdoc_has_index_command(environment: dict[str, str]) -> bool:
    return subprocess.run(["longdoc", "index", "--help"], env=environment, capture_output=True).returncode == 0


def fresh_longdoc_cache(work: Path) -> Path:
    """An empty longdoc cache for ask's indexes, sharing the user's compiled kernels and lifted
    weights (named by what they were built from), so indexing is measured and not a kernel build."""
    from longdoc.model.cache import cache_dir

    folder = Path(tempfile.mkdtemp(prefix="longdoc-cache-", dir=work))
    for name in ("kernels", "lifted"):
        (cache_dir() / name).mkdir(parents=True, exist_ok=True)
        (folder / name).symlink_to(cache_dir() / name, target_is_directory=True)
    return folder


def quiet_environment(**variables: str) -> dict[str, str]:
    """Both sides' processes: nothing fetched from the Hub, no telemetry, answers printed as they come."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HAYSTACK_TELEMETRY_ENABLED": "False", "PYTHONUNBUFFERED": "1",
            **variables}


def longdoc_contender(name: str, corpus: Corpus, work: Path, reader: Path | None = None) -> Contender:
    environment = quiet_environment(LONGDOC_CACHE=str(fresh_longdoc_cache(work)))
    ask = ("longdoc", "ask", "--json", *(("--model", str(reader)) if reader else ()), str(corpus.folder))
    if longdoc_has_index_command(environment):
        return Contender(name, ("longdoc", "index", str(corpus.folder)), ask, environment, "longdoc index")
    return Contender(name, (*ask, "--question", corpus.questions[0].question), ask, environment,
                     "first longdoc ask (indexing + one question)")


def haystack_contender(name: str, python: str, work: Path, corpus: Corpus, embedder: Path,
                       reader: Path | None = None, passages: int = PASSAGES) -> Contender:
    store = Path(tempfile.mkdtemp(prefix="haystack-", dir=work)) / "store.json"
    peer = (python, "-m", "benchmarks.haystack")
    models = ("--store", str(store), "--embedder", str(embedder))
    ask = (*peer, "ask", *models, "--passages", str(passages), *(("--reader", str(reader)) if reader else ()))
    return Contender(name, (*peer, "index", *models, str(corpus.folder)), ask, quiet_environment(),
                     "index (embed + write the store to disk)")


def haystack_versions(python: str) -> dict[str, str] | None:
    """The versions of haystack-ai, its sentence-transformers and transformers integrations and what they
    run on, as `python` imports them; None where it has no haystack."""
    script = ("import importlib.metadata as m, json, haystack; "
              "print(json.dumps({p: m.version(p) for p in ('haystack-ai', 'sentence-transformers-haystack', "
              "'transformers-haystack', 'sentence-transformers', 'transformers', 'torch')}))")
    done = subprocess.run([python, "-c", script], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else None


def answer_figures(corpus: Corpus, results: list[dict]) -> dict[str, float]:
    """HotpotQA exact match and F1 of each question's first answer, how often it holds the gold answer,
    retrieval hits (one / all gold supporting paragraphs among the passages read) and passages read,
    each a mean over the questions; `results[i]` answers `corpus.questions[i]`."""
    from longdoc.evaluate.answers import answer_scores, normalize_answer

    totals = dict.fromkeys(("em", "f1", "holds_gold", "retrieval_one", "retrieval_all", "passages_read"), 0.0)
    for gold, result in zip(corpus.questions, results, strict=True):
        text = result["answers"][0]["text"] if result["answers"] else ""
        scores = answer_scores(text, gold.answer)
        read = {Path(passage["file"]).name for passage in result["passages"]}
        totals["em"] += scores.em
        totals["f1"] += scores.f1
        totals["holds_gold"] += f" {normalize_answer(gold.answer)} " in f" {normalize_answer(text)} "
        totals["retrieval_one"] += bool(gold.supporting_files & read)
        totals["retrieval_all"] += gold.supporting_files <= read
        totals["passages_read"] += len(result["passages"])
    return {key: value / len(results) for key, value in totals.items()}


def measure(contender: Contender, corpus: Corpus, first_runs: int = 3) -> dict:
    """One contender's row: index, then `first_runs` questions each in a fresh process, then every
    question in one process; seconds rounded to 0.01, fractions to 0.001."""
    index = run_timed(contender.index_command, contender.environment)
    firsts = [run_timed((*contender.ask_command, "--question", gold.question), contender.environment).seconds
              for gold in corpus.questions[:first_runs]]
    questions = [gold.question for gold in corpus.questions]
    stream = run_timed(contender.ask_command, contender.environment, "".join(q + "\n" for q in questions))
    results = [json.loads(line) for line in stream.lines]
    if len(results) != len(questions):
        raise RuntimeError(f"{contender.name}: {len(results)} answers printed for {len(questions)} questions")
    per_question = (stream.arrivals[-1] - stream.arrivals[0]) / (len(questions) - 1) if len(questions) > 1 else None
    figures = answer_figures(corpus, results)
    return {"system": contender.name, "index_step": contender.index_step, "index_s": round(index.seconds, 2),
            "first_question_s": round(statistics.median(firsts), 2), "first_runs": " ".join(f"{s:.2f}" for s in firsts),
            "per_question_s": None if per_question is None else round(per_question, 3),
            "questions": len(questions), **{key: round(value, 3) for key, value in figures.items()},
            "answers": [result["answers"][0]["text"] if result["answers"] else "" for result in results]}


TABLE_COLUMNS = ("system", "index_s", "first_question_s", "per_question_s", "questions", "em", "f1", "holds_gold",
                 "retrieval_one", "retrieval_all", "passages_read")


def side_by_side(rows: list[dict]) -> str:
    """The rows as one markdown table of TABLE_COLUMNS."""
    from longdoc.evaluate.tables import markdown_table

    return markdown_table(list(TABLE_COLUMNS), [[row[column] for column in TABLE_COLUMNS] for row in rows])


def answers_table(corpus: Corpus, rows: list[dict]) -> str:
    """Each question's gold answer beside each contender's first answer (cut to 60 characters)."""
    from longdoc.evaluate.tables import markdown_table

    def cell(text: str) -> str:
        flat = " ".join(text.split()).replace("|", "/")
        return flat if len(flat) <= 60 else flat[:57] + "..."

    return markdown_table(["question", "gold", *(row["system"] for row in rows)],
                          [[cell(gold.question), cell(gold.answer), *(cell(row["answers"][i]) for row in rows)]
                           for i, gold in enumerate(corpus.questions)])


# The Haystack side: run as `python -m benchmarks.haystack` under the Python that has haystack-ai.

def _haystack_index(args) -> None:
    from haystack import Document
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import ComponentDevice
    from haystack_integrations.components.embedders.sentence_transformers import SentenceTransformersDocumentEmbedder

    paths = sorted(Path(args.folder).glob("*.txt"))
    documents = [Document(content=path.read_text(encoding="utf-8"), meta={"file": path.name}) for path in paths]
    embedder = SentenceTransformersDocumentEmbedder(model=str(args.embedder), device=ComponentDevice.from_str("cpu"),
                                                    progress_bar=False, local_files_only=True)
    embedder.warm_up()
    store = InMemoryDocumentStore()
    store.write_documents(embedder.run(documents)["documents"])
    partial = args.store.with_name(args.store.name + ".partial")
    store.save_to_disk(str(partial))
    os.replace(partial, args.store)
    print(json.dumps({"documents": len(documents)}))


def _haystack_pipeline(args):
    from haystack import Pipeline
    from haystack.components.joiners import DocumentJoiner
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import ComponentDevice
    from haystack_integrations.components.embedders.sentence_transformers import SentenceTransformersTextEmbedder
    from haystack_integrations.components.readers.transformers import TransformersExtractiveReader

    cpu = ComponentDevice.from_str("cpu")
    store = InMemoryDocumentStore.load_from_disk(str(args.store))
    pipeline = Pipeline()
    pipeline.add_component("text_embedder", SentenceTransformersTextEmbedder(model=str(args.embedder), device=cpu,
                                                                              progress_bar=False, local_files_only=True))
    pipeline.add_component("bm25", InMemoryBM25Retriever(store, top_k=args.passages))
    pipeline.add_component("embedding", InMemoryEmbeddingRetriever(store, top_k=args.passages))
    pipeline.add_component("joiner", DocumentJoiner(join_mode="reciprocal_rank_fusion", top_k=args.passages))
    pipeline.connect("text_embedder.embedding", "embedding.query_embedding")
    pipeline.connect("bm25", "joiner")
    pipeline.connect("embedding", "joiner")
    if args.reader:
        pipeline.add_component("reader", TransformersExtractiveReader(model=str(args.reader), device=cpu, top_k=1,
                                                                      no_answer=False))
        pipeline.connect("joiner", "reader")
    pipeline.warm_up()
    return pipeline


def _haystack_answer(pipeline, question: str, with_reader: bool) -> dict:
    inputs = {"text_embedder": {"text": question}, "bm25": {"query": question}}
    if with_reader:
        inputs["reader"] = {"query": question}
    output = pipeline.run(inputs, include_outputs_from={"joiner"})
    documents = output["joiner"]["documents"]
    if with_reader:
        answers = [{"text": answer.data, "score": answer.score, "file": answer.document.meta["file"]}
                   for answer in output["reader"]["answers"] if answer.data is not None]
    else:  # no reader: the best document is the answer
        answers = [{"text": document.content, "score": document.score, "file": document.meta["file"]}
                   for document in documents[:1]]
    return {"question": question, "answers": answers,
            "passages": [{"file": document.meta["file"], "score": document.score} for document in documents]}


def _haystack_ask(args) -> None:
    pipeline = _haystack_pipeline(args)
    questions = [args.question] if args.question is not None else (line.strip() for line in sys.stdin)
    for question in questions:
        if question:
            print(json.dumps(_haystack_answer(pipeline, question, args.reader is not None), ensure_ascii=False),
                  flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the Haystack side of scripts/bench_haystack.py")
    steps = parser.add_subparsers(dest="step", required=True)
    index = steps.add_parser("index", help="embed every .txt file of FOLDER into an in-memory store saved as --store")
    index.add_argument("folder", type=Path)
    ask = steps.add_parser("ask", help="answer --question, else each line of standard input, as JSON lines")
    ask.add_argument("--question")
    ask.add_argument("--passages", type=int, default=PASSAGES)
    ask.add_argument("--reader", type=Path, help="an extractive QA checkpoint (without it: the best document)")
    for step in (index, ask):
        step.add_argument("--store", type=Path, required=True)
        step.add_argument("--embedder", type=Path, required=True, help="a sentence-transformers folder (MiniLM's)")
    args = parser.parse_args(argv)
    (_haystack_index if args.step == "index" else _haystack_ask)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
