"""Invented names and the word pools of the demo world.

Every person and place is built from syllables by a seeded `NameMaker`, so no name can
be mistaken for a real person or place; book titles, awards and publishers combine
ordinary English words with those invented names. Nothing here keeps global state: the
pools are constant tuples and all randomness goes through the caller's `random.Random`.
"""
from __future__ import annotations

import random

ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "pr",
          "r", "s", "st", "t", "th", "tr", "v", "vr", "z", "sh", "ch", "sk", "y")
VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ia", "ou", "y", "au", "eo")
CODAS = ("", "", "", "n", "r", "l", "s", "th", "nd", "rn", "sk", "v", "x", "m", "lt")
FIRST_ENDINGS = ("a", "ia", "elle", "ine", "or", "an", "ek", "us", "in", "eth", "is", "o")
SURNAME_ENDINGS = ("", "", "en", "ar", "ith", "ow", "ell", "ask", "orn", "ivy", "eux")
PLACE_SUFFIXES = ("holm", "mere", "vast", "ora", "ith", "gard", "dell", "ara", "oth",
                  "avel", "ix", "und", "enne", "ost", "imar")

# Real given names and words the syllable scheme can produce; never used as names.
BLOCKLIST = frozenset("""
Maria Marin Doris Boris Karin Darin Nora Sara Lara Tara Vera Dora Mara Zara Nasa Bound Sound
Round Found Mound Ground Tous Lisa Rosa Rita Nina Dina Tina Gina Lina Mona Sonia Tania Kara
Dara Lena Rena Tomas Linus Marcus Rufus Darius Sasha Misha Pasha Dasha Masha Kian Dian Brian
Hugo Bruno Nico Dino Gino Hans Lars Stan Leon Dion Zion Mario Dario Kirk Mark Bart Karl Carl
Thor Lukas Niklas Tobias Elias Tristan Stefan Kristin Dustin Justin Martin Morgan Logan Megan
Brenda Linda Vanda Wanda Sandra Kendra Stella Bella Della Ella Daria Nadia Lydia Sofia Livia
""".split())
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
ADJECTIVES = ("Silent", "Glass", "Hollow", "Burning", "Crooked", "Drowned", "Amber",
              "Winter", "Salt", "Iron", "Paper", "Velvet", "Distant", "Sleeping",
              "Broken", "Lantern", "Copper", "Hidden", "Seventh", "Ashen", "Quiet",
              "Wandering", "Forgotten", "Painted", "Bitter", "Golden", "Northern",
              "Tidal", "Borrowed", "Scarlet", "Patient", "Restless", "Marble", "Feathered")
NOUNS = ("Orchard", "Lighthouse", "Harbour", "Cartographer", "Clockmaker", "Widow",
         "Ferryman", "Archive", "Garden", "Bridge", "Mirror", "Tide", "Letter", "Compass",
         "Orphan", "Observatory", "Vineyard", "Sparrow", "Choir", "Ledger", "Quarry",
         "Meadow", "Tapestry", "Monastery", "Caravan", "Estuary", "Alphabet", "Kite",
         "Furnace", "Island", "Weaver", "Oracle", "Lantern", "Salt Road", "Winter Fair")
GENRES = ("maritime fantasy", "speculative folklore", "political satire",
          "historical romance", "mountain noir", "pastoral mystery", "epistolary fiction",
          "literary horror", "courtly intrigue", "frontier saga", "magical realism",
          "comic fable", "philosophical thriller", "domestic tragedy", "river adventure",
          "lyrical memoir")
JOBS = ("lighthouse keeper", "glassblower", "cartographer", "river pilot", "bookbinder",
        "beekeeper", "clockmaker", "ferry clerk", "stonemason", "botanist", "midwife",
        "archivist", "shipwright", "tailor", "surveyor", "violin maker", "schoolteacher",
        "apothecary", "orchard farmer", "weaver", "tram conductor", "salt merchant",
        "astronomer", "printer", "lamplighter", "court translator", "cheesemaker",
        "harbour master", "falconer", "organ tuner", "potter", "railway engineer")
THEMES = ("memory", "exile", "grief", "inheritance", "betrayal", "forgiveness", "silence",
          "ambition", "migration", "faith", "obsession", "loyalty", "solitude", "ruin",
          "childhood", "rivalry", "the sea", "language", "power", "time", "home",
          "madness", "justice", "hunger", "war", "friendship", "secrecy", "wonder")
PRIZE_FIELDS = ("Fiction", "Poetry", "Lyrical Prose", "Historical Fiction",
                "Short Stories", "Fantasy Writing", "Literary Translation", "the Novel",
                "Young Readers", "Crime Fiction", "Satire", "Narrative Nonfiction")
CENTURIES = ("fourteenth", "fifteenth", "sixteenth", "seventeenth", "eighteenth",
             "nineteenth")
MOVEMENTS = ("the Lantern School", "the Tidewater Circle", "the Ashen Realists",
             "the Northern Romantics", "the Copper Modernists", "the Salt Road Poets",
             "the Glass Symbolists", "the Quiet Naturalists")


class NameMaker:
    """Makes unique invented names with a caller-owned `random.Random`."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _syllable(self) -> str:
        return self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + self.rng.choice(CODAS)

    def _unique(self, make, longest: int = 10) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used and name not in BLOCKLIST and 4 <= len(name) <= longest:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted")

    def _word(self, endings: tuple[str, ...], syllables: int = 1, longest: int = 10) -> str:
        def make() -> str:
            stem = "".join(self._syllable() for _ in range(syllables))
            return (stem + self.rng.choice(endings)).capitalize()
        return self._unique(make, longest)

    def first_name(self) -> str:
        """A given name, e.g. 'Draveth'."""
        return self._word(FIRST_ENDINGS, longest=8)

    def surname(self) -> str:
        """A family name, e.g. 'Skoulmarow'."""
        return self._word(SURNAME_ENDINGS, syllables=2, longest=9)

    def place(self) -> str:
        """A town, river or country name, e.g. 'Vreithholm'."""
        return self._word(PLACE_SUFFIXES)

    def coined(self, suffixes: tuple[str, ...]) -> str:
        """A coined word with one of `suffixes`, e.g. a language ('Draskese')."""
        return self._word(suffixes)

    def person(self, surname: str | None = None) -> str:
        """A full name; pass `surname` to give a relative the family name."""
        return f"{self.first_name()} {surname or self.surname()}"
