"""Grammar v2: a harder synthetic English->German corpus on v1's renderers (dataset "embedded2").

Three changes to v1 (`grammar.py`), each so that model capacity and regularisation matter:

- **A long-tailed lexicon.** v1's words plus 1,300 generated pseudo-words (`pseudowords.py`) whose
  German forms, genders, plural classes, weak declension and verb classes must be memorised;
  nouns, verbs and adjectives are drawn with Zipf frequencies (rank ** -ZIPF_S, v1's words
  ranked first), so rare words are seen a few times only.
- **German choices the English does not show.** A lemma's second German sense (Junge/Knabe), an
  adverbial's synonym (oft/häufig), "weil"/"da" (verb-final) or "denn" (verb-second) for
  "because", obwohl/obgleich, bevor/ehe; in a German main clause the adverbial, the PP or the
  subject comes first (verb second either way: "Heute sieht er den Hund." / "Er sieht heute den
  Hund."); an object's relative clause stays beside its noun or follows the participle.  The
  English, for its part, puts an adverbial first or last.  So the German is not a function of
  the English: the best model's perplexity stays above 1.  The German-only choices come from a
  random stream of their own, so a structure keeps its English whatever German is drawn.
- **Longer dependencies.** Subjects take relative clauses ("Der Mann, der den Hund sieht,
  schläft."), relative clauses nest once more, and nouns take PPs that take a PP once more
  ("the book on the table in the kitchen"), so agreement and verb placement reach further.

Sentence pairs are unique and split held-out first, as in v1 (`grammar.make_splits`).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from fxformer.data import grammar as g
from fxformer.data import pseudowords
from fxformer.data.grammar import NP, PP, Clause, Sentence

LEXICON = pseudowords.build()
ZIPF_S = 1.0
MAX_DEPTH = 2  # embedding levels: a clause or PP inside the main clause is at depth 1, inside that at 2
P_NP_PP, P_SUBJECT_REL, P_REL_IN_PLACE = 0.12, 0.1, 0.5
P_ADVERB_LAST, P_FRONT_ADVERB, P_FRONT_PP = 0.4, 0.6, 0.35
DE_ADVERBIALS = {
    "today": ("heute",),
    "now": ("jetzt", "nun"),
    "often": ("oft", "häufig"),
    "sometimes": ("manchmal",),
    "tomorrow": ("morgen",),
    "every day": ("jeden Tag", "täglich"),
    "in the morning": ("am Morgen", "morgens"),
    "in the evening": ("am Abend", "abends"),
}
DE_CONJUNCTIONS = {
    "because": ("weil", "da", "denn"),
    "although": ("obwohl", "obgleich"),
    "while": ("während",),
    "when": ("wenn",),
    "before": ("bevor", "ehe"),
}
MAIN_ORDER_CONJUNCTIONS = ("denn",)  # coordinating: verb-second clause, never first in the sentence


@dataclass(frozen=True)
class Sentence2(Sentence):
    """A v1 sentence plus the choices one language makes and the other does not show."""

    adverb_last: bool = False  # English: "He sleeps today." rather than "Today he sleeps."
    de_adverb: str = ""  # the German for ``adverb`` ("oft" or "häufig")
    de_front: str = ""  # what precedes the German finite verb: "adverb", "pp" (main.pp) or "" (the subject)
    de_conj: str = ""  # the German for ``conj`` ("weil", "da" or "denn")


# ---------------------------------------------------------------------------------------------
# Rendering (v1's clause and phrase renderers with v2's lexicon)
# ---------------------------------------------------------------------------------------------


def render_english(s: Sentence2, lex: g.Lexicon = LEXICON) -> str:
    """Render a sentence structure as English text."""
    if not (s.adverb and s.adverb_last):
        return g.render_english(s, lex)
    words = g._en_clause(s.main, lex=lex) + s.adverb.split()
    if s.sub is not None:
        words += [s.conj] + g._en_clause(s.sub, lex=lex)
    return g._finish(words, ".")


def render_german(s: Sentence2, lex: g.Lexicon = LEXICON) -> str:
    """Render a sentence structure as German text (verb second in every main-clause variant)."""
    main, front = s.main, None
    if s.sub is not None and s.sub_first:
        front = g._de_clause(s.sub, "sub", conj=s.de_conj, lex=lex) + [","]
    elif s.de_front == "adverb":
        front = s.de_adverb.split()
    elif s.de_front == "pp":
        front, main = g._de_pp(main.pp, lex), replace(main, pp=None)
    words = g._de_clause(main, "question" if s.question else "main", front=front, lex=lex)
    if s.adverb and s.de_front != "adverb":  # the middle field starts after the finite verb and the subject
        at = len(front or []) + 1 + len(g._de_np(main.subject, "nom", lex))
        words[at:at] = s.de_adverb.split()
    if s.sub is not None and not s.sub_first:
        if s.de_conj in MAIN_ORDER_CONJUNCTIONS:
            words += [",", s.de_conj] + g._de_clause(s.sub, "main", lex=lex)
        else:
            words += [","] + g._de_clause(s.sub, "sub", conj=s.de_conj, lex=lex)
    return g._finish(words, "?" if s.question else ".")


def render(s: Sentence2, lex: g.Lexicon = LEXICON) -> tuple[str, str]:
    """Render a sentence structure as an (english, german) pair."""
    return render_english(s, lex), render_german(s, lex)


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------

ZipfTable = tuple[list[tuple[str, ...]], list[float]]


def _zipf_table(lemmas: tuple[tuple[str, ...], ...], allowed: Callable[[str], bool]) -> ZipfTable:
    """The lemmas whose first sense is ``allowed``, with cumulative weights rank ** -ZIPF_S (rank among all)."""
    chosen, cumulative, total = [], [], 0.0
    for rank, senses in enumerate(lemmas, 1):
        if allowed(senses[0]):
            total += rank**-ZIPF_S
            chosen.append(senses)
            cumulative.append(total)
    return chosen, cumulative


@functools.cache
def _nouns_of(kinds: tuple[str, ...]) -> ZipfTable:
    return _zipf_table(LEXICON.noun_lemmas, lambda key: LEXICON.nouns[key].kind in kinds)


@functools.cache
def _verbs_of(frame: str, subject_kind: str | None) -> ZipfTable:
    allowed = lambda key: LEXICON.verbs[key].frame == frame and subject_kind in (None, *LEXICON.verbs[key].subjects)
    return _zipf_table(LEXICON.verb_lemmas, allowed)


@functools.cache
def _adjectives_of(kind: str) -> ZipfTable:
    return _zipf_table(LEXICON.adjective_lemmas, lambda key: kind in LEXICON.adjectives[key].kinds)


def _draw(rng: random.Random, de: random.Random, table: ZipfTable) -> str:
    """A lemma by its Zipf weight (from ``rng``), then one of its senses (from ``de``): an entry's key."""
    lemmas, cumulative = table
    senses = rng.choices(lemmas, cum_weights=cumulative)[0]
    return senses[0] if len(senses) == 1 else de.choice(senses)


