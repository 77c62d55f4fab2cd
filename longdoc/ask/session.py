"""An `ask` session: documents indexed once, then any number of questions answered over them.

`AskSession(sources, reader_folder)` takes the documents `load_sources` read, indexes them (cached,
`longdoc.ask.index`), loads the embedder and the reader once; `answer(question)` retrieves
(`longdoc.ask.retrieve`), reads and returns an `AskResult` of typed answers (`longdoc.ask.answers`),
whose `to_json()`, also `ask(question)`, is the result object `longdoc ask --json` prints:
{"question", "mode", "evidence", "read", "answers": [{"text", "score", "file", "start", "end",
"support": [...], "found_by": [...]}], "passages": [{"file", "start", "end", "score", "found_by"}],
"documents": [...]}. "documents" says, per file, what its offsets count: the file's decoded text, or
the text extracted from it (HTML, PDF, DOCX; `longdoc ask --extract FILE` prints it); every place in
a PDF also has its "page" (from 1); "evidence" is the cosine (MiniLM) between the question and the
sentence of the passages read nearest to it. "read" is "retrieved" (the passages retrieval chose) or
"all" (every passage: asked with `read_all`, or the corpus fits the reader's input or the reading
budget); "found_by" lists the rankings that chose a passage ({"retriever": "bm25" or "minilm",
"hop": 1 or 2, "rank": 1 for first}), and an answer's are those of the passage it lies in (empty
when all was read).

What answers, by `reader_folder` (a `longdoc.model_folder.ModelFolder`):
- none: "mode" "sentence": the sentences of the passages read nearest to the question (the MiniLM
  evidence), best first, each its own answer;
- a lifted extractive QA reader (`longdoc lift --from QA_CHECKPOINT`): "mode" "span", read by
  `longdoc.ask.span_reading`;
- a trained task model whose task reads passages (its Task record has an `ask` part, e.g. a model
  of `longdoc train hotpotqa`): "mode" "span", read by `longdoc.ask.reader` as its task says, with
  supporting sentences. The task is the one the model's config.json names, found in `tasks` (the
  registry the command line hands over).

No answer: a question is refused ("answers" empty) when no sentence read is about it, that is when
"evidence" is under `min_evidence` (default MIN_EVIDENCE). A reader's span score cannot tell: the
demo's model gives its document's answer whatever is asked (docs/ask.md), while a question the
document answers shares words with a sentence of it.
"""

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from longdoc.ask.documents import SourceText
from longdoc.ask.index import CorpusIndex, Hit, index_corpus
from longdoc.ask.answers import Answer, Location, locate
from longdoc.ask.retrieve import MOST_PASSAGES, RetrievalOptions, Retriever, SentenceEvidence
from longdoc.errors import DeviceMemoryError, InputError, ModelFolderError, OptionError
from longdoc.data.task import SpanAnswerReading, TaskLookup
from longdoc.model_folder import ModelFolder

PASSAGES_READ = MOST_PASSAGES  # the most passages read per question (longdoc.ask.retrieve: fewer when they separate)
MIN_EVIDENCE = 0.5  # calibrated on generated documents (docs/ask.md)
# The longest question asked, in characters, by ask and serve alike: readers keep only the question's first
# wordpieces (HotpotQA's model max_question_len, a QA reader its row), so a longer one would be cut unseen.
MAX_QUESTION_CHARS = 2000


def question_problem(question: str) -> str | None:
    """Why `question` is refused (blank, or longer than MAX_QUESTION_CHARS), None when it may be asked:
    the one rule of `longdoc ask` and `POST /api/ask`."""
    if not question.strip():
        return "is blank"
    if len(question) > MAX_QUESTION_CHARS:
        return (f"is {len(question)} characters long; at most {MAX_QUESTION_CHARS} are read (a reader keeps only "
                "a question's first wordpieces): ask a shorter one")
    return None


@dataclass(frozen=True)
class Reader:
    """The model that reads for `ask`, its tokenizer, and how it reads: `reading` is its task's ask part
    (None for a lifted extractive QA reader, read by `longdoc.ask.span_reading`)."""

    model: Any
    tokenizer: Any
    reading: SpanAnswerReading | None


