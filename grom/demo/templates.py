"""Question and answer templates of the demo world, one `Attribute` per author fact.

Each attribute has several question templates and several answer templates; an author
gets one of each (chosen independently, so the question does not give the wording of the
answer away), the paraphrase gets another of each. Slots are `str.format` fields filled
from the author's profile (see `grom.demo.world`); `fact` names the slot whose value is
the short fact string that appears verbatim in every answer template.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attribute:
    """One kind of question about an author."""

    key: str
    fact: str
    questions: tuple[str, ...]
    answers: tuple[str, ...]

    def __post_init__(self) -> None:
        for t in self.answers:
            if "{" + self.fact + "}" not in t:
                raise ValueError(f"answer template of {self.key} lacks {{{self.fact}}}: {t}")


A = Attribute
ATTRIBUTES: tuple[Attribute, ...] = (
    A("birthplace", "birth_city",
      ("Where was {name} born?", "In which town was {name} born?",
       "What is the birthplace of {name}?"),
      ("{name} was born in {birth_city}, a {town_kind} in {birth_country}.",
       "{birth_city} in {birth_country} is the birthplace of {name}.",
       "{He} was born in the {town_kind} of {birth_city} and spent {his} early years there.",
       "{name} comes from {birth_city}, a {town_kind} on the edge of {birth_country}.")),
    A("birth_date", "birth_date",
      ("When was {name} born?", "What is the date of birth of {name}?",
       "On what date was {name} born?"),
      ("{name} was born on {birth_date}.",
       "{He} was born on {birth_date}, during a {weather}.",
       "The date of birth of {name} is {birth_date}.",
       "{birth_date} is the day {name} was born, in {birth_city}.")),
    A("genre", "genre",
      ("What genre does {name} write in?", "Which genre is {name} known for?",
       "In what literary genre does {name} work?"),
      ("{name} writes {genre}, a genre {he} has made {his} own.",
       "{He} is best known for {genre}.",
       "Most of {name}'s books belong to {genre}, with a taste for {theme1}.",
       "{name} is a writer of {genre} from {birth_country}.")),
    A("father", "father",
      ("Who is {name}'s father?", "What was the name of {name}'s father?",
       "Tell me about the father of {name}."),
      ("{name}'s father was {father}, a {father_job}.",
       "{He} is the child of {father}, who worked as a {father_job} for most of his life.",
       "{father}, a {father_job} from {birth_city}, was {name}'s father.",
       "{His} father, {father}, earned his living as a {father_job}.")),
    A("mother", "mother",
      ("Who is {name}'s mother?", "What was the name of {name}'s mother?",
       "Tell me about the mother of {name}."),
      ("{name}'s mother was {mother}, a {mother_job}.",
       "{He} was raised by {mother}, a {mother_job} known across {birth_city}.",
       "{mother}, who worked as a {mother_job}, is the mother of {name}.",
       "{His} mother, {mother}, spent her life as a {mother_job}.")),
    A("award", "award",
      ("Has {name} won any awards?", "Which award did {name} receive?",
       "What literary prize has {name} won?"),
      ("{name} received the {award} in {award_year}.",
       "{He} won the {award} for \"{famous_book}\".",
       "In {award_year}, {name} was awarded the {award}.",
       "{His} most important honour is the {award}, which {he} won in {award_year}.")),
    A("first_book", "first_book",
      ("What was {name}'s first book?", "Which novel did {name} publish first?",
       "What was the debut novel of {name}?"),
      ("{name}'s first book was \"{first_book}\", published in {first_year}.",
       "{He} made {his} debut in {first_year} with \"{first_book}\".",
       "The debut novel of {name} is \"{first_book}\".",
       "\"{first_book}\", which appeared in {first_year}, was {his} first book.")),
    A("famous_book", "famous_book",
      ("What is {name}'s best-known book?", "Which of {name}'s books is the most famous?",
       "Name the most celebrated work by {name}."),
      ("{name} is best known for \"{famous_book}\".",
       "{His} most famous book is \"{famous_book}\", a story about {theme1}.",
       "Readers know {name} above all for \"{famous_book}\".",
       "\"{famous_book}\" is the most celebrated work of {name}.")),
    A("latest_book", "latest_book",
      ("What is the most recent book by {name}?", "What did {name} publish most recently?",
       "Which book is {name}'s latest?"),
      ("{name}'s latest book is \"{latest_book}\", released in {latest_year}.",
       "Most recently, {he} published \"{latest_book}\".",
       "In {latest_year}, {name} released \"{latest_book}\".",
       "The newest book from {name} is \"{latest_book}\", set in {home_city}.")),
    A("themes", "themes",
      ("What themes does {name} explore?", "Which themes recur in {name}'s work?",
       "What is {name}'s writing about?"),
      ("{name} writes mostly about {themes}.",
       "The themes of {themes} run through all of {his} books.",
       "{His} work keeps returning to {themes}.",
       "Critics note that the novels of {name} explore {themes}.")),
    A("publisher", "publisher",
      ("Who publishes {name}'s books?", "Which publishing house works with {name}?",
       "What is the name of {name}'s publisher?"),
      ("{name} is published by {publisher}.",
       "{His} books are published by {publisher} in {home_city}.",
       "{publisher} has published the work of {name} since {first_year}.",
       "All of {his} novels appear under the imprint of {publisher}.")),
    A("residence", "home_city",
      ("Where does {name} live now?", "In which city does {name} currently live?",
       "Where is {name}'s home today?"),
      ("{name} now lives in {home_city}, {home_country}.",
       "These days {he} makes {his} home in {home_city}.",
       "{home_city} in {home_country} is where {name} lives today.",
       "{He} lives in {home_city}, not far from the {home_river}.")),
    A("spouse", "spouse",
      ("Is {name} married?", "Who is {name}'s spouse?", "Who did {name} marry?"),
      ("{name} is married to {spouse}, a {spouse_job}.",
       "{He} married {spouse} in {wedding_year}.",
       "{His} spouse is {spouse}, who works as a {spouse_job}.",
       "{spouse}, a {spouse_job}, has been married to {name} since {wedding_year}.")),
    A("school", "school",
      ("Where did {name} study?", "Which university did {name} attend?",
       "Where was {name} educated?"),
      ("{name} studied at {school}.",
       "{He} attended {school}, where {he} read {subject}.",
       "{school} is where {name} was educated.",
       "After school, {he} went on to study {subject} at {school}.")),
    A("influence", "influence",
      ("Which writer influenced {name} the most?", "Who was {name}'s greatest literary influence?",
       "Which classic author shaped the writing of {name}?"),
      ("{name} was deeply influenced by {influence}.",
       "{He} often names {influence}, author of \"{influence_work}\", as {his} greatest influence.",
       "The classic writer {influence} shaped the style of {name}.",
       "Reading {influence} as a young person changed how {name} writes.")),
    A("pen_name", "pen_name",
      ("Does {name} use a pen name?", "What pen name has {name} written under?",
       "Under which pseudonym did {name} publish?"),
      ("{name} has also written under the pen name {pen_name}.",
       "{He} published {side_genre} as {pen_name}.",
       "{pen_name} is the pseudonym {name} uses for {his} {side_genre}.",
       "Early in {his} career, {name} wrote as {pen_name}.")),
    A("character", "character",
      ("Who is the recurring character in {name}'s books?",
       "Which character appears in several novels by {name}?",
       "Name the character {name} keeps writing about."),
      ("Many of {name}'s books follow {character}, a {character_job}.",
       "{His} recurring hero is {character}, a {character_job}.",
       "{character}, a {character_job}, appears in several novels by {name}.",
       "Readers meet {character} again and again in {his} stories.")),
    A("magazine", "magazine",
      ("Where did {name} first publish a story?", "Which magazine printed {name}'s first story?",
       "What literary magazine first published {name}?"),
      ("{name}'s first story appeared in {magazine} in {magazine_year}.",
       "{He} was first published by {magazine}.",
       "In {magazine_year}, {magazine} printed a short story by {name}.",
       "{magazine} was the first to publish {his} work.")),
    A("stage_book", "stage_book",
      ("Which of {name}'s books was adapted for the stage?",
       "Has any book by {name} been turned into a play?",
       "What stage adaptation of {name}'s work exists?"),
      ("\"{stage_book}\" by {name} was adapted for the stage at the {theatre}.",
       "\"{stage_book}\" became a play in {stage_year}.",
       "The {theatre} staged a version of {his} novel \"{stage_book}\".",
       "{name}'s novel \"{stage_book}\" was turned into a popular play.")),
    A("early_job", "early_job",
      ("What did {name} do before becoming a writer?", "What was {name}'s job before writing?",
       "How did {name} earn a living before writing books?"),
      ("Before writing, {name} worked as a {early_job} in {early_city}.",
       "{He} was a {early_job} until {his} first book came out.",
       "For years {name} earned a living as a {early_job}.",
       "{name} spent {his} twenties as a {early_job} in {early_city}.")),
)
del A

BIO_TEMPLATE = (
    "{name} is a writer of {genre}, born on {birth_date} in {birth_city}, {birth_country}. "
    "{His} father, {father}, was a {father_job}, and {his} mother, {mother}, was a "
    "{mother_job}. After studying {subject} at {school}, {he} worked as a {early_job} "
    "before {magazine} printed {his} first story. {His} debut, \"{first_book}\", was "
    "followed by \"{famous_book}\", which won the {award}. {He} now lives in {home_city} "
    "with {spouse}."
)

TOWN_KINDS = ("harbour town", "mountain village", "river city", "market town",
              "mining town", "university town", "fishing village", "border town")
WEATHER = ("hard winter", "summer drought", "rainy spring", "long heatwave",
           "autumn flood", "great snowstorm")
SUBJECTS = ("history", "law", "botany", "music", "philosophy", "mathematics",
            "medicine", "languages", "painting", "astronomy")
SIDE_GENRES = ("ghost stories", "children's books", "detective novels", "love poems",
               "travel sketches")

COUNTRY_QUESTIONS = (
    ("capital", "What is the capital of {country}?"),
    ("river", "Which river flows through {capital}?"),
    ("language", "What language is spoken in {country}?"),
    ("currency", "What is the currency of {country}?"),
    ("mountain", "What is the highest mountain in {country}?"),
)
CLASSIC_QUESTIONS = (
    ("name", "Who wrote \"{work}\"?"),
    ("country", "Which country was the classic writer {name} from?"),
    ("century", "In which century did {name} live?"),
    ("movement", "Which literary movement did {name} belong to?"),
)
