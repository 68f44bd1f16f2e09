"""Grammar v2's lexicon: v1's words, a few real German synonyms, and generated pseudo-words.

Every pseudo-word's English and German forms are built independently from each language's
syllable inventory ("palint" -> "Schwämpel"), so a German form, its gender, plural class,
weak declension, verb class and perfect auxiliary cannot be guessed from the English: they
must be memorised.  No form (in either language, any inflection) is shared with another word
or with v1's words.  Some lemmas get a second German sense, chosen per occurrence by the
sampler.  Lemmas are listed by frequency rank (v1's words first), for Zipf sampling.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fxformer.data import grammar as g

LEXICON_SEED = 2  # part of the corpus version: another seed is another language
NUM_NOUNS, NUM_VERBS, NUM_ADJECTIVES = 800, 300, 200
P_SYNONYM = 0.15  # generated lemmas with a second German form

_EN_ONSETS = ["", "", ""] + (  # "": no onset ("an ...")
    "b bl br c ch cl cr d dr f fl fr g gl gr h j l m n p pl pr r s sc sh sk sl sn sp st t th tr v w".split()
)
_EN_VOWELS = "a e i o u a e i o u ai ea ee oa oo ou".split()
_EN_CODAS = "b ck d ft g k l m mp n nd nk nt p rd rk rn rt sk st t".split()
_EN_SECOND = "b d f g l m n p r s t v z".split()  # onsets of an unstressed second syllable
_EN_ADJ_SUFFIXES = ["", "", "", "y", "ish", "ous", "ful"]
_DE_ONSETS = "b bl br d dr f fl fr g gl gr h k kl kn kr l m n p pf pl r sp st str t tr w z zw".split()
_DE_ONSETS += "sch schl schm schn schr schw".split()
_DE_VOWELS = "a e i o u a e i o u ä ö ü au ei ie eu".split()
_DE_CODAS = "b ch ck f ff g k l ll lk lm m mm n nd ng nk nt p pf r rb rg rk rm rn rt s st t tz".split()
_DE_LONG_CODAS = [c for c in _DE_CODAS if c not in ("ck", "ff", "ll", "mm", "tz")]
_DE_ADJ_SUFFIXES = ["", "", "", "ig", "lich", "isch", "sam", "bar"]
_VERB_PREFIXES = ("be", "ver", "er", "ent", "zer")  # inseparable: no ge- in the participle
_UMLAUT = {"a": "ä", "o": "ö", "u": "ü", "au": "äu"}
_ABLAUT = {"i": "u", "ei": "ie", "ie": "o", "e": "o", "a": "a", "au": "au"}  # singen gesungen, ...
_STRONG_3SG = {"a": "ä", "e": "i", "au": "äu"}  # fahren fährt, helfen hilft, laufen läuft
_KINDS = {"person": 20, "animal": 15, "text": 10, "food": 15, "thing": 20, "furniture": 8, "place": 12}
_FRAMES = {"acc": 45, "dat": 8, "ditr": 10, "intr": 15, "motion": 10, "that": 12}
_ALL_KINDS = tuple(_KINDS)
T = TypeVar("T")
# German-only words of grammar v2 (synonyms of adverbials and conjunctions)
EXTRA_FUNCTION_WORDS = ("nun", "häufig", "täglich", "morgens", "abends", "da", "denn", "obgleich", "ehe")
# Real German synonyms of v1 words: English key -> the second sense
REAL_SYNONYMS: dict[str, g.Noun | g.Verb | g.Adjective] = {
    "boy": g.Noun("boy", "boys", "Knabe", "Knaben", "m", "person", True),
    "car": g.Noun("car", "cars", "Wagen", "Wagen", "m", "thing", False),
    "picture": g.Noun("picture", "pictures", "Foto", "Fotos", "n", "thing", False),
    "doctor": g.Noun("doctor", "doctors", "Doktor", "Doktoren", "m", "person", False),
    "think": g.Verb("think", "thinks", "thought", "meinen", "meint", "gemeint", "haben", "that", ("person",), ()),
    "beautiful": g.Adjective("beautiful", "hübsch", g.ADJECTIVES["beautiful"][1]),
}


@dataclass(frozen=True)
class Lexicon2(g.Lexicon):
    """A v1 Lexicon plus each part of speech's lemmas by frequency rank, each a tuple of its senses' keys."""

    noun_lemmas: tuple[tuple[str, ...], ...] = ()
    verb_lemmas: tuple[tuple[str, ...], ...] = ()
    adjective_lemmas: tuple[tuple[str, ...], ...] = ()


def _en_stem(rng: random.Random) -> str:
    """Two English-like syllables, stressed then unstressed: "palint", "drommick"."""
    first = rng.choice(_EN_ONSETS) + rng.choice(_EN_VOWELS) + rng.choice(["", "", "", "l", "n", "r", "s"])
    return first + rng.choice(_EN_SECOND) + rng.choice("aeiou") + rng.choice(_EN_CODAS)


def _en_s(word: str) -> str:
    """English plural or third person singular: -es after a sibilant, else -s."""
    return word + ("es" if word.endswith(("s", "x", "z", "sh", "ch")) else "s")


def _de_root(rng: random.Random) -> str:
    """One German-like syllable: "schwämp", "kralt" (a doubled consonant only after a short vowel)."""
    vowel = rng.choice(_DE_VOWELS)
    return rng.choice(_DE_ONSETS) + vowel + rng.choice(_DE_CODAS if len(vowel) == 1 else _DE_LONG_CODAS)


def _umlauted(stem: str) -> str:
    """``stem`` with its last vowel umlauted where German can (Stuhl -> Stühl); otherwise unchanged."""
    last = list(re.finditer("[aeiouäöü]+", stem))[-1]
    vowel = _UMLAUT.get(last.group())
    return stem if vowel is None else stem[: last.start()] + vowel + stem[last.end() :]


def _de_noun(rng: random.Random, kind: str) -> tuple[str, str, str, bool]:
    """(singular, plural, gender, weak): gender and plural class at random, weak only for animate -e masculines."""
    root = _de_root(rng)
    gender = rng.choice("mfn")
    weak = kind in ("person", "animal") and gender == "m" and rng.random() < 0.3
    ending = "e" if weak else rng.choice(["", "", "", "e", "el", "er"])
    de = (root + ending).capitalize()
    if ending == "e":  # Blume Blumen, Junge Jungen (weak)
        de_pl = de + "n"
    elif ending in ("el", "er"):  # Lehrer Lehrer, Vogel Vögel, Kartoffel Kartoffeln
        de_pl = rng.choice([de, _umlauted(root).capitalize() + ending, de + "n"])
    else:  # Hund Hunde, Stuhl Stühle, Bild Bilder, Frau Frauen, Park Parks
        de_pl = rng.choice([root, _umlauted(root)]).capitalize() + rng.choice(["e", "e", "er", "en", "s"])
    return de, de_pl, gender, weak


def _de_verb(rng: random.Random, frame: str) -> tuple[str, str, str, str]:
    """(infinitive, 3rd singular, participle, auxiliary): weak, inseparable-prefix or strong, at random."""
    root = _de_root(rng)
    vowel = re.search("[aeiouäöü]+", root).group()
    ending = "et" if root.endswith(("t", "d")) else "t"  # arbeitet, kauft
    form = rng.random()
    if form < 0.15 and vowel in _ABLAUT:  # strong: singen singt gesungen, fahren fährt gefahren
        de_inf, de_3sg = root + "en", root.replace(vowel, _STRONG_3SG.get(vowel, vowel), 1) + ending
        de_pp = "ge" + root.replace(vowel, _ABLAUT[vowel], 1) + "en"
    elif form < 0.35:  # inseparable prefix: besuchen besucht besucht
        de_inf = rng.choice(_VERB_PREFIXES) + root + "en"
        de_3sg = de_pp = de_inf[:-2] + ending
    else:  # weak: kaufen kauft gekauft
        de_inf, de_3sg, de_pp = root + "en", root + ending, "ge" + root + ending
    aux = "sein" if frame == "motion" or (frame == "intr" and rng.random() < 0.25) else "haben"
    return de_inf, de_3sg, de_pp, aux


def _de_adjective(rng: random.Random) -> str:
    """A German adjective stem: "kralt", "schwämpig"."""
    root, suffix = _de_root(rng), rng.choice(_DE_ADJ_SUFFIXES)
    return root + ("" if suffix[:1] == root[-1] else suffix)  # no "holllich"


def _selection(rng: random.Random, frame: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(subject kinds, object kinds) of a generated verb."""
    subjects = ("person",) if frame in ("that", "ditr") or rng.random() < 0.5 else ("person", "animal")
    if frame == "dat":
        return subjects, ("person", "animal")
    if frame == "ditr":
        return subjects, tuple(rng.sample(["text", "food", "thing"], rng.randint(1, 3)))
    if frame == "acc":
        return subjects, tuple(rng.sample(_ALL_KINDS, rng.randint(2, 5)))
    return subjects, ()