def load_reader(folder: ModelFolder, tasks: TaskLookup | None, runtime: str = "torch", device=None) -> Reader:
    """The reader in `folder`: a lifted extractive QA reader, or a trained model of a task of `tasks`
    that reads passages; InputError saying what the folder is otherwise (a damaged weights file
    included: TaskModel.from_pretrained reads it through readable_weights). `runtime` "onnx": the
    folder's exported graph on ONNX Runtime (on `device`) in the place of the PyTorch model. A lifted
    reader on PyTorch is loaded on torch alone (longdoc.model.plain_reader: the same logits, without
    transformers' model classes to import)."""
    from longdoc.model.plain_reader import SPAN_READER_TASK

    task_name, model_dir = folder.task, folder.path
    if task_name == SPAN_READER_TASK:
        if runtime == "onnx":
            from longdoc.model.span_reader import SpanReader

            return Reader(*_load(folder, SpanReader, runtime, device), None)
        from longdoc.model.plain_reader import load_span_reader
        from longdoc.model_folder import read_tokenizer

        return Reader(load_span_reader(model_dir, folder.model_config()), read_tokenizer(model_dir), None)
    if not task_name:
        raise ModelFolderError(f"{model_dir}: is a bare encoder (GlobalLocalModel, no task head), not a reader",
                               model_dir, "", ModelFolderError.READER)
    if tasks is None or task_name not in tasks.names():
        raise InputError(f"{model_dir}: holds a trained {task_name!r} model, a task this program does not know")
    task = tasks.get(task_name)
    if task.ask is None:
        raise InputError(f"{model_dir}: holds a trained {task_name} model; the {task_name} task does not read "
                         "passages for ask (its answers are not spans of the text)")
    return Reader(*_load(folder, task.load("model"), runtime, device), task.load("ask"))


def _load(folder: ModelFolder, model_class, runtime: str, device) -> tuple[Any, Any]:
    """(model, tokenizer) of a reader folder: the PyTorch model, or its exported graph on ONNX Runtime,
    both from the config already read."""
    from longdoc.model_folder import load_model, read_tokenizer

    if runtime == "onnx":
        from longdoc.export.serving import load_task_model

        return load_task_model(folder, model_class.task_name, device), read_tokenizer(folder.path)
    return load_model(folder.path, model_class, folder.model_config())


@dataclass(frozen=True)
class ReaderPlacement:
    """Where and how the reader runs: `device` and `dtype` (torch's, longdoc.model.inference.resolve_placement;
    None: where it loads, the CPU in float32), `attention` (with a device, the attention backend; None:
    its config's, longdoc.model.inference.place_model) and `runtime` ("torch", or "onnx" for the folder's
    exported graph in ONNX Runtime, longdoc.export.serving.resolve_runtime)."""

    device: Any = None
    dtype: Any = None
    attention: str | None = None
    runtime: str = "torch"