def _english(key: str) -> str:
    return LEXICON.nouns[key].en


def _sample_np(
    rng: random.Random,
    de: random.Random,
    kinds: tuple[str, ...],
    depth: int,
    pronoun: bool = False,
    dets: dict[str, int] = g._DET_WEIGHTS,
) -> NP:
    """A noun phrase whose noun has one of ``kinds``, perhaps with a PP ("the cat with the ball")."""
    if pronoun and rng.random() < g.P_PRONOUN:
        return NP(rng.choice(list(g.PRONOUNS)))
    head = _draw(rng, de, _nouns_of(kinds))
    det = g._weighted(rng, dets)
    if det == "<number>":
        det = rng.choice(g._NUMBER_WORDS)
    plural = det in g.NUMBERS or det == "" or (g.DETERMINERS[det][0] is not None and rng.random() < g.P_PLURAL)
    adj = _draw(rng, de, _adjectives_of(LEXICON.nouns[head].kind)) if rng.random() < g.P_ADJ else None
    pp = None
    if depth < MAX_DEPTH and rng.random() < P_NP_PP:
        pp = _sample_pp(rng, de, "loc", depth + 1)
        while _english(pp.np.head) == _english(head):  # no "the chair on the chair"
            pp = _sample_pp(rng, de, "loc", depth + 1)
    return NP(head, det, plural, adj, pp)


def _sample_pp(rng: random.Random, de: random.Random, role: str, depth: int) -> PP:
    """A prepositional phrase with role "loc" (place or company) or "goal" (direction)."""
    prep = rng.choice([p for p, spec in g.PREPOSITIONS.items() if spec[3] == role])
    return PP(prep, _sample_np(rng, de, g.PREPOSITIONS[prep][2], depth, dets=g._PP_DET_WEIGHTS))


