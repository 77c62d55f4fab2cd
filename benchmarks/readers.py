"""The reader benchmark behind scripts/bench_readers.py: a Hub-style extractive QA checkpoint read
through `longdoc ask` against the standard sliding-window reader users run on it.

The peer (`SlidingWindowReader`) is what transformers' `run_qa` post-processing and its former
question-answering pipeline did, and Haystack's extractive reader does: the question paired with
every window of the document (384 wordpieces, 128 shared between neighbours), and the answer with
the best start + end logit over all windows, among spans of at most 15 wordpieces inside the
document's text.

The questions are single-hop facts of one relation (`RELATIONS`: "P was born in C." -> "Where was P
born?", or "P moved to C in Y." -> "Where did P move to?"; neither is a relation of longdoc's
multi-hop generator), about invented people and cities (names composed from syllables, seeded,
nothing downloaded): short contexts to fine-tune the packaged MiniLM as a `BertForQuestionAnswering`
with transformers' own model and loss (on "born"), and long documents (filler sentences with the
fact at a random depth among same-relation distractors: other people, other cities) to read. A
reader fine-tuned on one relation and asked about another is what a Hub reader faces.
"""

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch



@dataclass(frozen=True)
class Relation:
    fact: str  # a sentence template with {person}, {city} and optionally {year}
    questions: tuple[str, ...]  # question templates with {person}; the answer is the city


RELATIONS = {
    "born": Relation("{person} was born in {city}.", ("Where was {person} born?", "In which city was {person} born?")),
    "moved": Relation("{person} moved to {city} in {year}.",
                      ("Where did {person} move to?", "To which city did {person} move?")),
}
FILLERS = ("{person} visited {city} in {year}.", "{person} wrote a letter to {other}.",
           "{person} and {other} met at a market in {city}.", "{person} studied music for {n} years.",
           "{person} painted the old bridge of {city}.", "{person} sold a boat to {other} in {year}.")
_SYLLABLES = ("al", "bri", "cor", "da", "el", "fen", "gar", "hal", "is", "jor", "ka", "lor", "mi", "nel",
              "or", "pa", "quin", "ro", "sa", "tam", "ul", "ve", "wyn", "ya", "zel", "tor", "bel", "mar")
_CITY_ENDINGS = ("burg", "ford", "ton", "mouth", "vale", "stad", "haven", "field")


@dataclass(frozen=True)
class FactQuestion:
    context: str
    question: str
    answer: str
    answer_start: int  # character offset of the answer in `context`
    facts: tuple[tuple[str, str], ...]  # every (person, city) the document states, the asked one first
    statements: tuple[str, ...]  # the sentence stating each fact, in the order of `facts`

    def statement_span(self, fact: int) -> tuple[int, int]:
        """Characters of `context` that state facts[fact]."""
        start = self.context.index(self.statements[fact])
        return start, start + len(self.statements[fact])


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _person(rng: random.Random) -> str:
    return f"{_word(rng, 2)} {_word(rng, rng.choice((2, 3)))}"


def _city(rng: random.Random) -> str:
    return _word(rng, 2) + rng.choice(_CITY_ENDINGS)


def _filler(rng: random.Random, people: Sequence[str], cities: Sequence[str]) -> str:
    person, other = rng.sample(list(people), 2)
    return rng.choice(FILLERS).format(person=person, other=other, city=rng.choice(cities),
                                      year=rng.randint(1900, 2020), n=rng.randint(2, 9))


def make_fact_question(rng: random.Random, *, words: int, distractors: int, paragraph_sentences: int = 6,
                       relation: str = "born") -> FactQuestion:
    """One document of about `words` words: filler, `distractors` facts of `relation` (a key of
    RELATIONS) about other people, and the asked fact at a random depth; paragraphs of
    `paragraph_sentences` sentences."""
    template = RELATIONS[relation]
    people = [_person(rng) for _ in range(distractors + 8)]
    cities = list(dict.fromkeys(_city(rng) for _ in range(distractors + 8)))
    person, city = people[0], cities[0]
    facts = [(person, city)] + [(people[1 + i], rng.choice(cities[1:])) for i in range(distractors)]
    # Years drawn only where the template has one: "born" documents stay those the reader trained on.
    sentences = [template.fact.format(person=p, city=c, year=rng.randint(1900, 2020) if "{year}" in template.fact
                                      else None) for p, c in facts]
    statements = tuple(sentences)
    asked = sentences[0]
    while sum(len(sentence.split()) for sentence in sentences) < words:
        sentences.append(_filler(rng, people[1:], cities))
    rng.shuffle(sentences)
    paragraphs = [" ".join(sentences[i:i + paragraph_sentences]) for i in range(0, len(sentences), paragraph_sentences)]
    context = "\n\n".join(paragraphs)
    answer_start = context.index(asked) + asked.index(city)
    return FactQuestion(context, rng.choice(template.questions).format(person=person), city, answer_start,
                        tuple(facts), statements)


