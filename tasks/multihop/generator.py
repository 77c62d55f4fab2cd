"""The built-in multi-hop task: seeded long documents in the HotpotQA distractor format.

Each example is a small invented world (people, companies, cities; names composed here from
syllables, nothing downloaded) written out as paragraphs of filler and distractor sentences, with
the two facts a question needs placed far apart:

- bridge (type "bridge"): "A works for B." ... "B is based in C." -> "Where is the employer of A
  based?" (answer C; the question names neither B nor C);
- comparison (type "comparison", answer "yes" or "no"): "Are B1 and B2 based in the same city?"
  from "B1 is based in C1." ... "B2 is based in C2.", or "Do A1 and A2 work for the same company?"
  from their two "works for" facts.

Distractors state the same two relations about other people and companies, every city of a world
is the base of several companies, and filler sentences mention the question's own entities with
other cities ("A visited D.", "B sponsored a fair in D."), so neither the nearest city nor the only
"based in" sentence gives the answer: the reader has to find the bridge. Each fact is stated once
(a person has one employer, a company one base), so the supporting facts are exactly the two
placed sentences.

Lengths are in wordpieces of the tokenizer passed in (the default is MiniLM's uncased WordPiece,
the one longdoc's models use), counted exactly the way `longdoc.data.features.build_features`
lays out a HotpotQA example: `[CLS] question [SEP]`, then each paragraph's title and sentences,
then `[SEP]`. Sentences are tokenised one by one; because every sentence after a paragraph's first
keeps its leading space (HotpotQA's convention) and the title is followed by a newline, WordPiece
splits the joined text at the same places, so the counts are exact, not an approximation.
`length` bounds that whole long input; `min_distance` is the number of wordpieces strictly
between the two facts (titles of paragraphs in between included).

Everything comes from `random.Random` seeded by (seed, example index): a file is the same on
every run and machine, and example i does not depend on how many examples are written.
"""

import bisect
import random
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Callable, Sequence

from longdoc.errors import OptionError
from longdoc.io import atomic_write_json

CountTokens = Callable[[Sequence[str]], list[int]]
# [CLS] question [SEP] ... [SEP] (build_features' layout of a HotpotQA example).
SPECIAL_TOKENS = 3

BRIDGE_QUESTIONS = ("Where is the employer of {person} based?",
                    "In which city is the company that {person} works for based?")
SAME_CITY_QUESTION = "Are {company} and {other} based in the same city?"
SAME_EMPLOYER_QUESTION = "Do {person} and {other} work for the same company?"
WORKS_FOR = "{person} works for {company}."
BASED_IN = "{company} is based in {city}."
VISITED = "{person} visited {city} in {year}."
TITLE = "Section {number}"
YEARS = (1950, 2020)

_FIRST = (["Al", "Bri", "Cor", "Da", "El", "Fen", "Gar", "Hal", "Is", "Jor", "Ka", "Lor", "Mi", "Nel", "Or",
           "Pa", "Quin", "Ro", "Sa", "Tam", "Ul", "Ve", "Wyn", "Ya", "Zel"],
          ["a", "en", "in", "on", "ia", "as", "el", "ric", "ya", "o"])
_LAST = (["Ash", "Bel", "Cran", "Dun", "Ell", "Fair", "Grey", "Holt", "Ives", "Kel", "Lang", "Mor", "North",
          "Pen", "Quill", "Rad", "Stone", "Thorn", "Vance", "Wick"],
         ["ley", "wood", "man", "son", "well", "by", "ard", "ett"])
_CITY = (["Bran", "Cal", "Dor", "Elm", "Fal", "Glen", "Har", "Ken", "Lin", "Mar", "Nor", "Ost", "Pel", "Rav",
          "Sel", "Tor", "Ux", "Val", "Wes", "Yar"],
         ["", "a", "e", "i", "o"],
         ["ford", "ton", "burg", "mouth", "vale", "haven", "port", "field", "stead", "wick"])