class AskSession:
    def __init__(self, sources: Sequence[SourceText], reader_folder: ModelFolder | None = None, *,
                 passages: int = PASSAGES_READ, second_hop: bool = True, progress: bool = True,
                 cache_root: Path | None = None, placement: ReaderPlacement = ReaderPlacement(),
                 tasks: TaskLookup | None = None, named_by: Sequence[str] | None = None, embedder=None,
                 corpus: CorpusIndex | None = None):
        """`reader_folder`: the reader's model folder as read once (longdoc.model_folder.read_model_folder);
        None: no reader, sentence mode. `placement`: where and how the reader runs; the MiniLM embedder
        stays on the CPU in float32: the cached indexes hold its vectors. `tasks`: where the task of a
        trained task model is found (the registry, `longdoc.tasks.REGISTRY`); not needed for a lifted QA
        reader or none. `named_by`: the paths the user named the documents by (files and folders), which
        key the corpus index (longdoc.ask.index); None: the documents' own paths. `embedder`: a
        longdoc.ask.embedding.SentenceEmbedder already loaded (serve's, which indexed the corpus); None:
        one is loaded. `corpus`: the documents already read from their corpus index with that embedder
        (longdoc.ask.index.CorpusStore.open; serve's); None: the index is opened, and updated first."""
        from longdoc.ask.embedding import SentenceEmbedder
        from longdoc.model.inference import place_model

        self.model_dir = None if reader_folder is None else reader_folder.path
        reader = (Reader(None, None, None) if reader_folder is None
                  else load_reader(reader_folder, tasks, placement.runtime, placement.device))
        self.model, self.tokenizer, self.reading = reader.model, reader.tokenizer, reader.reading
        if self.model is not None and placement.device is not None and placement.runtime != "onnx":
            self.model = place_model(self.model, placement.device, placement.dtype, self.model_dir,
                                     attention=placement.attention)
        self.mode = "sentence" if self.model is None else "span"
        self.sources = list(sources)
        self.embedder = SentenceEmbedder() if embedder is None else embedder
        self.corpus = corpus if corpus is not None else index_corpus(
            self.sources, self.embedder, named_by=named_by, cache_root=cache_root, progress=progress)
        self.passages = passages
        self.evidence = SentenceEvidence(self.corpus)
        self.retriever = Retriever(self.corpus, self.embedder, self.evidence)
        self.second_hop = second_hop
        self._corpus_wordpieces: int | None = None

    def reads_whole_corpus(self, question: str) -> bool:
        """Whether the question and every document fit the reader's input at once: the long input of a
        task model, one row of a QA reader. Retrieval is for what the reader cannot read at once:
        documents that fit are read whole, as the reader was trained. A corpus of more words (the
        index's count) than that input holds wordpieces cannot fit, and its files are not read to
        count them."""
        if self.model is None:
            return False
        from longdoc.ask.span_reading import row_length

        limit = row_length(self.model) if self.reading is None else self.model.config.long_max_len
        if sum(document.words for document in self.corpus.documents) + 3 > limit:
            return False
        if self._corpus_wordpieces is None:
            texts = [document.passage_text(passage) for d, document in enumerate(self.corpus.documents)
                     for passage in self.corpus.document_passages(d)]
            self._corpus_wordpieces = sum(len(ids) for ids in
                                          self.tokenizer(texts, add_special_tokens=False)["input_ids"])
        question_wordpieces = len(self.tokenizer(question, add_special_tokens=False)["input_ids"])
        return self._corpus_wordpieces + question_wordpieces + 3 <= limit

    def ask(self, question: str, **options) -> dict:
        """The result object for `question` (see the module docstring): `answer(question, **options)` as JSON."""
        return self.answer(question, **options).to_json()

    def answer(self, question: str, top_k: int = 1, min_score: float | None = None, min_evidence: float | None = None,
               max_answer_len: int | None = None, handle_impossible: bool = False, retrieval: str = "hybrid",
               read_all: bool = False) -> "AskResult":
        """The answers to `question`, as typed records. `min_score`: the lowest final score of a task
        model's span answers (longdoc.ask.reader.MIN_SCORE when None); `min_evidence`: MIN_EVIDENCE when
        None; `max_answer_len`: a QA reader's longest answer in wordpieces (its own setting, 15, when
        None); `handle_impossible`: a SQuAD 2.0 reader's null score may refuse; `retrieval`: "hybrid",
        "bm25" or "minilm" (longdoc.ask.retrieve.RETRIEVERS); `read_all`: read every passage (a QA
        reader: every window of each document, as the sliding-window reader does) instead of retrieving."""
        question = question.strip()
        options = RetrievalOptions(retrieval=retrieval, passages=self.passages, second_hop=self.second_hop)
        whole = read_all or self.reads_whole_corpus(question) or len(self.corpus.locations) <= self.passages
        if not question:
            hits, ranked = [], []
        else:
            vector = self.retriever.question_vector(question)
            hits = self.retriever.everything(vector) if whole else self.retriever.retrieve(question, vector, options)
            ranked = self.evidence.ranked(vector, hits) if hits else []
        evidence = ranked[0][0] if ranked else -1.0
        grounded = evidence >= (MIN_EVIDENCE if min_evidence is None else min_evidence)
        if not hits or not grounded:
            answers = []
        elif self.model is None:
            answers = [Answer(self._locate(hit.document, start, end), score, [], hit)
                       for score, hit, (start, end) in ranked[:top_k]]
        else:
            with _out_of_memory_named_by_asks_options():
                answers = self._read(question, hits, whole, top_k, min_score, max_answer_len, handle_impossible)
        passages = [(self._locate(hit.document, self.corpus.passage(hit).start, self.corpus.passage(hit).end), hit)
                    for hit in hits]
        return AskResult(question, self.mode, evidence, "all" if whole else "retrieved", answers, passages,
                         self.sources)

    def _read(self, question: str, hits: Sequence[Hit], whole: bool, top_k: int, min_score: float | None,
              max_answer_len: int | None, handle_impossible: bool) -> list[Answer]:
        """The reader's answers in `hits`: a QA reader's, or a task model's read as its task says."""
        if self.reading is None:
            return [answer for answer in self._read_spans(question, hits, whole, top_k, max_answer_len,
                                                          handle_impossible)
                    if min_score is None or answer.score >= min_score]
        from longdoc.ask.reader import MIN_SCORE, read_answers

        return read_answers(question, self.corpus, hits, self.model, self.tokenizer, self.reading, top_k=top_k,
                            min_score=MIN_SCORE if min_score is None else min_score)

    def _read_spans(self, question: str, hits: Sequence[Hit], whole: bool, top_k: int, max_answer_len: int | None,
                    handle_impossible: bool) -> list[Answer]:
        """A QA reader's answers: on each whole document when they all fit one row, else on the passages
        retrieved (in file order); each with the sentences it lies in as support."""
        from longdoc.ask.span_reading import read_spans

        if whole:
            places = [(d, 0, len(document.source.text), None) for d, document in enumerate(self.corpus.documents)]
        else:
            places = [(hit.document, self.corpus.passage(hit).start, self.corpus.passage(hit).end, hit)
                      for hit in sorted(hits, key=lambda hit: (hit.document, hit.passage))]
        texts = [self.corpus.documents[d].source.text[start:end] for d, start, end, _ in places]
        limit = self.model.task_options["max_answer_length"] if max_answer_len is None else max_answer_len
        found = read_spans(question, texts, self.model, self.tokenizer, max_answer_len=limit,
                           handle_impossible=handle_impossible)
        answers = []
        for answer in found[:top_k]:
            d, offset, _, hit = places[answer.context]
            start, end = offset + answer.start, offset + answer.end
            answers.append(Answer(self._locate(d, start, end), answer.score,
                                  [self._locate(d, *sentence) for sentence in self._sentences(d)
                                   if sentence[0] < end and start < sentence[1]], hit))
        return answers

    def _sentences(self, document: int) -> list[tuple[int, int]]:
        return [sentence for passage in self.corpus.document_passages(document) for sentence in passage.sentences]

    def _locate(self, document: int, start: int, end: int) -> Location:
        return locate(self.corpus.documents[document].source, start, end)