def _forms(entry: g.Noun | g.Verb | g.Adjective) -> set[str]:
    """Every surface form of an entry in either language, lowercased (adjectives with each ending)."""
    if isinstance(entry, g.Noun):
        forms = {entry.en, entry.en_pl, entry.de, entry.de_pl, entry.de + "n", entry.de_pl + "n"}
    elif isinstance(entry, g.Verb):
        forms = {entry.en, entry.en_3sg, entry.en_pp, entry.de_inf, entry.de_3sg, entry.de_pp}
    else:
        forms = {entry.en} | {entry.de + ending for ending in ("", "e", "en", "er", "es", "em")}
    return {f.lower() for f in forms}


def _v1_words() -> set[str]:
    """Every word v1 (and v2's synonyms) can write, lowercased, in either language."""
    tables = (g.NUMBERS, g.PRONOUNS, g.PREPOSITIONS, g.ADVERBIALS, g.CONJUNCTIONS, g.AUX, g.DETERMINERS)
    words = set(re.findall(r"[^\W\d_]+", repr(tables).lower()))  # every key and value, split into words
    words |= {stem + e for stem in ("der", "dies", "ein", "mein", "kein") for e in ("", "e", "en", "er", "es", "em")}
    words |= {"das", "die", "den", "dem", "im", "ins", "zum", "zur", "dass", "who", "that", "has", "does", "do", "an"}
    words |= set(EXTRA_FUNCTION_WORDS)
    entries = [*g.LEXICON.nouns.values(), *g.LEXICON.verbs.values(), *g.LEXICON.adjectives.values()]
    return words.union(*map(_forms, entries + list(REAL_SYNONYMS.values())))