def _sample_clause(
    rng: random.Random, de: random.Random, kind: str, depth: int, antecedent: NP | None = None
) -> Clause:
    """A clause at embedding ``depth``; kind is main, sub (adverbial or that-clause) or rel."""
    frames = dict(g._FRAME_WEIGHTS)
    if kind != "main":
        del frames["that"]
    ante_kind = LEXICON.nouns[antecedent.head].kind if antecedent is not None else None
    table: ZipfTable = ([], [])
    while not table[0]:
        table = _verbs_of(g._weighted(rng, frames), ante_kind)
    verb = LEXICON.verbs[_draw(rng, de, table)]
    subject = None if kind == "rel" else _sample_np(rng, de, verb.subjects, depth, pronoun=True)
    nested = depth < MAX_DEPTH
    if subject and subject.head not in g.PRONOUNS and not subject.pp and nested and rng.random() < P_SUBJECT_REL:
        subject = replace(subject, rel=_sample_clause(rng, de, "rel", depth + 1, antecedent=subject))
    obj = recipient = pp = rel = comp = None
    if verb.frame in ("acc", "dat", "ditr"):
        obj = _sample_np(rng, de, verb.objects, depth)
    if verb.frame == "ditr":
        recipient = _sample_np(rng, de, ("person",), depth)
    if verb.frame == "motion":
        pp = _sample_pp(rng, de, "goal", depth)
    elif verb.frame != "that" and rng.random() < (2 * g.P_PP if verb.frame == "intr" else g.P_PP):
        pp = _sample_pp(rng, de, "loc", depth)
        while obj is not None and _english(pp.np.head) == _english(obj.head):
            pp = _sample_pp(rng, de, "loc", depth)
    animate = obj is not None and LEXICON.nouns[obj.head].kind in ("person", "animal")
    if verb.frame in ("acc", "dat") and animate and pp is None and not obj.pp and nested and rng.random() < g.P_REL:
        rel = _sample_clause(rng, de, "rel", depth + 1, antecedent=obj)
        if de.random() < P_REL_IN_PLACE:  # German: "hat den Mann, der schläft, gesehen"
            obj, rel = replace(obj, rel=rel), None
    if verb.frame == "that":
        comp = _sample_clause(rng, de, "sub", depth + 1)
    return Clause(subject, verb.en, obj, recipient, pp, rng.random() < g.P_PERFECT, rel, comp)


def sample_sentence(rng: random.Random, de: random.Random) -> Sentence2:
    """One sentence structure; ``de`` makes the German-only choices, so it never changes the English."""
    main = _sample_clause(rng, de, "main", 0)
    question = rng.random() < g.P_QUESTION
    if question:  # yes/no questions are asked in the perfect: "Has ... seen ...?"
        main = replace(main, perfect=True)
    adverb = conj = sub = None
    sub_first = False
    if not question and rng.random() < g.P_ADVERB:
        adverb = rng.choice([a for a in g.ADVERBIALS if not (main.perfect and a in g.PRESENT_ONLY_ADVERBIALS)])
    if main.comp is None and rng.random() < (g.P_SUB / 2 if question else g.P_SUB):
        conj = rng.choice(list(g.CONJUNCTIONS))
        sub = _sample_clause(rng, de, "sub", 1)
        sub_first = adverb is None and not question and rng.random() < g.P_SUB_FIRST
    de_conj = ""
    if conj is not None:
        de_conj = de.choice([c for c in DE_CONJUNCTIONS[conj] if not (sub_first and c in MAIN_ORDER_CONJUNCTIONS)])
    adverb_last = adverb is not None and rng.random() < P_ADVERB_LAST
    de_adverb = de.choice(DE_ADVERBIALS[adverb]) if adverb else ""
    de_front = ""
    if adverb is not None and de.random() < P_FRONT_ADVERB:
        de_front = "adverb"
    elif not (question or sub_first) and main.pp and g.PREPOSITIONS[main.pp.prep][3] == "loc":
        de_front = "pp" if de.random() < P_FRONT_PP else ""
    return Sentence2(main, adverb, conj, sub, sub_first, question, adverb_last, de_adverb, de_front, de_conj)


def sample_pair(rng: random.Random) -> tuple[str, str]:
    """One (english, german) pair, sampled and rendered; the German choices' stream is seeded from ``rng``."""
    de = random.Random(rng.getrandbits(64))
    return render(sample_sentence(rng, de))


def generate_pairs(num_pairs: int, seed: int) -> list[tuple[str, str]]:
    """Deterministic list of unique (english, german) sentence pairs."""
    return g.generate_pairs(num_pairs, seed, sample_pair)


def make_splits(num_train: int, num_validation: int, num_test: int, seed: int) -> dict[str, list[tuple[str, str]]]:
    """Disjoint train/validation/test splits; held-out pairs first, so they do not depend on ``num_train``."""
    return g.make_splits(num_train, num_validation, num_test, seed, sample_pair)
