"""Asking over HTTP: the documents given to `longdoc serve`, indexed once, and one `AskSession`
that answers every question in turn.

The documents are those `longdoc ask` reads (`longdoc.ask.documents.load_sources`, which leaves out
a file that a symbolic link inside a given folder brings in from outside it): the server serves the
documents it was given and nothing else. Indexing runs once, in the background, so that the page
can show its progress as documents are committed; it updates the corpus index that `longdoc ask` and
`longdoc index` with the same paths use (`longdoc.ask.index`) and hands the documents it read from
it to the session. The reader (`--model`) and the MiniLM embedder are loaded once.

One worker thread runs everything that touches the models: indexing, then each question in the
order the requests came (a queue), so no model ever runs in two threads at once. Each question
gets `longdoc ask`'s options (`longdoc.serve.options.AskOptions`); `passages` and `second_hop` are the session's
settings, set for that question only, which is safe because only the worker runs questions.
"""

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from longdoc.ask.documents import SourceText
from longdoc.ask.session import ReaderPlacement
from longdoc.serve.options import AskOptions


class NotReady(Exception):
    """The documents are still being indexed, or the session could not start."""


class AskService:
    def __init__(self, sources: Sequence[SourceText], model_dir=None, *,
                 placement: ReaderPlacement = ReaderPlacement(), tasks=None, log=None,
                 named_by: Sequence[str] | None = None):
        """`placement`: where and how the reader runs (longdoc.ask.session.ReaderPlacement); `tasks`: the
        registry a trained task model's task is found in (longdoc.ask.session.AskSession); `log`: where
        the indexing's progress lines go (sys.stderr as it is when the service starts); `named_by`: the
        paths the documents were named by, which key the corpus index that `longdoc ask` and
        `longdoc index` with the same paths use (None: the documents' own paths)."""
        self.sources = list(sources)
        self.tasks = tasks
        self.model_dir = model_dir
        self.named_by = named_by
        self.placement = placement
        self.log = sys.stderr if log is None else log
        self.documents = [{"file": source.path, "bytes": os.path.getsize(source.path), "characters": len(source.text),
                           "offsets_into": f"text extracted from {source.extracted_from}" if source.extracted
                           else "decoded file text", "passages": None, "state": "waiting"}
                          for source in self.sources]
        self._by_file = {source.path: source for source in self.sources}
        self.state, self.error, self.session = "indexing", None, None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longdoc-ask")
        self.started = self._worker.submit(self._start)

    def _start(self) -> None:
        from longdoc.ask.embedding import SentenceEmbedder
        from longdoc.ask.index import corpus_store
        from longdoc.ask.session import AskSession
        from longdoc.model_folder import read_model_folder

        try:
            embedder = SentenceEmbedder()
            numbers = {source.path: number for number, source in enumerate(self.sources)}
            for document in self.documents:
                document["state"] = "indexing"

            def indexed(source: SourceText, passages: int) -> None:
                self.documents[numbers[source.path]].update(state="indexed", passages=passages)

            corpus = corpus_store(self.sources, embedder, named_by=self.named_by).open(
                self.sources, embedder, progress=False, on_indexed=indexed)
            changes = corpus.changes
            self.state = "loading the reader" if self.model_dir is not None else "loading"
            folder = None if self.model_dir is None else read_model_folder(self.model_dir)
            self.session = AskSession(self.sources, folder, placement=self.placement, tasks=self.tasks,
                                      embedder=embedder, corpus=corpus)
            for document, indexed_document in zip(self.documents, self.session.corpus.documents):
                document.update(state="indexed", passages=indexed_document.passage_count)
            self.state = "ready"
            print(f"longdoc serve: {len(self.sources)} documents indexed ({changes.describe() or 'none changed'}); "
                  f"answering in {self.session.mode} mode", file=self.log, flush=True)
        except Exception as error:  # shown on the page and told by every question, never a dead server
            self.state, self.error = "failed", f"{type(error).__name__}: {error}"
            print(f"longdoc serve: error: could not start answering: {self.error}", file=self.log, flush=True)

    def status(self) -> dict:
        """The documents, their sizes and index state, and how far the indexing is."""
        characters = sum(document["characters"] for document in self.documents)
        indexed = sum(document["characters"] for document in self.documents if document["state"] == "indexed")
        return {"state": self.state, "error": self.error,
                "mode": None if self.session is None else self.session.mode,
                "indexed": sum(document["state"] == "indexed" for document in self.documents),
                "total": len(self.documents), "fraction": indexed / characters if characters else 1.0,
                "documents": self.documents}

    def text(self, file: str) -> SourceText | None:
        """A served document by the name it is listed under; None for any other name."""
        return self._by_file.get(file)

    async def ask(self, options: AskOptions) -> dict:
        """What `longdoc ask --json` prints for the question, answered in turn by the worker."""
        if self.state != "ready":
            raise NotReady(f"cannot answer: {self.error}" if self.state == "failed" else
                           f"{self.state}: {self.status()['indexed']} of {len(self.documents)} documents indexed")
        return await asyncio.wrap_future(self._worker.submit(self._answer, options))

    def _answer(self, options: AskOptions) -> dict:
        session = self.session
        session.passages, session.second_hop = options.passages, options.second_hop
        return session.ask(options.question, top_k=options.top_k, min_score=options.min_score,
                           min_evidence=options.min_evidence, max_answer_len=options.max_answer_len,
                           handle_impossible=options.handle_impossible_answer, retrieval=options.retrieval,
                           read_all=options.read_all)

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