def make_fact_questions(n: int, *, seed: int, words: int, distractors: int, relation: str = "born"
                        ) -> list[FactQuestion]:
    """`n` documents, question i seeded by (seed, i) alone."""
    return [make_fact_question(random.Random(f"{seed}:{i}"), words=words, distractors=distractors, relation=relation)
            for i in range(n)]


def finetune_qa_reader(base_dir: str | Path, examples: Sequence[FactQuestion], out_dir: str | Path, *,
                       epochs: int = 1, batch_size: int = 16, learning_rate: float = 1e-4, max_length: int = 192,
                       seed: int = 0, progress: bool = True) -> Path:
    """Fine-tune the BERT checkpoint at `base_dir` as transformers' `BertForQuestionAnswering` (its
    own span head and loss) on `examples`, and save it as Hub readers are saved (safetensors,
    config.json with the architecture, the tokenizer)."""
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer, BertForQuestionAnswering

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    model = BertForQuestionAnswering.from_pretrained(str(base_dir))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    order = list(range(len(examples)))
    steps = epochs * ((len(order) + batch_size - 1) // batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    bar = tqdm(total=steps, desc="fine-tune QA reader", disable=not progress)
    for epoch in range(epochs):
        random.Random(seed + epoch).shuffle(order)
        for begin in range(0, len(order), batch_size):
            batch = [examples[i] for i in order[begin:begin + batch_size]]
            encoded = tokenizer([e.question for e in batch], [e.context for e in batch], truncation="only_second",
                                max_length=max_length, padding=True, return_offsets_mapping=True,
                                return_tensors="pt")
            starts, ends = _token_positions(encoded, batch)
            encoded.pop("offset_mapping")
            loss = model(**encoded, start_positions=starts, end_positions=ends).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    out_dir = Path(out_dir)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _token_positions(encoded, batch: Sequence[FactQuestion]) -> tuple[torch.Tensor, torch.Tensor]:
    """The answer's first and last wordpiece in each row (0, the [CLS], when truncation cut it)."""
    starts, ends = [], []
    for row, example in enumerate(batch):
        answer_end = example.answer_start + len(example.answer)
        sequence_ids = encoded.sequence_ids(row)
        start = end = 0
        for token, (offset, sequence) in enumerate(zip(encoded["offset_mapping"][row].tolist(), sequence_ids)):
            if sequence != 1:
                continue
            if offset[0] <= example.answer_start < offset[1]:
                start = token
            if offset[0] < answer_end <= offset[1]:
                end = token
        if end < start:
            start = end = 0
        starts.append(start)
        ends.append(end)
    return torch.tensor(starts), torch.tensor(ends)


@dataclass(frozen=True)
class WindowAnswer:
    text: str
    start: int  # character offsets into the context
    end: int
    score: float  # start logit + end logit


class SlidingWindowReader:
    """The standard extractive reader over a long context: every window of `max_length` wordpieces
    (question first, `stride` wordpieces shared between neighbouring windows), the span with the
    best start + end logit over all windows, at most `max_answer_len` wordpieces, inside the
    context."""

    def __init__(self, model_dir: str | Path, *, max_length: int = 384, stride: int = 128,
                 max_answer_len: int = 15, batch_size: int = 16):
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForQuestionAnswering.from_pretrained(str(model_dir)).eval()
        self.max_length, self.stride, self.max_answer_len, self.batch_size = max_length, stride, max_answer_len, batch_size

    @torch.inference_mode()
    def answer(self, question: str, context: str) -> WindowAnswer:
        encoded = self.tokenizer(question, context, truncation="only_second", max_length=self.max_length,
                                 stride=self.stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                                 padding=True, return_tensors="pt")
        offsets = encoded.pop("offset_mapping")
        encoded.pop("overflow_to_sample_mapping", None)
        in_context = torch.tensor([[sequence == 1 for sequence in encoded.sequence_ids(row)]
                                   for row in range(len(offsets))])
        best = None
        for begin in range(0, len(offsets), self.batch_size):
            rows = slice(begin, begin + self.batch_size)
            output = self.model(**{name: value[rows] for name, value in encoded.items()})
            scores = output.start_logits[:, :, None] + output.end_logits[:, None, :]
            width = scores.shape[-1]
            band = torch.ones(width, width, dtype=torch.bool).triu().tril(self.max_answer_len - 1)
            allowed = band & in_context[rows, :, None] & in_context[rows, None, :]
            scores = scores.masked_fill(~allowed, float("-inf"))
            flat = scores.flatten(1).max(dim=1)
            row = int(flat.values.argmax())
            if best is None or flat.values[row] > best[0]:
                start_token, end_token = divmod(int(flat.indices[row]), width)
                best = (float(flat.values[row]), begin + row, start_token, end_token)
        score, row, start_token, end_token = best
        start, end = int(offsets[row, start_token, 0]), int(offsets[row, end_token, 1])
        return WindowAnswer(context[start:end], start, end, score)