_COMPANY = (["Ar", "Bex", "Cor", "Dyn", "Ev", "Flux", "Gen", "Hel", "Ion", "Jup", "Kor", "Lum", "Nex", "Omn",
             "Pyr", "Quor", "Syn", "Tek", "Vor", "Zen"],
            ["a", "i", "o", "ex", "ix", "on", "ara", "ica"],
            ["Industries", "Labs", "Group", "Works", "Systems", "Holdings", "Dynamics", "Logistics", "Media",
             "Foods"])
PEOPLE = tuple(f"{a}{b} {c}{d}" for a, b, c, d in product(*_FIRST, *_LAST))
CITIES = tuple("".join(parts) for parts in product(*_CITY))
COMPANIES = tuple(f"{a}{b} {c}" for a, b, c in product(*_COMPANY))

_HOBBIES = ("painting", "sailing", "chess", "gardening", "birdwatching", "pottery", "cycling", "astronomy")
_PRODUCTS = ("tablet", "bicycle", "camera", "kettle", "drone", "speaker", "lamp", "backpack")
_EVENTS = ("festival", "fair", "marathon", "concert", "parade", "exhibition", "regatta", "tournament")
_PLACES = ("museum", "library", "harbour", "town hall", "theatre", "railway station", "market", "stadium")
_SEASONS = ("spring", "summer", "autumn", "winter")
_TOPICS = ("old maps", "river ecology", "medieval music", "railway history", "folk tales", "glassmaking")
# Filler: the world's entities in sentences that never state who works where or where a company is based.
_FILLER = (
    VISITED,
    "{person} enjoys {hobby} in the evenings.",
    "{person} met {person2} at a conference in {city}.",
    "{person} wrote a short book about {topic}.",
    "{person} once described {topic} as a lifelong interest.",
    "{company} released a new {product} in {year}.",
    "{company} sponsored a {event} in {city} in {year}.",
    "Critics praised the {product} made by {company}.",
    "The {place} in {city} was renovated in {year}.",
    "A {event} in {city} drew large crowds that {season}.",
    "Heavy rain fell on {city} during the {season} of {year}.",
    "Local newspapers in {city} covered the {event} at length.",
    "The committee reviewed the annual budget.",
    "Attendance rose steadily over the following decade.",
    "Several proposals were discussed but none was adopted.",
    "The report was published a few months later.",
)
# Share of distractor sentences that state one of the two relations (the rest is filler).
RELATION_SHARE = 0.35
SENTENCES_PER_PARAGRAPH = (3, 7)


