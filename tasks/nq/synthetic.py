"""Synthetic Natural Questions files, for tests and benchmarks only: made-up text, not NQ data.

The real samples are two examples, too few to test streaming, both file formats or window
aggregation. `synthetic_record` writes one example in either official format: paragraphs
(`<P> ... </P>`, top-level candidates) and a table whose cells are nested candidates, a question
"what is the <property> of <subject>" and one annotation whose long answer is the paragraph that
states it and whose short answer is the value's tokens. The original format carries
`document_tokens` with byte offsets into a `document_html` built from the tokens (plus
`html_padding_bytes` of random filler in a comment, to make lines as large as real NQ lines),
and every span carries bytes and tokens.
"""

import gzip
import json
import random
from pathlib import Path

WORDS = ("river", "stone", "garden", "lamp", "harbor", "valley", "engine", "letter", "window", "meadow", "copper",
         "signal", "forest", "bridge", "candle", "orbit", "market", "ladder", "pillow", "thunder")
PROPERTIES = ("color", "founder", "capital", "length", "origin")


def synthetic_record(index: int, rng: random.Random, original_format: bool, paragraphs: int = 8,
                     paragraph_words: int = 40, html_padding_bytes: int = 0) -> dict:
    """One synthetic NQ example (see the module docstring), in either official format.

    Args:
        index: the example's number: its example id is 1,000,000 + `index`, and it names the
            question's subject.
        rng: the random draws (words, property, the answer's paragraph), shared across a file.
        original_format: NQ's original format (`document_html`, `document_tokens` and byte offsets
            on every span); off, the simplified format (`document_text`).
        paragraphs: paragraphs in the document; a table follows paragraph `paragraphs // 2`.
        paragraph_words: words per paragraph, at least 9 (the answer sentence has 8 words).
        html_padding_bytes: bytes of random filler in a comment at the start of `document_html`
            (original format only), to make lines as large as real NQ lines.

    Returns:
        The NQ record, one JSON line of an NQ file.

    Raises:
        ValueError: `paragraph_words` below 9.
    """
    if paragraph_words < 9:
        raise ValueError(f"paragraph_words must be >= 9 (the answer sentence has 8 words), got {paragraph_words}")
    tokens: list[tuple[str, bool]] = []  # (token, is_html)
    candidates = []

    def add_paragraph(words: list[str]) -> tuple[int, int]:
        start = len(tokens)
        tokens.append(("<P>", True))
        tokens.extend((w, False) for w in words)
        tokens.append(("</P>", True))
        candidates.append({"start_token": start, "end_token": len(tokens), "top_level": True})
        return start, len(tokens)

    subject, prop = f"{rng.choice(WORDS)}{index}", rng.choice(PROPERTIES)
    value = [rng.choice(WORDS).capitalize(), rng.choice(WORDS).capitalize()]
    answer_paragraph = rng.randrange(paragraphs)
    long_answer = short_answer = None
    for p in range(paragraphs):
        words = [rng.choice(WORDS) for _ in range(paragraph_words)]
        if p == answer_paragraph:
            at = rng.randrange(paragraph_words - 8)
            words[at:at + 8] = ["the", prop, "of", subject, "is", *value, "."]
            long_answer = add_paragraph(words)
            first = long_answer[0] + 1 + at + 5
            short_answer = (first, first + 2)
        else:
            add_paragraph(words)
        if p == paragraphs // 2:  # a table: one top-level candidate holding nested cell candidates
            table_start = len(tokens)
            tokens.extend([("<Table>", True), ("<Tr>", True)])
            nested = []
            for _ in range(3):
                cell_start = len(tokens)
                tokens.extend([('<Td_colspan="2">', True), (rng.choice(WORDS), False), ("</Td>", True)])
                nested.append({"start_token": cell_start, "end_token": len(tokens), "top_level": False})
            tokens.extend([("</Tr>", True), ("</Table>", True)])
            candidates.append({"start_token": table_start, "end_token": len(tokens), "top_level": True})
            candidates.extend(nested)
    candidates.sort(key=lambda c: (c["start_token"], -c["end_token"]))
    long_index = next(i for i, c in enumerate(candidates)
                      if (c["start_token"], c["end_token"]) == long_answer)
    annotation = {
        "annotation_id": index,
        "long_answer": {"start_token": long_answer[0], "end_token": long_answer[1], "candidate_index": long_index},
        "short_answers": [{"start_token": short_answer[0], "end_token": short_answer[1]}],
        "yes_no_answer": "NONE",
    }
    record = {"example_id": 1_000_000 + index, "question_text": f"what is the {prop} of {subject}",
              "document_url": f"https://example.invalid/synthetic/{index}",
              "long_answer_candidates": candidates, "annotations": [annotation]}
    if not original_format:
        record["document_text"] = " ".join(t for t, _ in tokens)
        return record
    # Original format: byte offsets into document_html, where tokens are separated by one space
    # and the page starts with a comment of random hex filler (it compresses about 2:1, like real
    # HTML, so a gzipped file's size follows the number of lines).
    prefix = "<!-- " + rng.randbytes(html_padding_bytes // 2).hex() + " -->"
    position = len(prefix.encode()) + 1
    document_tokens = []
    for token, is_html in tokens:
        size = len(token.replace("_", " ").encode())
        document_tokens.append({"token": token.replace("_", " "), "start_byte": position,
                                "end_byte": position + size, "html_token": is_html})
        position += size + 1
    record["document_html"] = prefix + " " + " ".join(t["token"] for t in document_tokens)
    record["document_tokens"] = document_tokens

    def with_bytes(span: dict) -> dict:
        return {**span, "start_byte": document_tokens[span["start_token"]]["start_byte"],
                "end_byte": document_tokens[span["end_token"] - 1]["end_byte"]}

    record["long_answer_candidates"] = [with_bytes(c) for c in candidates]
    annotation["long_answer"] = with_bytes(annotation["long_answer"])
    annotation["short_answers"] = [with_bytes(s) for s in annotation["short_answers"]]
    return record


def write_synthetic_nq(path: str | Path, count: int, original_format: bool = False, seed: int = 0,
                       **record_options) -> Path:
    """Write `count` synthetic examples as JSON lines (gzipped when `path` ends in .gz)."""
    path = Path(path)
    rng = random.Random(seed)
    opener = (lambda p: gzip.open(p, "wt", encoding="utf-8", compresslevel=1)) if path.suffix == ".gz" else \
        (lambda p: open(p, "w", encoding="utf-8"))
    with opener(path) as handle:
        for index in range(count):
            handle.write(json.dumps(synthetic_record(index, rng, original_format, **record_options)) + "\n")
    return path
