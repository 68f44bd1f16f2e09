"""Synthetic English->German parallel corpus from a small synchronous grammar.

A sentence is sampled as an abstract structure (``Sentence`` -> ``Clause`` -> ``NP``/``PP``)
and rendered by two independent sets of rules, one per language.  Every choice is visible
on the English side, so the German sentence is a deterministic function of the English one.

Grammar (English order; German order and morphology in brackets)::

    Sentence := [Adverbial] Clause [Conj SubClause] "."   (German: verb second after the adverbial)
              | Conj SubClause "," Clause "."             (German: "Weil ..., schläft der Mann.")
              | Has/Have Clause [Conj SubClause] "?"      (German: verb first: "Hat ... gesehen?")
    Clause   := Subject Verb [Object | Object "to" Recipient] [PP] [RelClause] ["that" SubClause]
                present ("sees") or present perfect ("has seen"; German "hat ... gesehen" with the
                participle clause-final; motion verbs and "folgen" take "sein": "ist ... gegangen")
    SubClause: German verb-final ("..., weil die Frau das Buch gekauft hat")
    RelClause: "who/that" + clause on an animate object (German: "der/die/das" by gender and
               number, verb-final, extraposed after the participle: "hat den Mann gesehen, der ...")
    Recipient: German dative placed before the accusative ("gibt der Frau das Buch")
    NP       := Det [Adj] Noun | Pronoun (subjects only)
                Det: the, a, this/these, my, no, two..twelve, bare plural.  German
                articles and adjectives agree in gender, number and case (nominative subject,
                accusative object, dative object of "helfen/danken/folgen", dative recipient,
                dative after mit/in/auf/unter/hinter/neben/zu, accusative after directional "in");
                strong/weak/mixed adjective endings, dative plural -n, weak nouns ("den Jungen"),
                contractions im/ins/zum/zur.

The renderers take their words from a ``Lexicon`` (``LEXICON`` here) and can also render a PP or
a relative clause inside a noun phrase ("der Mann mit dem Hund", "der Mann, der schläft,"),
which this grammar never samples: grammar v2 (``harder_grammar.py``) renders with them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

# ---------------------------------------------------------------------------------------------
# Lexicon
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noun:
    """A noun with English/German singular and plural, German gender and a semantic kind."""

    en: str
    en_pl: str
    de: str
    de_pl: str
    gender: str  # "m", "f" or "n"
    kind: str  # person, animal, text, food, thing, furniture, place
    weak: bool  # German n-declension: -n in the singular outside the nominative


@dataclass(frozen=True)
class Verb:
    """A verb with its forms, perfect auxiliary, argument frame and selectional restrictions."""

    en: str
    en_3sg: str
    en_pp: str
    de_inf: str
    de_3sg: str
    de_pp: str
    aux: str  # "haben" or "sein"
    frame: str  # acc, dat, ditr (acc + dative recipient), intr, motion, that
    subjects: tuple[str, ...]  # noun kinds allowed as subject
    objects: tuple[str, ...]  # noun kinds allowed as (first) object


_NOUN_TABLE = """
man men Mann Männer m person
woman women Frau Frauen f person
child children Kind Kinder n person
boy boys Junge Jungen m person weak
girl girls Mädchen Mädchen n person
teacher teachers Lehrer Lehrer m person
doctor doctors Arzt Ärzte m person
friend friends Freund Freunde m person
mother mothers Mutter Mütter f person
father fathers Vater Väter m person
dog dogs Hund Hunde m animal
cat cats Katze Katzen f animal
bird birds Vogel Vögel m animal
mouse mice Maus Mäuse f animal
book books Buch Bücher n text
letter letters Brief Briefe m text
newspaper newspapers Zeitung Zeitungen f text
apple apples Apfel Äpfel m food
cake cakes Kuchen Kuchen m food
ball balls Ball Bälle m thing
key keys Schlüssel Schlüssel m thing
bag bags Tasche Taschen f thing
flower flowers Blume Blumen f thing
picture pictures Bild Bilder n thing
car cars Auto Autos n thing
gift gifts Geschenk Geschenke n thing
table tables Tisch Tische m furniture
chair chairs Stuhl Stühle m furniture
bed beds Bett Betten n furniture
garden gardens Garten Gärten m place
park parks Park Parks m place
house houses Haus Häuser n place
school schools Schule Schulen f place
city cities Stadt Städte f place
kitchen kitchens Küche Küchen f place
station stations Bahnhof Bahnhöfe m place
"""

_ALL = "person,animal,text,food,thing,furniture,place"
_VERB_TABLE = f"""
see sees seen sehen sieht gesehen haben acc a {_ALL}
find finds found finden findet gefunden haben acc a person,animal,text,food,thing
buy buys bought kaufen kauft gekauft haben acc p animal,text,food,thing,furniture
read reads read lesen liest gelesen haben acc p text
write writes written schreiben schreibt geschrieben haben acc p text
eat eats eaten essen isst gegessen haben acc a food
visit visits visited besuchen besucht besucht haben acc p person,place
love loves loved lieben liebt geliebt haben acc a person,animal
need needs needed brauchen braucht gebraucht haben acc p text,food,thing,furniture
take takes taken nehmen nimmt genommen haben acc p text,food,thing
help helps helped helfen hilft geholfen haben dat p person,animal
thank thanks thanked danken dankt gedankt haben dat p person
follow follows followed folgen folgt gefolgt sein dat a person,animal
give gives given geben gibt gegeben haben ditr p text,food,thing
show shows shown zeigen zeigt gezeigt haben ditr p animal,text,thing
bring brings brought bringen bringt gebracht haben ditr p text,food,thing
send sends sent schicken schickt geschickt haben ditr p text,thing
sleep sleeps slept schlafen schläft geschlafen haben intr a -
work works worked arbeiten arbeitet gearbeitet haben intr p -
play plays played spielen spielt gespielt haben intr a -
wait waits waited warten wartet gewartet haben intr a -
sing sings sung singen singt gesungen haben intr a -
go goes gone gehen geht gegangen sein motion a -
come comes come kommen kommt gekommen sein motion a -
run runs run laufen läuft gelaufen sein motion a -
drive drives driven fahren fährt gefahren sein motion p -
say says said sagen sagt gesagt haben that p -
think thinks thought denken denkt gedacht haben that p -
know knows known wissen weiß gewusst haben that p -
believe believes believed glauben glaubt geglaubt haben that p -
"""


@dataclass(frozen=True)
class Adjective:
    """An adjective: English form, German stem (endings are added by agreement) and noun kinds it may modify."""

    en: str
    de: str
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class Lexicon:
    """The words a renderer may use, keyed as structures name them (``NP.head``, ``Clause.verb``, ``NP.adj``)."""

    nouns: dict[str, Noun]
    verbs: dict[str, Verb]
    adjectives: dict[str, Adjective]


_SUBJECT_KINDS = {"p": ("person",), "a": ("person", "animal")}


def _parse_nouns(table: str) -> dict[str, Noun]:
    """Parse the noun table into a dict keyed by the English singular."""
    nouns = {}
    for line in table.strip().splitlines():
        en, en_pl, de, de_pl, gender, kind, *flag = line.split()
        nouns[en] = Noun(en, en_pl, de, de_pl, gender, kind, flag == ["weak"])
    return nouns


def _parse_verbs(table: str) -> dict[str, Verb]:
    """Parse the verb table into a dict keyed by the English base form."""
    verbs = {}
    for line in table.strip().splitlines():
        *forms, aux, frame, subj, objs = line.split()
        objects = () if objs == "-" else tuple(objs.split(","))
        verbs[forms[0]] = Verb(*forms, aux, frame, _SUBJECT_KINDS[subj], objects)
    return verbs


NOUNS = _parse_nouns(_NOUN_TABLE)
VERBS = _parse_verbs(_VERB_TABLE)
# English adjective -> (German stem, noun kinds it may modify)
_ANIMATE = ("person", "animal")
_INANIMATE = ("text", "food", "thing", "furniture", "place")
ADJECTIVES = {
    "big": ("groß", _ANIMATE + _INANIMATE),
    "small": ("klein", _ANIMATE + _INANIMATE),
    "old": ("alt", _ANIMATE + _INANIMATE),
    "new": ("neu", _INANIMATE),
    "tired": ("müd", _ANIMATE),
    "beautiful": ("schön", _ANIMATE + _INANIMATE),
    "red": ("rot", _INANIMATE),
    "black": ("schwarz", ("animal",) + _INANIMATE),
    "green": ("grün", _INANIMATE),
}
NUMBERS = {
    "two": "zwei",
    "three": "drei",
    "four": "vier",
    "five": "fünf",
    "six": "sechs",
    "seven": "sieben",
    "eight": "acht",
    "nine": "neun",
    "ten": "zehn",
    "eleven": "elf",
    "twelve": "zwölf",
}
# English pronoun -> (German pronoun, agreement: 3sg or pl)
PRONOUNS = {"he": ("er", "3sg"), "she": ("sie", "3sg"), "we": ("wir", "pl"), "they": ("sie", "pl")}
# English preposition -> (German preposition, case, noun kinds, role)
PREPOSITIONS = {
    "with": ("mit", "dat", ("person", "animal", "thing"), "loc"),
    "in": ("in", "dat", ("place",), "loc"),
    "on": ("auf", "dat", ("furniture",), "loc"),
    "under": ("unter", "dat", ("furniture",), "loc"),
    "behind": ("hinter", "dat", ("furniture", "place"), "loc"),
    "next to": ("neben", "dat", ("furniture", "place"), "loc"),
    "to": ("zu", "dat", ("person", "place"), "goal"),
    "into": ("in", "acc", ("place",), "goal"),
}
CONTRACTIONS = {
    ("zu", "m"): "zum",
    ("zu", "n"): "zum",
    ("zu", "f"): "zur",
    ("in", "m"): "im",
    ("in", "n"): "im",
}  # preposition + dative "dem"/"der"
ADVERBIALS = {
    "today": "heute",
    "now": "jetzt",
    "often": "oft",
    "sometimes": "manchmal",
    "tomorrow": "morgen",
    "every day": "jeden Tag",
    "in the morning": "am Morgen",
    "in the evening": "am Abend",
}
PRESENT_ONLY_ADVERBIALS = ("tomorrow", "every day")
CONJUNCTIONS = {"because": "weil", "although": "obwohl", "while": "während", "when": "wenn", "before": "bevor"}
AUX = {"haben": {"3sg": "hat", "pl": "haben"}, "sein": {"3sg": "ist", "pl": "sind"}}
LEXICON = Lexicon(NOUNS, VERBS, {en: Adjective(en, de, kinds) for en, (de, kinds) in ADJECTIVES.items()})

# German endings indexed [case][m, f, n, plural]
_GENDER_INDEX = {"m": 0, "f": 1, "n": 2, "p": 3}
_ARTICLE = {
    "nom": ("der", "die", "das", "die"),
    "acc": ("den", "die", "das", "die"),
    "dat": ("dem", "der", "dem", "den"),
}
_STRONG = {
    "nom": ("er", "e", "es", "e"),
    "acc": ("en", "e", "es", "e"),
    "dat": ("em", "er", "em", "en"),
}  # dieser; adjectives without article ending
_EIN = {"nom": ("", "e", "", "e"), "acc": ("en", "e", "", "e"), "dat": ("em", "er", "em", "en")}
_WEAK = {"nom": ("e", "e", "e", "en"), "acc": ("en", "e", "e", "en"), "dat": ("en",) * 4}
# English determiner -> (English plural form or None if singular only, German stem, paradigm)
DETERMINERS = {
    "the": ("the", "", "article"),
    "this": ("these", "dies", "der"),
    "a": (None, "ein", "ein"),
    "my": ("my", "mein", "ein"),
    "no": ("no", "kein", "ein"),
}

# ---------------------------------------------------------------------------------------------
# Structures
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NP:
    """Noun phrase: ``head`` is a noun key (the English singular in v1) or a subject pronoun.

    ``det`` is a key of DETERMINERS, a number word (plural) or "" (bare plural).  ``pp`` and
    ``rel`` modify the noun in place ("the man with the dog", "the man who sleeps"; German
    "der Mann, der schläft,"); v1's sampler sets neither (harder_grammar's does).
    """

    head: str
    det: str = "the"
    plural: bool = False
    adj: str | None = None
    pp: PP | None = None
    rel: Clause | None = None  # "who ..." clause about the noun, kept next to it in German too

    @property
    def is_plural(self) -> bool:
        """Whether the phrase is plural (number words and bare nouns always are)."""
        return self.plural or self.det in NUMBERS or self.det == ""

    def agreement(self) -> str:
        """Verb agreement class: 3sg or pl."""
        if self.head in PRONOUNS:
            return PRONOUNS[self.head][1]
        return "pl" if self.is_plural else "3sg"


@dataclass(frozen=True)
class PP:
    """Prepositional phrase; ``prep`` is a key of PREPOSITIONS."""

    prep: str
    np: NP


@dataclass(frozen=True)
class Clause:
    """A clause; ``subject`` is None in a relative clause (the relative pronoun is subject)."""

    subject: NP | None
    verb: str
    obj: NP | None = None
    recipient: NP | None = None
    pp: PP | None = None
    perfect: bool = False
    rel: Clause | None = None  # subject relative clause modifying ``obj``
    comp: Clause | None = None  # "that"-clause of verbs of saying and thinking


@dataclass(frozen=True)
class Sentence:
    """A full sentence: main clause plus optional fronted adverbial or subordinate clause."""

    main: Clause
    adverb: str | None = None
    conj: str | None = None
    sub: Clause | None = None
    sub_first: bool = False
    question: bool = False


# ---------------------------------------------------------------------------------------------
# English rendering
# ---------------------------------------------------------------------------------------------


def _en_np(np: NP, lex: Lexicon = LEXICON) -> list[str]:
    """English words of a noun phrase."""
    if np.head in PRONOUNS:
        return [np.head]
    noun = lex.nouns[np.head]
    words = ([lex.adjectives[np.adj].en] if np.adj else []) + [noun.en_pl if np.is_plural else noun.en]
    if np.det in NUMBERS:
        words = [np.det] + words
    elif np.det != "":
        det = DETERMINERS[np.det][0] if np.is_plural else np.det
        if det == "a" and words[0][0] in "aeiou":
            det = "an"
        words = [det] + words
    if np.pp:
        words += np.pp.prep.split() + _en_np(np.pp.np, lex)
    if np.rel:
        words += _en_clause(np.rel, antecedent=np, lex=lex)
    return words


def _en_clause(c: Clause, question: bool = False, antecedent: NP | None = None, lex: Lexicon = LEXICON) -> list[str]:
    """English words of a clause (declarative or yes/no question order)."""
    verb = lex.verbs[c.verb]
    agr = (antecedent or c.subject).agreement()
    if c.subject is None:
        subject = ["who" if lex.nouns[antecedent.head].kind == "person" else "that"]
    else:
        subject = _en_np(c.subject, lex)
    if question:
        aux = ("has", "have") if c.perfect else ("does", "do")
        aux = aux[0] if agr == "3sg" else aux[1]
        words = [aux] + subject + [verb.en_pp if c.perfect else verb.en]
    elif c.perfect:
        words = subject + ["has" if agr == "3sg" else "have", verb.en_pp]
    else:
        words = subject + [verb.en_3sg if agr == "3sg" else verb.en]
    if c.obj:
        words += _en_np(c.obj, lex)
    if c.recipient:
        words += ["to"] + _en_np(c.recipient, lex)
    if c.pp:
        words += c.pp.prep.split() + _en_np(c.pp.np, lex)
    if c.rel:
        words += _en_clause(c.rel, antecedent=c.obj, lex=lex)
    if c.comp:
        words += ["that"] + _en_clause(c.comp, lex=lex)
    return words


def render_english(s: Sentence, lex: Lexicon = LEXICON) -> str:
    """Render a sentence structure as English text."""
    if s.sub is not None and s.sub_first:
        words = [s.conj] + _en_clause(s.sub, lex=lex) + [","] + _en_clause(s.main, lex=lex)
    else:
        words = (s.adverb.split() if s.adverb else []) + _en_clause(s.main, s.question, lex=lex)
        if s.sub is not None:
            words += [s.conj] + _en_clause(s.sub, lex=lex)
    return _finish(words, "?" if s.question else ".")


# ---------------------------------------------------------------------------------------------
# German rendering
# ---------------------------------------------------------------------------------------------


def _de_np(np: NP, case: str, lex: Lexicon = LEXICON) -> list[str]:
    """German words of a noun phrase in the given case (nom, acc or dat)."""
    if np.head in PRONOUNS:
        return [PRONOUNS[np.head][0]]
    noun = lex.nouns[np.head]
    g = _GENDER_INDEX["p" if np.is_plural else noun.gender]
    if np.det == "the":
        det, adj_endings = _ARTICLE[case][g], _WEAK
    elif np.det in DETERMINERS:
        _, stem, paradigm = DETERMINERS[np.det]
        ending = (_STRONG if paradigm == "der" else _EIN)[case][g]
        det, adj_endings = stem + ending, (_WEAK if ending else _STRONG)
    else:  # number word or bare plural: strong adjective endings
        det, adj_endings = NUMBERS.get(np.det, ""), _STRONG
    if np.is_plural:
        form = noun.de_pl
        if case == "dat" and not form.endswith(("n", "s")):
            form += "n"
    else:
        form = noun.de + ("n" if noun.weak and case != "nom" else "")
    words = [det] if det else []
    if np.adj:
        words.append(lex.adjectives[np.adj].de + adj_endings[case][g])
    words.append(form)
    if np.pp:
        words += _de_pp(np.pp, lex)
    if np.rel:  # "der Mann, der schläft, ...": a comma on each side (_finish drops one before "," or the end)
        words += [","] + _de_clause(np.rel, "rel", antecedent=np, lex=lex) + [","]
    return words


def _de_pp(pp: PP, lex: Lexicon = LEXICON) -> list[str]:
    """German words of a prepositional phrase, with article contraction (im, ins, zum, zur)."""
    prep, case = PREPOSITIONS[pp.prep][:2]
    words = _de_np(pp.np, case, lex)
    gender = lex.nouns[pp.np.head].gender
    if pp.np.det == "the" and not pp.np.is_plural:
        if case == "dat" and (prep, gender) in CONTRACTIONS:
            return [CONTRACTIONS[prep, gender]] + words[1:]
        if case == "acc" and prep == "in" and gender == "n":
            return ["ins"] + words[1:]
    return [prep] + words


def _de_clause(
    c: Clause,
    order: str,
    front: list[str] | None = None,
    antecedent: NP | None = None,
    conj: str = "",
    lex: Lexicon = LEXICON,
) -> list[str]:
    """German words of a clause; order is main (V2), question (V1), sub or rel (verb-final)."""
    verb = lex.verbs[c.verb]
    agr = (antecedent or c.subject).agreement()
    if c.subject is None:
        gender = "p" if antecedent.is_plural else lex.nouns[antecedent.head].gender
        subject = [_ARTICLE["nom"][_GENDER_INDEX[gender]]]
    else:
        subject = _de_np(c.subject, "nom", lex)
    forms = {"3sg": verb.de_3sg, "pl": verb.de_inf}
    finite = AUX[verb.aux][agr] if c.perfect else forms[agr]
    middle = []
    if c.recipient:
        middle += _de_np(c.recipient, "dat", lex)
    if c.obj:
        middle += _de_np(c.obj, "dat" if verb.frame == "dat" else "acc", lex)
    if c.pp:
        middle += _de_pp(c.pp, lex)
    if c.perfect:
        middle.append(verb.de_pp)
    tail = []
    if c.rel:
        tail += [","] + _de_clause(c.rel, "rel", antecedent=c.obj, lex=lex)
    if c.comp:
        tail += [","] + _de_clause(c.comp, "sub", conj="dass", lex=lex)
    if order == "question":
        return [finite] + subject + middle + tail
    if order == "main":
        head = front + [finite] + subject if front else subject + [finite]
        return head + middle + tail
    return ([conj] if conj else []) + subject + middle + [finite] + tail


def render_german(s: Sentence, lex: Lexicon = LEXICON) -> str:
    """Render a sentence structure as German text."""
    if s.sub is not None and s.sub_first:
        front = _de_clause(s.sub, "sub", conj=CONJUNCTIONS[s.conj], lex=lex) + [","]
        words = _de_clause(s.main, "main", front=front, lex=lex)
    else:
        front = ADVERBIALS[s.adverb].split() if s.adverb else None
        words = _de_clause(s.main, "question" if s.question else "main", front=front, lex=lex)
        if s.sub is not None:
            words += [","] + _de_clause(s.sub, "sub", conj=CONJUNCTIONS[s.conj], lex=lex)
    return _finish(words, "?" if s.question else ".")


def _finish(words: list[str], end: str) -> str:
    """Join words, attach commas, capitalise the first letter and add end punctuation.

    A comma before another comma or the end is dropped: the one closing an in-place relative
    clause ("Heute schläft der Mann, der liest.").
    """
    words = [w for i, w in enumerate(words) if w != "," or words[i + 1 : i + 2] not in ([","], [])]
    text = " ".join(words).replace(" ,", ",") + end
    return text[0].upper() + text[1:]


def render(s: Sentence, lex: Lexicon = LEXICON) -> tuple[str, str]:
    """Render a sentence structure as an (english, german) pair."""
    return render_english(s, lex), render_german(s, lex)


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------

_NOUNS_BY_KIND: dict[str, list[str]] = {}
for _noun in NOUNS.values():
    _NOUNS_BY_KIND.setdefault(_noun.kind, []).append(_noun.en)
_NUMBER_WORDS = list(NUMBERS)
_DET_WEIGHTS = {"the": 40, "a": 15, "this": 7, "my": 8, "no": 4, "<number>": 14, "": 12}
_PP_DET_WEIGHTS = {"the": 62, "a": 20, "this": 6, "my": 8, "<number>": 4}
_FRAME_WEIGHTS = {"acc": 40, "dat": 10, "ditr": 14, "intr": 12, "motion": 12, "that": 12}
_VERBS_BY_FRAME: dict[str, list[str]] = {}
for _verb in VERBS.values():
    _VERBS_BY_FRAME.setdefault(_verb.frame, []).append(_verb.en)
P_PRONOUN, P_ADJ, P_PLURAL, P_PERFECT = 0.2, 0.3, 0.3, 0.45
P_QUESTION, P_ADVERB, P_SUB, P_SUB_FIRST, P_REL, P_PP = 0.12, 0.35, 0.35, 0.4, 0.25, 0.3


def _weighted(rng: random.Random, weights: dict[str, int]) -> str:
    """Pick a key of ``weights`` with probability proportional to its value."""
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _sample_np(
    rng: random.Random, kinds: tuple[str, ...], pronoun: bool = False, dets: dict[str, int] = _DET_WEIGHTS
) -> NP:
    """Sample a noun phrase whose noun has one of ``kinds``."""
    if pronoun and rng.random() < P_PRONOUN:
        return NP(rng.choice(list(PRONOUNS)))
    kind = rng.choice(kinds)
    noun = rng.choice(_NOUNS_BY_KIND[kind])
    det = _weighted(rng, dets)
    if det == "<number>":
        det = rng.choice(_NUMBER_WORDS)
    plural = det in NUMBERS or det == "" or (DETERMINERS[det][0] is not None and rng.random() < P_PLURAL)
    adj = None
    if rng.random() < P_ADJ:
        adj = rng.choice([a for a, (_, allowed) in ADJECTIVES.items() if kind in allowed])
    return NP(noun, det, plural, adj)


def _sample_pp(rng: random.Random, role: str) -> PP:
    """Sample a prepositional phrase with role "loc" (place/company) or "goal" (direction)."""
    prep = rng.choice([p for p, spec in PREPOSITIONS.items() if spec[3] == role])
    return PP(prep, _sample_np(rng, PREPOSITIONS[prep][2], dets=_PP_DET_WEIGHTS))


def _sample_clause(rng: random.Random, kind: str, antecedent: NP | None = None) -> Clause:
    """Sample a clause; kind is main, sub (adverbial or that-clause) or rel."""
    frames = dict(_FRAME_WEIGHTS)
    if kind != "main":
        del frames["that"]
    candidates: list[str] = []
    while not candidates:
        frame = _weighted(rng, frames)
        candidates = _VERBS_BY_FRAME[frame]
        if antecedent is not None:
            ante_kind = NOUNS[antecedent.head].kind
            candidates = [v for v in candidates if ante_kind in VERBS[v].subjects]
    verb = VERBS[rng.choice(candidates)]
    subject = None if kind == "rel" else _sample_np(rng, verb.subjects, pronoun=True)
    obj = recipient = pp = rel = comp = None
    if verb.frame in ("acc", "dat", "ditr"):
        obj = _sample_np(rng, verb.objects)
    if verb.frame == "ditr":
        recipient = _sample_np(rng, ("person",))
    if verb.frame == "motion":
        pp = _sample_pp(rng, "goal")
    elif verb.frame != "that" and rng.random() < (2 * P_PP if verb.frame == "intr" else P_PP):
        pp = _sample_pp(rng, "loc")
        while obj is not None and pp.np.head == obj.head:  # no "the chair on the chair"
            pp = _sample_pp(rng, "loc")
    if (
        kind != "rel"
        and verb.frame in ("acc", "dat")
        and pp is None
        and NOUNS[obj.head].kind in ("person", "animal")
        and rng.random() < P_REL
    ):
        rel = _sample_clause(rng, "rel", antecedent=obj)
    if verb.frame == "that":
        comp = _sample_clause(rng, "sub")
    return Clause(subject, verb.en, obj, recipient, pp, rng.random() < P_PERFECT, rel, comp)


def sample_sentence(rng: random.Random) -> Sentence:
    """Sample one sentence structure."""
    main = _sample_clause(rng, "main")
    question = rng.random() < P_QUESTION
    if question:  # yes/no questions are asked in the perfect: "Has ... seen ...?"
        main = replace(main, perfect=True)
    adverb = conj = sub = None
    sub_first = False
    if not question and rng.random() < P_ADVERB:
        allowed = [a for a in ADVERBIALS if not (main.perfect and a in PRESENT_ONLY_ADVERBIALS)]
        adverb = rng.choice(allowed)
    if main.comp is None and rng.random() < (P_SUB / 2 if question else P_SUB):
        conj = rng.choice(list(CONJUNCTIONS))
        sub = _sample_clause(rng, "sub")
        sub_first = adverb is None and not question and rng.random() < P_SUB_FIRST
    return Sentence(main, adverb, conj, sub, sub_first, question)


def sample_pair(rng: random.Random) -> tuple[str, str]:
    """One (english, german) pair, sampled and rendered."""
    return render(sample_sentence(rng))


PairSampler = Callable[[random.Random], tuple[str, str]]


def generate_pairs(num_pairs: int, seed: int, sample: PairSampler = sample_pair) -> list[tuple[str, str]]:
    """Deterministic list of unique (english, german) sentence pairs: neither side repeats."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    seen_en: set[str] = set()
    seen_de: set[str] = set()
    for _ in range(20 * num_pairs + 1000):
        if len(pairs) == num_pairs:
            break
        en, de = sample(rng)
        if en not in seen_en and de not in seen_de:
            seen_en.add(en)
            seen_de.add(de)
            pairs.append((en, de))
    if len(pairs) < num_pairs:
        raise ValueError(f"could only generate {len(pairs)} unique pairs")
    return pairs


def make_splits(
    num_train: int, num_validation: int, num_test: int, seed: int, sample: PairSampler = sample_pair
) -> dict[str, list[tuple[str, str]]]:
    """Disjoint train/validation/test splits (no shared English or German sentence).

    Held-out pairs are the first ones generated, so for a given seed the validation and
    test sets do not depend on ``num_train``.
    """
    pairs = generate_pairs(num_train + num_validation + num_test, seed, sample)
    held_out = pairs[: num_validation + num_test]
    return {
        "train": pairs[num_validation + num_test :],
        "validation": held_out[:num_validation],
        "test": held_out[num_validation:],
    }