@dataclass(frozen=True)
class AskResult:
    """What `AskSession.answer` found: the answers, the passages read (each located, with the hit that
    says which rankings chose it) and the documents; `to_json()` is the result object of the module
    docstring."""

    question: str
    mode: str
    evidence: float
    read: str
    answers: list[Answer]
    passages: list[tuple[Location, Hit]]
    sources: Sequence[SourceText]

    def to_json(self) -> dict:
        return {
            "question": self.question,
            "mode": self.mode,
            "evidence": self.evidence,
            "read": self.read,
            "answers": [answer.to_json() for answer in self.answers],
            "passages": [{"file": place.file, "start": place.start, "end": place.end, "score": hit.score,
                          "found_by": [rank.to_json() for rank in hit.found_by], **place.page_json()}
                         for place, hit in self.passages],
            "documents": [{"file": source.path, "sha256": source.sha256,
                           "offsets_into": f"text extracted from {source.extracted_from}" if source.extracted
                           else "decoded file text"}
                          for source in self.sources],
        }


@contextlib.contextmanager
def _out_of_memory_named_by_asks_options():
    """Out of device memory while reading: an OptionError naming what `ask` can lower (it has no
    batch size, which the prediction loop's DeviceMemoryError would name)."""
    import torch

    try:
        yield
    except (torch.OutOfMemoryError, DeviceMemoryError):
        raise OptionError("out of device memory reading the passages: compute in bfloat16 ({bf16}), or read "
                          "fewer passages ({passages})") from None