@dataclass
class World:
    """People, companies and cities of one example, with who works where and where each company is."""

    people: list[str]
    companies: list[str]
    cities: list[str]
    employer: dict[str, str] = field(default_factory=dict)
    base: dict[str, str] = field(default_factory=dict)

    @classmethod
    def draw(cls, rng: random.Random, length: int) -> "World":
        # Enough entities that relation distractors never run out; few cities, each the base of the
        # same number (two or more) of companies, so the answer city also appears in distractor
        # "based in" sentences and no more often than any other city: counting cities finds nothing.
        cities = rng.sample(CITIES, max(4, length // 150))
        per_city = max(2, round(length / 60 / len(cities)))
        world = cls(rng.sample(PEOPLE, max(8, length // 40)), rng.sample(COMPANIES, per_city * len(cities)), cities)
        # Both lists are in random order: dealing companies to cities in turn is a random balanced draw.
        world.base = {company: cities[i % len(cities)] for i, company in enumerate(world.companies)}
        world.employer = {person: rng.choice(world.companies) for person in world.people}
        return world


@dataclass
class Question:
    text: str
    answer: str
    type: str
    facts: tuple[str, str]  # the two sentences that answer it
    # Sentences that every example of this kind holds somewhere, so that no shortcut works.
    decoys: tuple[str, ...] = ()
    # Entities whose relation sentences would restate or contradict a fact: no distractor about them.
    fixed_people: frozenset = frozenset()
    fixed_companies: frozenset = frozenset()


def bridge_question(rng: random.Random, world: World) -> Question:
    person = world.people[0]
    company = world.employer[person]
    city = world.base[company]
    # The person always in a sentence with another city (their name does not give the answer);
    # the answer city is as often another company's base as every other city is (see
    # distractor_sentences), so neither does a "based in" sentence alone.
    elsewhere = rng.choice([c for c in world.cities if c != city])
    decoys = (VISITED.format(person=person, city=elsewhere, year=rng.randint(*YEARS)),)
    return Question(rng.choice(BRIDGE_QUESTIONS).format(person=person), city, "bridge",
                    (WORKS_FOR.format(person=person, company=company), BASED_IN.format(company=company, city=city)),
                    decoys, frozenset([person]), frozenset([company]))


def comparison_question(rng: random.Random, world: World) -> Question:
    same = rng.random() < 0.5
    if rng.random() < 0.5:
        # Both already placed (every city keeps its share of companies): one in the same city or not.
        first = world.companies[0]
        second = next(c for c in world.companies[1:] if (world.base[c] == world.base[first]) == same)
        facts = tuple(BASED_IN.format(company=c, city=world.base[c]) for c in (first, second))
        text = SAME_CITY_QUESTION.format(company=first, other=second)
        fixed_people, fixed_companies = frozenset(), frozenset([first, second])
    else:
        first, second = world.people[:2]
        world.employer[second] = (world.employer[first] if same
                                  else rng.choice([c for c in world.companies if c != world.employer[first]]))
        facts = tuple(WORKS_FOR.format(person=p, company=world.employer[p]) for p in (first, second))
        text = SAME_EMPLOYER_QUESTION.format(person=first, other=second)
        fixed_people, fixed_companies = frozenset([first, second]), frozenset()
    return Question(text, "yes" if same else "no", "comparison", facts, (), fixed_people, fixed_companies)


def distractor_sentences(rng: random.Random, world: World, question: Question, relation_share: float):
    """An endless stream: relation sentences about entities the question does not fix, each said
    once and only while they last, mixed with filler (`relation_share` of the stream while they last)."""
    works_for = [WORKS_FOR.format(person=p, company=world.employer[p])
                 for p in world.people if p not in question.fixed_people]
    rng.shuffle(works_for)
    # "based in" sentences level the cities: each next one names a city stated least so far (the
    # question's own facts count), so that however few fit, no city, the answer's included, is
    # named in more of them than another, give or take one.
    stated = Counter(world.base[c] for c in question.fixed_companies)
    ranked = []
    for city in world.cities:
        companies = [c for c in world.companies if world.base[c] == city and c not in question.fixed_companies]
        rng.shuffle(companies)
        ranked += [(stated[city] + rank, rng.random(), company) for rank, company in enumerate(companies)]
    based_in = [BASED_IN.format(company=c, city=world.base[c]) for *_, c in sorted(ranked)]
    while True:
        if (works_for or based_in) and rng.random() < relation_share:
            # A random interleaving of the two lists, each kept in its order.
            pick_works = rng.random() < len(works_for) / (len(works_for) + len(based_in))
            yield (works_for if pick_works else based_in).pop(0)
            continue
        person, person2 = rng.sample(world.people, 2)
        yield rng.choice(_FILLER).format(
            person=person, person2=person2, city=rng.choice(world.cities), company=rng.choice(world.companies),
            year=rng.randint(*YEARS), hobby=rng.choice(_HOBBIES), product=rng.choice(_PRODUCTS),
            event=rng.choice(_EVENTS), place=rng.choice(_PLACES), season=rng.choice(_SEASONS),
            topic=rng.choice(_TOPICS))


def _joined(sentences: list[str]) -> list[str]:
    # HotpotQA's convention: sentences after a paragraph's first keep their leading space.
    return [sentence if i == 0 else " " + sentence for i, sentence in enumerate(sentences)]


def make_example(index: int, *, seed: int, length: int, min_distance: int, comparison_fraction: float,
                 count_tokens: CountTokens, relation_share: float = RELATION_SHARE, chain_order: bool = False) -> dict:
    """Example `index` of the file seeded by `seed`, as a HotpotQA record (see the module docstring).

    The example depends only on (`seed`, `index`) and the other arguments. The caller has checked
    that `length` fits two facts `min_distance` apart (`make_examples`, by `shortest_length`).

    Args:
        index: the example's number in its file.
        seed: the file's seed.
        length: wordpieces of the whole long input, `[CLS] question [SEP]` ... `[SEP]` included.
        min_distance: wordpieces strictly between the two facts.
        comparison_fraction: the chance that the question is a comparison (else a bridge).
        count_tokens: token counts of texts under the tokenizer (`wordpiece_counter`).
        relation_share: share of distractor sentences that state a relation about other entities;
            0: none, and no decoys.
        chain_order: the facts in the order of the chain; off, in a random order.

    Returns:
        A HotpotQA record: _id, question, answer, type, level, supporting_facts, context.
    """
    rng = random.Random(f"longdoc-multihop:{seed}:{index}")
    world = World.draw(rng, length)
    question = (comparison_question if rng.random() < comparison_fraction else bridge_question)(rng, world)
    if relation_share == 0:
        # No relation distractors: then no decoys either, and each relation is stated only by the facts.
        question = replace(question, decoys=())
    # [CLS] question [SEP] ... [SEP], the facts and the decoys come out of the budget first (it
    # exceeds min_distance: make_examples checked the length with shortest_length).
    budget = length - SPECIAL_TOKENS - sum(count_tokens([question.text, *question.facts, *question.decoys]))

    # Paragraphs of distractors until the budget is spent: (title, sentences, token counts of the
    # title and then of each sentence).
    paragraphs: list[tuple[str, list[str], list[int]]] = []
    stream = distractor_sentences(rng, world, question, relation_share)
    used = 0
    full = False
    while not full:
        title = TITLE.format(number=len(paragraphs) + 1)
        wanted = rng.randint(*SENTENCES_PER_PARAGRAPH)
        sentences = [next(stream) for _ in range(wanted)]
        counts = count_tokens([title] + _joined(sentences))
        if used + counts[0] + counts[1] > budget:
            break
        used += counts[0]
        kept, kept_counts = [], [counts[0]]
        for sentence, count in zip(sentences, counts[1:]):
            if used + count > budget:
                full = True
                break
            kept.append(sentence)
            kept_counts.append(count)
            used += count
        paragraphs.append((title, kept, kept_counts))

    # Insertion slots (paragraph, position before sentence i) and the wordpieces before each.
    slots, offsets, position = [], [], 0
    for p, (title, sentences, counts) in enumerate(paragraphs):
        position += counts[0]
        for i in range(len(sentences) + 1):
            slots.append((p, i))
            offsets.append(position)
            if i < len(sentences):
                position += counts[i + 1]
    # A pair (a, b), a before b, whose distractors in between make at least min_distance
    # wordpieces, drawn uniformly among all such pairs (offsets never decrease, so the b of an a
    # are all slots from the first one far enough on).
    first_far = [max(a + 1, bisect.bisect_left(offsets, offsets[a] + min_distance)) for a in range(len(slots))]
    later = [max(0, len(slots) - b) for b in first_far]
    assert any(later), f"length {length} passed shortest_length but fits no two facts {min_distance} apart"
    a = rng.choices(range(len(slots)), weights=later)[0]
    b = rng.randrange(first_far[a], len(slots))
    # A draw is made either way, so chain_order changes nothing else in the example.
    swap = rng.random() < 0.5 and not chain_order
    first, second = question.facts[::-1] if swap else question.facts
    # Insert the later one first so the earlier slot's position stays valid.
    for (p, i), fact in ((slots[b], second), (slots[a], first)):
        paragraphs[p][1].insert(i, fact)
    # Decoys anywhere (between the facts they only lengthen the distance).
    for decoy in question.decoys:
        sentences = rng.choice(paragraphs)[1]
        sentences.insert(rng.randint(0, len(sentences)), decoy)
    supporting = {}
    for title, sentences, _ in paragraphs:
        for i, sentence in enumerate(sentences):
            if sentence in question.facts:
                supporting[sentence] = [title, i]
    return {
        "_id": f"multihop-{seed}-{index:06d}",
        "question": question.text,
        "answer": question.answer,
        "type": question.type,
        "level": "hard",
        "supporting_facts": [supporting[fact] for fact in question.facts],
        "context": [[title, _joined(sentences)] for title, sentences, _ in paragraphs],
    }


def wordpiece_counter(tokenizer) -> CountTokens:
    """Token counts of texts under `tokenizer`, without special tokens."""
    def count(texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    return count


def _longest_fields(count_tokens: CountTokens) -> dict[str, str]:
    """Each template field at the value with the most wordpieces that the generator can draw.
    WordPiece splits at spaces and punctuation first, so a sentence counts the sum of its words'
    pieces: these values make each template's longest sentence."""
    def longest(values: Sequence[str]) -> str:
        counts = count_tokens(values)
        return values[counts.index(max(counts))]

    def joined(parts: Sequence[Sequence[str]]) -> list[str]:
        return ["".join(combination) for combination in product(*parts)]

    # People and companies are two words ("{first} {last}", "{name} {kind}"): each word at its longest.
    person = longest(joined(_FIRST)) + " " + longest(joined(_LAST))
    company = longest(joined(_COMPANY[:2])) + " " + longest(_COMPANY[2])
    return dict(person=person, person2=person, company=company, city=longest(CITIES),
                year=longest([str(year) for year in range(YEARS[0], YEARS[1] + 1)]), hobby=longest(_HOBBIES),
                product=longest(_PRODUCTS), event=longest(_EVENTS), place=longest(_PLACES),
                season=longest(_SEASONS), topic=longest(_TOPICS))


def shortest_length(count_tokens: CountTokens, length: int, min_distance: int | None,
                    relation_share: float) -> tuple[int, str]:
    """The fewest wordpieces an example needs for its facts `min_distance` apart (None: half of the
    length) whatever is drawn, and why, in words: [CLS]/[SEP], the question with its facts and
    decoys at their longest, the distance, and what filling paragraphs may leave unused (less than a
    title and a sentence) plus the first title, which lies before every fact slot. `length`, the
    length asked for, bounds the title numbers."""
    fields = _longest_fields(count_tokens)
    works_for, based_in = WORKS_FOR.format(**fields), BASED_IN.format(**fields)
    decoys = [VISITED.format(**fields)] if relation_share > 0 else []
    kinds = [
        [max(BRIDGE_QUESTIONS, key=lambda q: count_tokens([q.format(**fields)])[0]).format(**fields),
         works_for, based_in, *decoys],
        [SAME_CITY_QUESTION.format(other=fields["company"], **fields), based_in, based_in],
        [SAME_EMPLOYER_QUESTION.format(other=fields["person"], **fields), works_for, works_for],
    ]
    placed = SPECIAL_TOKENS + max(sum(count_tokens(sentences)) for sentences in kinds)
    sentence = max(count_tokens([template.format(**fields) for template in (*_FILLER, WORKS_FOR, BASED_IN)]))
    # An example has fewer paragraphs than wordpieces: no title number reaches `length`.
    title = max(count_tokens([TITLE.format(number=number) for number in range(1, length + 1)]))
    # Filling stops with less than a title and a sentence left (used > budget - title - sentence),
    # and the distance reaches at most what was used past the first title.
    reserve = placed + 2 * title + sentence - 1
    why = (f"[CLS]/[SEP] and the question with its facts and decoys take up to {placed} wordpieces and the "
           f"paragraphs around the facts up to {reserve - placed} more (titles, a sentence that no longer fits)")
    if min_distance is None:
        # length - length // 2 >= reserve first holds at 2 * reserve - 1.
        return 2 * reserve - 1, why + ", and the facts lie at least half the length apart"
    return reserve + min_distance, why + f", and the facts lie at least {min_distance} apart"


def make_examples(n: int, *, seed: int, length: int, min_distance: int | None = None,
                  comparison_fraction: float = 0.2, relation_share: float = RELATION_SHARE, chain_order: bool = False,
                  tokenizer=None, progress: bool = True) -> list[dict]:
    """`n` HotpotQA-format records, examples 0 .. n - 1 of the file seeded by `seed` (`make_example`).

    Before any example is drawn, `length` is checked to fit every draw (`shortest_length`).

    Args:
        n: the number of records.
        seed: the file's seed.
        length: wordpieces of each example's whole long input.
        min_distance: wordpieces strictly between the two facts; None: half of `length`.
        comparison_fraction: the share of comparison questions, in [0, 1] (the rest are bridge
            questions).
        relation_share: share of distractor sentences that state a relation about other entities,
            in [0, 1] (0: none, and no decoys: the facts are the only "works for" and "based in"
            sentences, so reading far enough is all a bridge question asks).
        chain_order: the facts in the order of the chain ("A works for B." before "B is based in
            C.", so the answer always lies past `min_distance`) rather than in a random order.
        tokenizer: the tokenizer whose wordpieces are counted; None: longdoc's default (MiniLM's
            WordPiece).
        progress: show a progress bar over the examples.

    Returns:
        The records, in index order.

    Raises:
        OptionError: `n` or `length` not positive, a share outside [0, 1], a negative
            `min_distance`, or a `length` too short for `min_distance` (saying the minimum and why).
    """
    from tqdm.auto import tqdm

    if n < 1 or length < 1:
        raise OptionError("{n} and {length} must be positive, got {got_n} and {got_length}", got_n=n, got_length=length)
    if not 0.0 <= comparison_fraction <= 1.0:
        raise OptionError("{comparison_fraction} must be in [0, 1], got {got}", got=comparison_fraction)
    if not 0.0 <= relation_share <= 1.0:
        raise OptionError("{relation_share} must be in [0, 1], got {got}", got=relation_share)
    if min_distance is not None and min_distance < 0:
        raise OptionError("{min_distance} must be >= 0, got {got}", got=min_distance)
    if tokenizer is None:
        from longdoc.convert.pretrained import default_tokenizer

        tokenizer = default_tokenizer()
    count_tokens = wordpiece_counter(tokenizer)
    # Before any example is drawn: a length that fits every draw.
    shortest, why = shortest_length(count_tokens, length, min_distance, relation_share)
    if length < shortest:
        template = ("{length} {got_length} is too short for {min_distance} " +
                    ("left at half of {length}" if min_distance is None else "{got_distance}") +
                    ": the minimum is {shortest}, because {why}; raise {length} or lower {min_distance}")
        raise OptionError(template, got_length=length, got_distance=min_distance, shortest=shortest, why=why)
    min_distance = length // 2 if min_distance is None else min_distance
    return [make_example(index, seed=seed, length=length, min_distance=min_distance,
                         comparison_fraction=comparison_fraction, count_tokens=count_tokens,
                         relation_share=relation_share, chain_order=chain_order)
            for index in tqdm(range(n), desc="multihop examples", unit=" examples", disable=not progress)]


def guessing_f1(records: Sequence[dict]) -> float:
    """The answer F1 (official metric) expected of a reader that knows each question's kind but not
    its bridge: a bridge question answered with the city of one of its document's "based in"
    sentences, drawn uniformly; a comparison answered yes or no by a coin. What "near chance" means
    for a file: with relation distractors, reading a "based in" sentence is easy and finding the
    right one is the task (about 1 / the world's cities at 2048 wordpieces); without them (the
    demo's setting) the only "based in" sentence is the answer's, and guessing is reading far enough."""
    from longdoc.evaluate.answers import answer_scores

    based_in = re.compile(re.escape(BASED_IN).replace(r"\{company\}", ".+").replace(r"\{city\}", "(.+)"))
    total = 0.0
    for record in records:
        if record["answer"] in ("yes", "no"):
            total += 0.5  # the coin is right half the time, and then exactly
            continue
        cities = [match.group(1) for _, paragraph in record["context"] for sentence in paragraph
                  if (match := based_in.fullmatch(sentence.strip()))]
        total += sum(answer_scores(city, record["answer"]).f1 for city in cities) / max(len(cities), 1)
    return total / max(len(records), 1)


def write_examples(out, n: int, **options) -> Path:
    """`make_examples(n, **options)` written to `out` as one HotpotQA JSON list (atomically)."""
    atomic_write_json(out, make_examples(n, **options), indent=None)
    return Path(out)
