"""Tests for grammar v2 (dataset "embedded2"): its lexicon, its German choices, its corpus and builder."""

import random
import re
from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np
from conftest import small_config

from fxformer.data import corpora, grammar, harder_grammar, pseudowords
from fxformer.data.grammar import NP, PP, Clause
from fxformer.data.harder_grammar import LEXICON, Sentence2, generate_pairs, make_splits, render


def _generated(entries: dict, v1: dict) -> dict:
    """The generated first senses of a part of speech."""
    return {key: e for key, e in entries.items() if key not in v1 and "#" not in key}


NOUNS = _generated(LEXICON.nouns, grammar.NOUNS)
VERBS = _generated(LEXICON.verbs, grammar.VERBS)
ADJECTIVES = _generated(LEXICON.adjectives, grammar.ADJECTIVES)


def _first(entries: dict, **fields) -> str:
    """The key of the first entry whose fields have the given values."""
    return next(key for key, e in entries.items() if all(getattr(e, f) == v for f, v in fields.items()))


def test_lexicon_sizes_deterministic_and_every_form_its_own():
    assert (len(NOUNS), len(VERBS), len(ADJECTIVES)) == (800, 300, 200)
    assert pseudowords.build() == LEXICON and pseudowords.build(seed=3) != LEXICON
    # Independently: each lemma's forms in both languages (its senses together), lowercased.
    v1, generated = set(), []
    for lemmas, entries, v1_entries in [
        (LEXICON.noun_lemmas, LEXICON.nouns, grammar.NOUNS),
        (LEXICON.verb_lemmas, LEXICON.verbs, grammar.VERBS),
        (LEXICON.adjective_lemmas, LEXICON.adjectives, grammar.ADJECTIVES),
    ]:
        for senses in lemmas:
            forms = set()
            for e in map(entries.get, senses):
                if entries is LEXICON.nouns:
                    forms |= {e.en, e.en_pl, e.de, e.de_pl}
                elif entries is LEXICON.verbs:
                    forms |= {e.en, e.en_3sg, e.en_pp, e.de_inf, e.de_3sg, e.de_pp}
                else:
                    forms |= {e.en} | {e.de + ending for ending in ("", "e", "en", "er", "es", "em")}
            forms = {f.lower() for f in forms}
            if senses[0] in v1_entries:
                v1 |= forms
            else:
                generated.append(forms)
    assert len(generated) == 1300
    counts = Counter(f for forms in generated for f in forms)
    assert max(counts.values()) == 1  # no two generated lemmas share a form, in either language
    assert not v1 & set(counts)  # nor with a v1 word
    assert sum(len(senses) == 2 for senses in LEXICON.noun_lemmas) > 80  # about 15% have a German synonym


def test_generated_words_are_german_and_english_like():
    weak = [n for n in NOUNS.values() if n.weak]
    assert len(weak) > 20 and all(n.gender == "m" and n.kind in ("person", "animal") for n in weak)
    assert all(n.de.endswith("e") and n.de_pl == n.de + "n" for n in weak)  # "den Jungen", "die Jungen"
    assert Counter(n.gender for n in NOUNS.values()).keys() == {"m", "f", "n"}
    assert all(n.de[0].isupper() and n.en.islower() and n.de.lower() != n.en for n in NOUNS.values())
    assert all(v.de_inf.endswith("en") for v in VERBS.values())
    assert {v.aux for v in VERBS.values() if v.frame == "motion"} == {"sein"}
    prefixed = [v for v in VERBS.values() if v.de_pp.startswith(pseudowords._VERB_PREFIXES)]
    strong = [v for v in VERBS.values() if v.de_pp.startswith("ge") and v.de_pp.endswith("en")]
    assert len(prefixed) > 30 and len(strong) > 10  # participles to memorise: besucht, gesungen
    assert all(re.fullmatch(r"[a-z]+", a.en) and re.fullmatch(r"[a-zäöüß]+", a.de) for a in ADJECTIVES.values())


