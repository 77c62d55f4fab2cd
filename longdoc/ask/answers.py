"""What `ask` answers, as typed records: an answer's location in its file, found once (offsets, line
and column, a PDF's page) for every output, its score, its supporting sentences and the passage read
that holds it (whose rankings say what found it). JSON is written from them at the edge (`to_json`)."""

from dataclasses import dataclass, field

from longdoc.ask.documents import SourceText
from longdoc.ask.index import Hit


@dataclass(frozen=True)
class Location:
    """Characters [start, end) of a file's text (`text` is them) and where a person finds them: line
    and column (from 1), the page of a PDF, whether the text was extracted (HTML, PDF, DOCX). A fixed
    answer ("yes") has its text only."""

    text: str
    file: str | None = None
    start: int | None = None
    end: int | None = None
    page: int | None = None
    line: int | None = None
    column: int | None = None
    extracted: bool = False

    def to_json(self) -> dict:
        return {"text": self.text, "file": self.file, "start": self.start, "end": self.end}

    def page_json(self) -> dict:
        """{"page": N} in a PDF, else nothing: the JSON's last key where there is one."""
        return {} if self.page is None else {"page": self.page}


def locate(source: SourceText, start: int, end: int) -> Location:
    """Characters [start, end) of `source`'s text, located once for every output."""
    text = source.text
    line = text.count("\n", 0, start) + 1
    column = start - (text.rfind("\n", 0, start) + 1) + 1
    return Location(text[start:end], source.path, start, end, source.page_at(start), line, column, source.extracted)


@dataclass
class Answer:
    """An answer, its final score, its supporting sentences and the passage read that holds it (None:
    the documents were read whole, or a fixed answer)."""

    location: Location
    score: float
    support: list[Location] = field(default_factory=list)
    passage: Hit | None = None

    def to_json(self) -> dict:
        found_by = () if self.passage is None else self.passage.found_by
        return {**self.location.to_json(), "score": self.score,
                "support": [{**sentence.to_json(), **sentence.page_json()} for sentence in self.support],
                "found_by": [rank.to_json() for rank in found_by], **self.location.page_json()}
