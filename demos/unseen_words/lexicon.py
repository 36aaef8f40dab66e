"""A made-up language whose test needs words that the parallel set never contains (issue 18, item 5).

The grammar is the translation demo's (demos/translation/language.py: subject-object-verb, adjectives after
nouns, a plural suffix, an object case suffix); the lexicon is bigger, and a seeded third of the nouns, verbs
and adjectives are *unseen*: no parallel-set or validation sentence contains them. The test sentences each
contain at least one. Only m_A knows them: it read the language as interlinear glossed text (each foreign word
followed by its English gloss, as in a field linguist's notes), m_B read English only, and the bridge is
trained on parallel sentences of seen words. So the fine-tuned anchor cannot learn an unseen word, and a
composition can only translate one if it carries what m_A knows.

Tokens are words (WordPiece): a stem, then a suffix piece (`dasagi` = `dasag ##i`, `cats` = `cat ##s`), so a
word's meaning sits at one position in both models, and an English word is a token both models share: m_A
writes it as a gloss, m_B as English.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from demos.translation.language import (
    CASE_SUFFIX,
    DETERMINERS,
    PLURAL_SUFFIX,
    Language,
    NounPhrase,
    Sentence,
    make_language,
)

NOUNS = ["dog", "cat", "bird", "horse", "cow", "girl", "boy", "farmer", "king", "baker", "apple", "book",
         "ball", "tree", "stone", "house", "goat", "frog", "duck", "queen", "singer", "lamp", "boat", "egg"]
VERBS = ["see", "eat", "like", "find", "take", "help", "follow", "hear", "want", "call", "meet", "know",
         "paint", "visit", "draw"]
ADJECTIVES = ["big", "small", "red", "old", "young", "happy", "green", "brown", "tall", "quiet", "clever", "angry"]
ENGLISH_SUFFIX = "s"  # plural nouns and the verb after a singular subject


@dataclass
class World:
    """The language and which of its lemmas are unseen (in no parallel-set or validation sentence)."""

    language: Language
    unseen: set[str]

    def is_seen(self, sentence: Sentence) -> bool:
        return not sentence.words() & self.unseen

    def unseen_slots(self, sentence: Sentence) -> list[str]:
        """Which slots of the sentence hold an unseen lemma ("subject noun", "verb", "object adjective", ...)."""
        return [slot for slot, lemma in slots(sentence).items() if lemma in self.unseen]

    def to_dict(self) -> dict:
        return {**self.language.to_dict(), "unseen": sorted(self.unseen),
                "categories": self.language.categories}


def slots(sentence: Sentence) -> dict[str, str | None]:
    """slot name -> lemma (None: no adjective)."""
    return {"subject noun": sentence.subject.noun, "subject adjective": sentence.subject.adjective,
            "verb": sentence.verb, "object noun": sentence.object.noun, "object adjective": sentence.object.adjective}


def make_world(seed: int = 0, unseen_share: float = 1 / 3) -> World:
    """The lexicon (demos.translation.language.make_language over the bigger word lists) and a seeded
    `unseen_share` of each open class (nouns, verbs, adjectives) held out of the parallel set."""
    language = make_language(seed, NOUNS, VERBS, ADJECTIVES)
    rng = random.Random(seed + 77)
    unseen: set[str] = set()
    for words in (NOUNS, VERBS, ADJECTIVES):
        unseen |= set(rng.sample(words, max(1, round(len(words) * unseen_share))))
    return World(language, unseen)


# ---- the glossed corpus (m_A's data) -------------------------------------------------------------

def foreign_words(language: Language, sentence: Sentence) -> list[tuple[str, str]]:
    """(foreign word, English gloss) in the foreign order. Glosses are English word forms: a plural noun is
    glossed in the plural ("cats"), the indefinite determiner as "a", the verb in its base form."""
    def noun_phrase(np: NounPhrase, object_case: bool) -> list[tuple[str, str]]:
        words = [(language.lexicon[np.determiner] + (CASE_SUFFIX if object_case else ""), np.determiner),
                 (language.lexicon[np.noun] + (PLURAL_SUFFIX if np.plural else ""),
                  np.noun + (ENGLISH_SUFFIX if np.plural else ""))]
        if np.adjective:
            words.append((language.lexicon[np.adjective], np.adjective))
        return words

    return noun_phrase(sentence.subject, False) + noun_phrase(sentence.object, True) + [
        (language.lexicon[sentence.verb], sentence.verb)]


def glossed(language: Language, sentence: Sentence, rng: random.Random, drop: float) -> str:
    """Interlinear text: each foreign word followed by its gloss, each gloss left out with probability `drop`
    (so that m_A also reads foreign words side by side, as in a plain sentence)."""
    out = []
    for word, gloss in foreign_words(language, sentence):
        out.append(word)
        if rng.random() >= drop:
            out.append(gloss)
    return " ".join(out)


# ---- splits ---------------------------------------------------------------------------------------

@dataclass
class Splits:
    parallel: list[Sentence]  # seen lemmas only: what the bridge and the fine-tuned anchor learn from
    validation: list[Sentence]  # seen lemmas only: every setting was chosen on these
    test_seen: list[Sentence]  # new sentences of seen lemmas
    test_unseen: list[Sentence]  # new sentences with at least one unseen lemma: the test, run once

    def used(self) -> list[Sentence]:
        return self.parallel + self.validation + self.test_seen + self.test_unseen

    def coverage(self, world: World) -> dict:
        in_parallel = set().union(*(x.words() for x in self.parallel)) if self.parallel else set()
        return {"lemmas": len(world.language.lexicon), "unseen_lemmas": len(world.unseen),
                "lemmas_in_parallel_set": len(in_parallel),
                "unseen_lemmas_in_parallel_or_validation": len((in_parallel | set().union(
                    *(x.words() for x in self.validation))) & world.unseen),
                "test_unseen_sentences": len(self.test_unseen),
                "unseen_slots_in_test": sum(len(world.unseen_slots(x)) for x in self.test_unseen)}


def make_splits(world: World, parallel: int, validation: int, test_seen: int, test_unseen: int,
                seed: int = 0) -> Splits:
    """Distinct sentences; the parallel set is topped up until every seen lemma occurs in it."""
    rng = random.Random(seed + 1000)
    taken: set[Sentence] = set()

    def fresh(seen: bool) -> Sentence:
        while True:
            x = world.language.sentence(rng)
            if x not in taken and world.is_seen(x) == seen:
                taken.add(x)
                return x

    par = [fresh(True) for _ in range(parallel)]
    seen_lemmas = set(world.language.lexicon) - world.unseen
    missing = seen_lemmas - set().union(*(x.words() for x in par)) if par else set()
    while missing and par:
        x = fresh(True)
        if x.words() & missing:
            par[rng.randrange(len(par))] = x
            missing = seen_lemmas - set().union(*(y.words() for y in par))
    return Splits(par, [fresh(True) for _ in range(validation)], [fresh(True) for _ in range(test_seen)],
                  [fresh(False) for _ in range(test_unseen)])


# ---- the shared word tokenizer --------------------------------------------------------------------

def make_tokenizer(world: World):
    """WordPiece over whole words: foreign stems and English lemmas, the suffixes as `##` pieces, "=".
    Checked: every word form of both languages splits into exactly its stem and suffix."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from calm_core.models.tiny import SPECIAL_TOKENS, as_fast_tokenizer

    lang = world.language
    english = list(lang.categories["noun"]) + list(lang.categories["verb"]) + list(lang.categories["adjective"])
    english += ["the", "a", "an", "some"]
    pieces = ["=", *lang.lexicon.values(), *english, "##" + PLURAL_SUFFIX, "##" + CASE_SUFFIX, "##" + ENGLISH_SUFFIX]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = as_fast_tokenizer(tokenizer, add_bos=True)
    forms = {w: [w] for w in lang.lexicon.values()} | {w: [w] for w in english}
    forms |= {lang.lexicon[n] + PLURAL_SUFFIX: [lang.lexicon[n], "##" + PLURAL_SUFFIX] for n in lang.categories["noun"]}
    forms |= {lang.lexicon[d] + CASE_SUFFIX: [lang.lexicon[d], "##" + CASE_SUFFIX] for d in DETERMINERS}
    forms |= {w + ENGLISH_SUFFIX: [w, "##" + ENGLISH_SUFFIX] for w in lang.categories["noun"] + lang.categories["verb"]}
    for form, expected in forms.items():
        got = tokenizer.encode(form, add_special_tokens=False).tokens
        if got != expected:
            raise ValueError(f"{form!r} tokenizes as {got}, not {expected}: pick another seed")
    return tok