def test_word_frequencies_are_zipfian():
    pairs = make_splits(5000, 200, 200, seed=0)["train"]
    english = Counter(w for en, _ in pairs for w in re.findall(r"\w+", en.lower()))
    for lemmas, entries, forms in [
        (LEXICON.noun_lemmas, LEXICON.nouns, lambda n: (n.en, n.en_pl)),
        (LEXICON.verb_lemmas, LEXICON.verbs, lambda v: (v.en, v.en_3sg, v.en_pp)),
    ]:
        per_lemma = [sum(english[f] for f in set(forms(entries[senses[0]]))) for senses in lemmas]
        frequencies = np.array(sorted(per_lemma, reverse=True)[4:150], float)  # ranks 5 to 150
        slope = np.polyfit(np.log(np.arange(5, 151)), np.log(frequencies), 1)[0]
        assert abs(slope + harder_grammar.ZIPF_S) < 0.25, slope
        assert sum(c > 0 for c in per_lemma) > 0.9 * len(lemmas)  # the tail is seen, rarely


def test_german_is_not_a_function_of_the_english():
    # The same structures with their German choices drawn four times: count English sentences
    # that occur more than once with different German.
    translations = defaultdict(set)
    for i in range(300):
        for j in range(4):
            en, de = render(harder_grammar.sample_sentence(random.Random(i), random.Random(1000 + j)))
            translations[en].add(de)
    assert len(translations) == 300  # the German choices never change the English
    varied = sum(len(germans) > 1 for germans in translations.values())
    assert varied > 0.5 * len(translations)


def test_same_seed_same_pairs_different_seed_different_pairs():
    first = generate_pairs(500, seed=3)
    assert first == generate_pairs(500, seed=3)
    assert len({en for en, _ in first}) == len({de for _, de in first}) == 500
    other = generate_pairs(500, seed=4)
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 450
    assert first != grammar.generate_pairs(500, seed=3)


def test_splits_held_out_first_disjoint_and_lengths():
    splits = make_splits(3000, 200, 300, seed=5)
    assert [len(splits[k]) for k in ("train", "validation", "test")] == [3000, 200, 300]
    for side in (0, 1):
        train = {pair[side] for pair in splits["train"]}
        assert not train & {pair[side] for pair in splits["validation"] + splits["test"]}
    assert make_splits(1000, 200, 300, seed=5)["test"] == splits["test"]
    words = np.array([max(len(en.split()), len(de.split())) for en, de in splits["train"]])
    assert 10 <= words.mean() <= 16 and np.percentile(words, 99) <= 36


def _check(sentence, english: str, german: str) -> None:
    assert render(sentence) == (english, german)


def test_generated_nouns_decline_and_agree():
    weak = LEXICON.nouns[_first(NOUNS, weak=True, kind="person")]
    _check(
        Sentence2(Clause(NP("man"), "see", obj=NP(_first(NOUNS, weak=True, kind="person")), perfect=True)),
        f"The man has seen the {weak.en}.",
        f"Der Mann hat den {weak.de}n gesehen.",
    )
    key = _first(NOUNS, gender="f", kind="person")
    fem = LEXICON.nouns[key]
    sleepers = NP(key, "two", rel=Clause(None, "see", obj=NP("dog")))  # agreement across the relative clause
    _check(
        Sentence2(Clause(sleepers, "sleep")),
        f"Two {fem.en_pl} who see the dog sleep.",
        f"Zwei {fem.de_pl}, die den Hund sehen, schlafen.",
    )
    key, adj_key = _first(NOUNS, gender="n", kind="thing"), _first(ADJECTIVES)
    noun, adj = LEXICON.nouns[key], LEXICON.adjectives[adj_key]
    ball = NP(key, "a", adj=adj_key, pp=PP("on", NP("table", "my")))
    a = "an" if adj.en[0] in "aeiou" else "a"
    _check(
        Sentence2(Clause(NP("woman"), "play", pp=PP("with", ball))),
        f"The woman plays with {a} {adj.en} {noun.en} on my table.",
        f"Die Frau spielt mit einem {adj.de}en {noun.de} auf meinem Tisch.",
    )
    plural = LEXICON.nouns[key].de_pl
    _check(
        Sentence2(Clause(NP("man"), "help", obj=NP("child", "the", True, pp=PP("with", NP(key, ""))))),
        f"The man helps the children with {noun.en_pl}.",
        f"Der Mann hilft den Kindern mit {plural}{'' if plural.endswith(('n', 's')) else 'n'}.",
    )


