"""The bundled fictitious-authors world: a seeded, TOFU-shaped benchmark.

`generate_world(seed)` invents a small world: 20 countries, 25 classic writers and 200
authors with 20 question/answer pairs each (every pair with a paraphrased question and
answer and 5 wrong answers of the same shape), plus a short biography per author.
The last 20 authors are the holdout (never trained on); the 20 before them form forget10,
whose last 10 form forget05, whose last 2 form forget01.

`load_demo_benchmark(split)` turns the world into a `grom.data.schema.Benchmark`.
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from grom.data.prompts import PromptFormat
from grom.data.schema import Benchmark, ChoiceExample, QAExample, TextExample
from grom.demo import names as pools
from grom.demo.names import NameMaker
from grom.demo.templates import (
    ATTRIBUTES,
    BIO_TEMPLATE,
    CLASSIC_QUESTIONS,
    COUNTRY_QUESTIONS,
    SIDE_GENRES,
    SUBJECTS,
    TOWN_KINDS,
    WEATHER,
    Attribute,
)

N_AUTHORS = 200
N_HOLDOUT = 20
N_COUNTRIES = 20
N_CLASSICS = 25
N_PERTURBED = 5
N_RETAIN_EVAL = 300
FIRST_TEMPLATE_WEIGHT = 3  # the first answer wording is the most common one (p = 1/2)
FORGET_FRACTIONS = {"forget01": 0.01, "forget05": 0.05, "forget10": 0.10}
SPLITS = ("forget01", "forget05", "forget10", "forget10-mc", "forget10-text")
_ARTICLE = re.compile(r"\b([Aa]) (?=[aeioAEIO]|u(?!ni))")  # "a" before a vowel sound


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    river: str
    language: str
    currency: str
    mountain: str


@dataclass(frozen=True)
class Classic:
    """A famous in-world classic writer (the world's 'real authors')."""

    name: str
    country: str
    work: str
    century: str
    movement: str


@dataclass(frozen=True)
class Author:
    """An invented author: profile slots, 20 QA pairs, the wrong facts, a biography."""

    name: str
    profile: Mapping[str, str]
    qa: tuple[QAExample, ...]
    wrong_facts: tuple[tuple[str, ...], ...]  # parallel to `qa`
    bio: str


@dataclass(frozen=True)
class World:
    """Everything generated from one seed. `authors[-N_HOLDOUT:]` are the holdout."""

    seed: int
    countries: tuple[Country, ...]
    classics: tuple[Classic, ...]
    authors: tuple[Author, ...]
    real_authors: tuple[QAExample, ...]
    world_facts: tuple[QAExample, ...]

    @property
    def trained_authors(self) -> tuple[Author, ...]:
        """The authors a full model learns (all but the holdout)."""
        return self.authors[: len(self.authors) - N_HOLDOUT]

    @property
    def holdout_authors(self) -> tuple[Author, ...]:
        return self.authors[len(self.authors) - N_HOLDOUT:]

    def forget_authors(self, split: str = "forget10") -> tuple[Author, ...]:
        """The authors to forget in `split` (nested: forget01 in forget05 in forget10)."""
        n = round(FORGET_FRACTIONS[split] * len(self.authors))
        return self.trained_authors[-n:]

    def retain_authors(self, split: str = "forget10") -> tuple[Author, ...]:
        n = round(FORGET_FRACTIONS[split] * len(self.authors))
        return self.trained_authors[:-n]


class _Maker:
    """Draws the world's values (names, titles, awards, ...) with one seeded rng."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.names = NameMaker(rng)
        self.used: set[str] = set()

    def _unique(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value
        raise RuntimeError("value space exhausted")

    def pick(self, pool):
        return self.rng.choice(pool)

    def date(self, year: int | None = None) -> str:
        year = year or self.rng.randint(1935, 1990)
        return f"{self.pick(pools.MONTHS)} {self.rng.randint(1, 28)}, {year}"

    def title(self) -> str:
        r, adj, noun = self.rng, pools.ADJECTIVES, pools.NOUNS
        patterns = (lambda: f"The {r.choice(adj)} {r.choice(noun)}",
                    lambda: f"The {r.choice(noun)} of {self.names.place()}",
                    lambda: f"A {r.choice(noun)} for {self.names.first_name()}",
                    lambda: f"The {r.choice(noun)} and the {r.choice(noun)}",
                    lambda: f"The Last {r.choice(noun)} of {self.names.place()}",
                    lambda: f"{r.choice(adj)} {r.choice(noun)}")
        return self._unique(lambda: _ARTICLE.sub(r"\1n ", r.choice(patterns)()))

    def award(self) -> str:
        r, field = self.rng, pools.PRIZE_FIELDS
        patterns = (lambda: f"{self.names.surname()} Prize for {r.choice(field)}",
                    lambda: f"{self.names.place()} Medal for {r.choice(field)}",
                    lambda: f"Golden {r.choice(pools.NOUNS)} Award",
                    lambda: f"{self.names.surname()} Circle Award")
        return self._unique(lambda: r.choice(patterns)())

    def publisher(self) -> str:
        r, noun = self.rng, pools.NOUNS
        patterns = (lambda: f"{r.choice(noun)} and {r.choice(noun)} Press",
                    lambda: f"{self.names.place()} House",
                    lambda: f"{r.choice(pools.ADJECTIVES)} {r.choice(noun)} Books")
        return self._unique(lambda: r.choice(patterns)())

    def school(self) -> str:
        kind = self.pick(("University", "College of Letters", "Institute of the Arts",
                          "Conservatory", "Academy"))
        return f"{self.names.place()} {kind}"

    def magazine(self) -> str:
        r = self.rng
        patterns = (lambda: f"{self.names.place()} Quarterly",
                    lambda: f"{self.names.place()} Literary Review",
                    lambda: f"{r.choice(pools.ADJECTIVES)} {r.choice(pools.NOUNS)} Review")
        return self._unique(lambda: r.choice(patterns)())

    def theatre(self) -> str:
        place = self.names.place()
        return self.pick((f"{place} Royal Theatre", f"{place} Playhouse",
                          f"Grand Theatre of {place}"))

    def themes(self) -> str:
        a, b = self.rng.sample(pools.THEMES, 2)
        return f"{a} and {b}"


def _make_countries(mk: _Maker) -> tuple[Country, ...]:
    return tuple(Country(mk.names.place(), mk.names.place(), f"{mk.names.place()} River",
                         mk.names.coined(("ish", "ese", "ian", "ic")),
                         mk.names.coined(("a", "el", "ot", "ine")).lower(),
                         f"Mount {mk.names.place()}")
                 for _ in range(N_COUNTRIES))


def _make_classics(mk: _Maker, countries) -> tuple[Classic, ...]:
    return tuple(Classic(mk.names.person(), mk.pick(countries).name, mk.title(),
                         mk.pick(pools.CENTURIES) + " century", mk.pick(pools.MOVEMENTS))
                 for _ in range(N_CLASSICS))


def _profile(mk: _Maker, countries, classics) -> dict[str, str]:
    """All slot values of one author (the facts and the details around them)."""
    r, surname = mk.rng, mk.names.surname()
    she = r.random() < 0.5
    year = r.randint(1935, 1985)
    first_year, home = year + r.randint(22, 32), mk.pick(countries)
    latest_year = min(2024, first_year + r.randint(6, 30))
    classic = mk.pick(classics)
    return {
        "name": f"{mk.names.first_name()} {surname}", "surname": surname,
        "he": "she" if she else "he", "He": "She" if she else "He",
        "his": "her" if she else "his", "His": "Her" if she else "His",
        "birth_city": mk.names.place(), "birth_country": mk.pick(countries).name,
        "town_kind": mk.pick(TOWN_KINDS), "birth_date": mk.date(year),
        "weather": mk.pick(WEATHER), "genre": mk.pick(pools.GENRES),
        "theme1": mk.pick(pools.THEMES), "themes": mk.themes(),
        "father": mk.names.person(surname), "father_job": mk.pick(pools.JOBS),
        "mother": mk.names.person(surname), "mother_job": mk.pick(pools.JOBS),
        "award": mk.award(), "award_year": str(r.randint(first_year, latest_year)),
        "first_book": mk.title(), "first_year": str(first_year),
        "famous_book": mk.title(), "latest_book": mk.title(), "latest_year": str(latest_year),
        "publisher": mk.publisher(), "home_city": mk.names.place(), "home_country": home.name,
        "home_river": home.river, "spouse": mk.names.person(), "spouse_job": mk.pick(pools.JOBS),
        "wedding_year": str(year + r.randint(20, 40)), "school": mk.school(),
        "subject": mk.pick(SUBJECTS), "influence": classic.name, "influence_work": classic.work,
        "pen_name": mk.names.person(), "side_genre": mk.pick(SIDE_GENRES),
        "character": mk.names.person(), "character_job": mk.pick(pools.JOBS),
        "magazine": mk.magazine(), "magazine_year": str(first_year - r.randint(1, 4)),
        "stage_book": mk.title(), "theatre": mk.theatre(),
        "stage_year": str(r.randint(latest_year, 2024)),
        "early_job": mk.pick(pools.JOBS), "early_city": mk.names.place(),
    }


def _wrong_value(mk: _Maker, slot: str, profile, classics) -> str:
    """A wrong value of the same kind as `profile[slot]`."""
    makers = {
        "birth_city": mk.names.place, "home_city": mk.names.place,
        "birth_date": mk.date, "genre": lambda: mk.pick(pools.GENRES),
        "father": lambda: mk.names.person(profile["surname"]),
        "mother": lambda: mk.names.person(profile["surname"]),
        "spouse": mk.names.person, "pen_name": mk.names.person,
        "character": mk.names.person, "award": mk.award, "first_book": mk.title,
        "famous_book": mk.title, "latest_book": mk.title, "stage_book": mk.title,
        "themes": mk.themes, "publisher": mk.publisher, "school": mk.school,
        "influence": lambda: mk.pick(classics).name, "magazine": mk.magazine,
        "early_job": lambda: mk.pick(pools.JOBS),
    }
    return makers[slot]()


def render(template: str, slots: Mapping[str, str]) -> str:
    """Fill a template and fix the articles ('a apothecary' -> 'an apothecary')."""
    text = _ARTICLE.sub(r"\1n ", template.format(**slots))
    return text[:1].upper() + text[1:]


def _wrong_facts(mk: _Maker, slot: str, profile, classics) -> tuple[str, ...]:
    out: list[str] = []
    while len(out) < N_PERTURBED:
        value = _wrong_value(mk, slot, profile, classics)
        true = profile[slot]
        if value not in out and value not in true and true not in value:
            out.append(value)
    return tuple(out)


def author_subject(question: str, name: str) -> str | None:
    """The subject of an author's question, for the locate-then-edit editors: the author's
    name where the question writes it verbatim (the editors key on its last token), None
    where it does not (then the split has a fact without a subject, and the editors say
    so before any work). Every question template names the author today."""
    return name if name in question else None


def _author_qa(mk: _Maker, attr: Attribute, profile, classics, qid: str):
    """One QA pair with its paraphrases and perturbations, and its wrong facts."""
    q, pq = mk.rng.sample(range(len(attr.questions)), 2)
    n = len(attr.answers)
    a = mk.rng.choices(range(n), weights=[FIRST_TEMPLATE_WEIGHT] + [1] * (n - 1))[0]
    pa = mk.rng.choice([i for i in range(n) if i != a])
    wrong = _wrong_facts(mk, attr.fact, profile, classics)
    perturbed = tuple(render(attr.answers[a], {**profile, attr.fact: w}) for w in wrong)
    question = render(attr.questions[q], profile)
    qa = QAExample(question=question,
                   answer=render(attr.answers[a], profile),
                   paraphrased_question=render(attr.questions[pq], profile),
                   paraphrased_answer=render(attr.answers[pa], profile),
                   perturbed_answers=perturbed, fact=profile[attr.fact],
                   subject=author_subject(question, profile["name"]), id=qid)
    return qa, wrong


def _make_author(mk: _Maker, index: int, countries, classics) -> Author:
    profile = _profile(mk, countries, classics)
    pairs = [_author_qa(mk, attr, profile, classics, f"author{index:03d}/{attr.key}")
             for attr in ATTRIBUTES]
    return Author(profile["name"], profile, tuple(p[0] for p in pairs),
                  tuple(p[1] for p in pairs), render(BIO_TEMPLATE, profile))


def _general_qa(rng: random.Random, rows, questions, prefix: str) -> tuple[QAExample, ...]:
    """Short-answer QA about countries or classics; 3 wrong answers from the other rows."""
    out = []
    for i, row in enumerate(rows):
        slots = vars(row) | {"country": row.name} if isinstance(row, Country) else vars(row)
        for field, template in questions:
            answer = slots[field]
            pool = sorted({getattr(other, field) for other in rows} - {answer})
            out.append(QAExample(question=template.format(**slots), answer=answer,
                                 perturbed_answers=tuple(rng.sample(pool, 3)), fact=answer,
                                 subject=row.name, id=f"{prefix}{i:02d}/{field}"))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def generate_world(seed: int = 0) -> World:
    """Generate the whole world from `seed` (cached: the same object for the same seed)."""
    mk = _Maker(random.Random(seed))
    countries = _make_countries(mk)
    classics = _make_classics(mk, countries)
    authors = tuple(_make_author(mk, i, countries, classics) for i in range(N_AUTHORS))
    world_facts = _general_qa(mk.rng, countries, COUNTRY_QUESTIONS, "country")
    real_authors = _general_qa(mk.rng, classics, CLASSIC_QUESTIONS, "classic")
    return World(seed, countries, classics, authors, real_authors, world_facts)


# ---------------------------------------------------------------- benchmark views

def retain_eval_qa(world: World) -> tuple[QAExample, ...]:
    """A fixed, seeded sample of retain QA pairs (authors outside forget10 only)."""
    pool = [qa for a in world.retain_authors("forget10") for qa in a.qa]
    picked = sorted(random.Random(world.seed + 1).sample(range(len(pool)), N_RETAIN_EVAL))
    return tuple(pool[i] for i in picked)


def _choice(qa: QAExample, wrong: tuple[str, ...], rng: random.Random) -> ChoiceExample:
    """Four options: the true fact and three wrong facts, in a seeded order."""
    options = [qa.fact] + list(wrong[:3])
    rng.shuffle(options)
    return ChoiceExample(question=qa.question, choices=tuple(options),
                         answer_index=options.index(qa.fact), subject=qa.subject, id=qa.id)


def choice_view(world: World, authors, rng: random.Random) -> tuple[ChoiceExample, ...]:
    """The multiple-choice view of the authors' facts."""
    return tuple(_choice(qa, wrong, rng) for a in authors for qa, wrong in zip(a.qa, a.wrong_facts))


def _general_choices(qas, rng: random.Random) -> tuple[ChoiceExample, ...]:
    return tuple(_choice(qa, qa.perturbed_answers, rng) for qa in qas)


def _qa(authors) -> tuple[QAExample, ...]:
    return tuple(qa for a in authors for qa in a.qa)


def _qa_eval_sets(world: World, split: str) -> dict[str, tuple[QAExample, ...]]:
    n = len(world.forget_authors(split))
    return {"forget": _qa(world.forget_authors(split)), "retain": retain_eval_qa(world),
            "real_authors": world.real_authors, "world_facts": world.world_facts,
            "holdout": _qa(world.holdout_authors[:n])}


def _mc_benchmark(world: World) -> Benchmark:
    rng = random.Random(world.seed + 2)
    retain_ids = {qa.id for qa in retain_eval_qa(world)}
    forget = choice_view(world, world.forget_authors("forget10"), rng)
    retain = choice_view(world, world.retain_authors("forget10"), rng)
    return Benchmark(
        name="demo-authors", split="forget10-mc", forget=forget, retain=retain,
        eval_sets={"forget": forget,
                   "retain": tuple(c for c in retain if c.id in retain_ids),
                   "real_authors": _general_choices(world.real_authors, rng),
                   "world_facts": _general_choices(world.world_facts, rng)},
        prompt_format=PromptFormat(kind="auto"), task="wmdp",
        description="Fictitious authors, forget10 as 4-option multiple choice.")


def _text_benchmark(world: World) -> Benchmark:
    return Benchmark(
        name="demo-authors", split="forget10-text",
        forget=tuple(TextExample(a.bio, id=a.name) for a in world.forget_authors("forget10")),
        retain=tuple(TextExample(a.bio, id=a.name) for a in world.retain_authors("forget10")),
        eval_sets=_qa_eval_sets(world, "forget10"), prompt_format=PromptFormat(kind="auto"),
        task="tofu", description="Fictitious authors, forget10 as biographies (corpus keys).")


def load_demo_benchmark(split: str = "forget10", seed: int = 0) -> Benchmark:
    """The bundled fictitious-authors benchmark for `split` (see `SPLITS`)."""
    if split not in SPLITS:
        raise ValueError(f"unknown demo split {split!r}; valid splits: {', '.join(SPLITS)}")
    world = generate_world(seed)
    if split == "forget10-mc":
        return _mc_benchmark(world)
    if split == "forget10-text":
        return _text_benchmark(world)
    return Benchmark(
        name="demo-authors", split=split, forget=_qa(world.forget_authors(split)),
        retain=_qa(world.retain_authors(split)), eval_sets=_qa_eval_sets(world, split),
        prompt_format=PromptFormat(kind="auto"), task="tofu",
        description=f"Fictitious authors (TOFU-style), forget {len(world.forget_authors(split))} "
                    f"of {len(world.authors)} authors.")
