"""OpenKP reader (JSON lines: url, text, VDOM, KeyPhrases) -> `StructuredExample`s.

The document is `text` itself, whose tokens are `text.split(" ")`. Each VDOM element becomes a DOM
node over tokens [start_idx, end_idx) with its 20 visual features (the node's 10, then its
parent's 10), so the feature builder gives it a global token carrying those features (ETC's
OpenKP construction). The question is empty: OpenKP has none.
`labels`: url and KeyPhrases (a list of token lists; absent in the public eval file).
"""

import json
import os
from typing import Iterator

from longdoc.data.examples import Document, DomNode, StructuredExample, TextSpan
from longdoc.io import iter_jsonl
from longdoc.data.records import RecordFields
from longdoc.data.text import token_char_spans

VISUAL_FEATURE_SIZE = 20


def read_examples(path: str | os.PathLike) -> Iterator[StructuredExample]:
    for line, record in iter_jsonl(path):
        yield _example(RecordFields(record, f"{path}:{line}", "url", line))


def _example(fields: RecordFields) -> StructuredExample:
    text = fields.get("text", str)
    tokens = token_char_spans(text)
    try:
        vdom = json.loads(fields.get("VDOM", str))
    except json.JSONDecodeError as error:
        raise fields.error("VDOM", f"is not a JSON-encoded list: {error.msg}") from None
    if not isinstance(vdom, list):
        raise fields.error("VDOM", "must encode a list of elements")
    nodes = []
    for number, element in enumerate(vdom):
        name = f"VDOM[{number}]"
        if not isinstance(element, dict):
            raise fields.error(name, "must be an object")
        start, end, features = element.get("start_idx"), element.get("end_idx"), element.get("feature")
        if not isinstance(start, int) or not isinstance(end, int) or not 0 <= start < end <= len(tokens):
            raise fields.error(name, f"start_idx/end_idx must be token indices with start < end <= {len(tokens)}")
        if not isinstance(features, list) or len(features) != VISUAL_FEATURE_SIZE or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in features
        ):
            raise fields.error(f"{name}.feature", f"must be a list of {VISUAL_FEATURE_SIZE} numbers")
        nodes.append(DomNode(TextSpan(0, tokens[start][0], tokens[end - 1][1]), [float(v) for v in features]))
    labels = {"url": fields.example_id}
    if "KeyPhrases" in fields.record:
        labels["KeyPhrases"] = fields.get("KeyPhrases", list)
    return StructuredExample(
        id=fields.example_id, question="", documents=[Document(text)], dom_nodes=nodes, labels=labels
    ).validate()