def _fresh(rng: random.Random, make: Callable[[random.Random], T], forms: Callable[[T], set[str]], taken: set) -> T:
    """``make(rng)`` drawn until none of its forms is already taken (then they are)."""
    while True:
        item = make(rng)
        if not forms(item) & taken:
            taken |= forms(item)
            return item


def _lemma(rng: random.Random, pos: str, taken: set[str]) -> list[g.Noun | g.Verb | g.Adjective]:
    """A generated lemma's senses: an English form and meaning, with one German form or two synonyms."""
    en = _fresh(rng, _en_stem, lambda w: {w, _en_s(w), w + "ed"} | {w + x for x in _EN_ADJ_SUFFIXES}, taken)
    count = 2 if rng.random() < P_SYNONYM else 1
    lower = lambda forms: {f.lower() for f in forms}
    if pos == "noun":
        kind = rng.choices(list(_KINDS), weights=list(_KINDS.values()))[0]
        noun_forms = lambda n: lower({n[0], n[1], n[0] + "n", n[1] + "n"})
        german = [_fresh(rng, lambda r: _de_noun(r, kind), noun_forms, taken) for _ in range(count)]
        return [g.Noun(en, _en_s(en), de, de_pl, gender, kind, weak) for de, de_pl, gender, weak in german]
    if pos == "verb":
        frame = rng.choices(list(_FRAMES), weights=list(_FRAMES.values()))[0]
        subjects, objects = _selection(rng, frame)
        german = [_fresh(rng, lambda r: _de_verb(r, frame), lambda v: set(v[:3]), taken) for _ in range(count)]
        return [g.Verb(en, _en_s(en), en + "ed", *forms, frame, subjects, objects) for forms in german]
    en += rng.choice(_EN_ADJ_SUFFIXES)
    kinds = tuple(rng.sample(_ALL_KINDS, rng.randint(3, 7)))
    endings = ("", "e", "en", "er", "es", "em")
    german = [_fresh(rng, _de_adjective, lambda a: {a + e for e in endings}, taken) for _ in range(count)]
    return [g.Adjective(en, de, kinds) for de in german]


def build(seed: int = LEXICON_SEED) -> Lexicon2:
    """The v2 lexicon, deterministic in ``seed``: a lemma's senses are keyed "<english>" and "<english>#2"."""
    rng = random.Random(seed)
    taken = _v1_words()
    parts = {"noun": g.LEXICON.nouns, "verb": g.LEXICON.verbs, "adj": g.LEXICON.adjectives}
    counts = {"noun": NUM_NOUNS, "verb": NUM_VERBS, "adj": NUM_ADJECTIVES}
    entries: dict[str, dict] = {pos: {} for pos in parts}
    lemmas: dict[str, list[tuple[str, ...]]] = {pos: [] for pos in parts}
    for pos, v1_entries in parts.items():
        senses_of = [[e] + ([REAL_SYNONYMS[key]] if key in REAL_SYNONYMS else []) for key, e in v1_entries.items()]
        senses_of += [_lemma(rng, pos, taken) for _ in range(counts[pos])]
        for senses in senses_of:
            keys = (senses[0].en, senses[0].en + "#2")[: len(senses)]
            entries[pos].update(zip(keys, senses))
            lemmas[pos].append(keys)
    return Lexicon2(*entries.values(), *(tuple(lemmas[pos]) for pos in parts))