def test_generated_verbs_take_their_participle_and_auxiliary():
    for frame, aux in [("acc", "hat"), ("motion", "ist")]:
        verb = LEXICON.verbs[_first(VERBS, frame=frame)]
        obj = NP("dog") if frame == "acc" else None
        pp = PP("into", NP("house")) if frame == "motion" else None
        english, german = render(Sentence2(Clause(NP("she"), verb.en, obj=obj, pp=pp, perfect=True)))
        assert english == f"She has {verb.en_pp} {'the dog' if obj else 'into the house'}."
        assert german == f"Sie {aux} {'den Hund' if obj else 'ins Haus'} {verb.de_pp}."


def test_every_german_variant_keeps_the_verb_second():
    sees = Clause(NP("man"), "see", obj=NP("dog"))
    often = Sentence2(sees, adverb="often", de_adverb="häufig")
    _check(often, "Often the man sees the dog.", "Der Mann sieht häufig den Hund.")
    _check(replace(often, de_front="adverb"), "Often the man sees the dog.", "Häufig sieht der Mann den Hund.")
    _check(replace(often, adverb_last=True), "The man sees the dog often.", "Der Mann sieht häufig den Hund.")
    plays = Clause(NP("woman"), "play", pp=PP("in", NP("garden")), perfect=True)
    _check(Sentence2(plays, de_front="pp"), "The woman has played in the garden.", "Im Garten hat die Frau gespielt.")
    buys = Clause(NP("woman"), "buy", obj=NP("book"))
    because = Sentence2(Clause(NP("man"), "sleep"), conj="because", sub=buys, de_conj="denn")
    _check(
        because, "The man sleeps because the woman buys the book.", "Der Mann schläft, denn die Frau kauft das Buch."
    )
    _check(
        replace(because, de_conj="da"),
        "The man sleeps because the woman buys the book.",
        "Der Mann schläft, da die Frau das Buch kauft.",
    )
    reads = Clause(None, "read")
    seen = Clause(NP("they"), "see", obj=NP("girl"), perfect=True, rel=reads)
    _check(Sentence2(seen), "They have seen the girl who reads.", "Sie haben das Mädchen gesehen, das liest.")
    in_place = replace(seen, obj=NP("girl", rel=reads), rel=None)
    _check(Sentence2(in_place), "They have seen the girl who reads.", "Sie haben das Mädchen, das liest, gesehen.")
    reader = NP("man", rel=reads)
    today = Sentence2(Clause(reader, "sleep"), adverb="today", de_adverb="heute", de_front="adverb")
    _check(today, "Today the man who reads sleeps.", "Heute schläft der Mann, der liest.")
    _check(replace(today, de_front=""), "Today the man who reads sleeps.", "Der Mann, der liest, schläft heute.")


def test_embedded2_is_built_by_its_own_tfds_builder(tmp_path):
    config = small_config(tmp_path, dataset="embedded2", num_train=300, num_validation=20, num_test=30)
    builder = corpora.prepare(config.data)
    assert type(builder) is corpora.FxformerEmbedded2 and builder.name == "fxformer_embedded2"
    assert "fxformer_embedded2" in str(builder.data_dir)
    expected = make_splits(300, 20, 30, seed=config.data.corpus_seed)
    for split, pairs in expected.items():
        source = corpora.data_source(builder, split)
        assert [(source[i]["en"].decode(), source[i]["de"].decode()) for i in range(len(source))] == pairs
    config.data.dataset = "embedded"
    assert type(corpora.get_builder(config.data)) is corpora.FxformerEmbedded
