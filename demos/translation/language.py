"""A made-up "low-resource language" and English, generated from one small grammar, seeded.

Why a made-up language: the paper's section 4.2 composes an anchor that writes English with an
augmenting model that was trained on low-resource languages. To show that on a CPU in minutes,
both languages must be tiny and fully known, so that we can say exactly what each model saw.

English:  DET [ADJ] NOUN  VERB  DET [ADJ] NOUN                  "the big dog sees some red cats"
Foreign:  DET NOUN[-PL] [ADJ]  DET-OBJ NOUN[-PL] [ADJ]  VERB    "vo nobi tusat sen pozii dasag lodu"

Rules that make the foreign language more than a word-by-word cipher of English:
- word order: subject-object-verb (English: subject-verb-object);
- noun phrases: determiner, noun, then adjective (English: determiner, adjective, noun);
- case: the object's determiner takes a suffix (like German "der" / "den"), so every word of a
  noun phrase follows a marker of its role; m_A, reading left to right, can know the role of
  each word where it reads it, which is what the bridge needs to find the subject's and the
  object's words when the anchor writes them;
- number: a plural suffix on the noun; the foreign verb never changes, while the English verb
  agrees with the subject ("sees" / "see"), and the English indefinite determiner depends on
  number ("a" / "some"): writing English needs the suffix read back from the foreign noun;
- "a" / "an" is English spelling only (the foreign language has one indefinite determiner):
  that part is the anchor's own knowledge.

The lexicon maps English lemmas one to one (a bijection) onto invented words built from
consonant-vowel syllables, none of which is an English word of the grammar.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

NOUNS = ["dog", "cat", "bird", "horse", "cow", "girl", "boy", "farmer", "king", "baker",
         "apple", "book", "ball", "tree", "stone", "house"]
VERBS = ["see", "eat", "like", "find", "take", "help", "follow", "hear", "want", "call", "meet", "know"]
ADJECTIVES = ["big", "small", "red", "old", "young", "happy", "green", "brown"]
DETERMINERS = ["the", "a"]  # lemmas: definite and indefinite ("a" is written "an" / "some" in English)
CONSONANTS = "bdgklmnprstvz"
VOWELS = "aeiou"
PLURAL_SUFFIX = "i"
CASE_SUFFIX = "n"  # on the object's determiner
SEPARATOR = " = "  # prompt = foreign sentence + SEPARATOR, completion = English
ALPHABET = "abcdefghijklmnopqrstuvwxyz =."


@dataclass(frozen=True)
class NounPhrase:
    noun: str
    adjective: str | None
    determiner: str  # "the" or "a"
    plural: bool


@dataclass(frozen=True)
class Sentence:
    subject: NounPhrase
    verb: str
    object: NounPhrase

    def words(self) -> set[str]:
        """The English lemmas of the sentence."""
        return {w for np in (self.subject, self.object) for w in (np.noun, np.adjective, np.determiner) if w} | {self.verb}


@dataclass
class Language:
    """The lexicon (English lemma -> foreign word, a bijection) and the two renderings."""

    lexicon: dict[str, str]
    seed: int = 0
    categories: dict[str, list[str]] = field(default_factory=lambda: {
        "noun": list(NOUNS), "verb": list(VERBS), "adjective": list(ADJECTIVES), "determiner": list(DETERMINERS)})

    # ---- English ----------------------------------------------------------------------------
    @staticmethod
    def english_np(np: NounPhrase) -> str:
        noun = np.noun + ("s" if np.plural else "")
        following = np.adjective or noun
        det = "the" if np.determiner == "the" else "some" if np.plural else "an" if following[0] in "aeiou" else "a"
        return " ".join(w for w in (det, np.adjective, noun) if w)

    def english(self, s: Sentence) -> str:
        verb = s.verb if s.subject.plural else s.verb + "s"
        return f"{self.english_np(s.subject)} {verb} {self.english_np(s.object)}"

    # ---- the foreign language ---------------------------------------------------------------
    def foreign_np(self, np: NounPhrase, object_case: bool = False) -> str:
        determiner = self.lexicon[np.determiner] + (CASE_SUFFIX if object_case else "")
        noun = self.lexicon[np.noun] + (PLURAL_SUFFIX if np.plural else "")
        adjective = self.lexicon[np.adjective] if np.adjective else None
        return " ".join(w for w in (determiner, noun, adjective) if w)

    def foreign(self, s: Sentence) -> str:
        return f"{self.foreign_np(s.subject)} {self.foreign_np(s.object, object_case=True)} {self.lexicon[s.verb]}"

    def pair(self, s: Sentence) -> tuple[str, str]:
        """(prompt, completion) in the composition format."""
        return self.foreign(s) + SEPARATOR, self.english(s)

    # ---- sampling ---------------------------------------------------------------------------
    def noun_phrase(self, rng: random.Random, adjective: float = 0.5, plural: float = 0.3) -> NounPhrase:
        return NounPhrase(rng.choice(self.categories["noun"]),
                          rng.choice(self.categories["adjective"]) if rng.random() < adjective else None,
                          rng.choice(self.categories["determiner"]), rng.random() < plural)

    def sentence(self, rng: random.Random) -> Sentence:
        return Sentence(self.noun_phrase(rng), rng.choice(self.categories["verb"]), self.noun_phrase(rng))

    def to_dict(self) -> dict:
        return {"seed": self.seed, "lexicon": self.lexicon, "plural_suffix": PLURAL_SUFFIX,
                "object_case_suffix": CASE_SUFFIX, "separator": SEPARATOR,
                "word_order": {"English": "DET [ADJ] NOUN VERB DET [ADJ] NOUN",
                               "foreign": f"DET NOUN[-{PLURAL_SUFFIX}] [ADJ] DET-{CASE_SUFFIX} NOUN[-{PLURAL_SUFFIX}] [ADJ] VERB"}}


def invent_word(rng: random.Random, syllables: int) -> str:
    word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))
    return word + rng.choice(CONSONANTS) if rng.random() < 0.5 else word


def make_language(seed: int = 0, nouns: list[str] = NOUNS, verbs: list[str] = VERBS,
                  adjectives: list[str] = ADJECTIVES) -> Language:
    """A seeded lexicon: content words of 2 syllables (sometimes a closing consonant), the two
    determiners of one syllable. No two foreign words are equal, none is an English word, and no
    noun with the plural suffix (nor determiner with the case suffix) reads as another word.
    Other word lists give a bigger language with the same grammar (demos/unseen_words)."""
    rng = random.Random(seed)
    nouns, verbs, adjectives = list(nouns), list(verbs), list(adjectives)
    english = set(nouns + verbs + adjectives + DETERMINERS + ["some", "an"])
    english |= {w + "s" for w in nouns + verbs}
    used: set[str] = set()
    lexicon: dict[str, str] = {}
    for lemma in nouns + verbs + adjectives + DETERMINERS:
        while True:
            word = invent_word(rng, 1 if lemma in DETERMINERS else 2)
            clashes = {word, word + PLURAL_SUFFIX, word + CASE_SUFFIX} & (used | english) or (
                word[-1] in PLURAL_SUFFIX + CASE_SUFFIX and word[:-1] in used)
            if len(word) >= 2 and not clashes:
                break
        used |= {word, word + PLURAL_SUFFIX} if lemma in nouns else {word, word + CASE_SUFFIX} if lemma in DETERMINERS else {word}
        lexicon[lemma] = word
    categories = {"noun": nouns, "verb": verbs, "adjective": adjectives, "determiner": list(DETERMINERS)}
    return Language(lexicon, seed, categories)


# ---- the splits -------------------------------------------------------------------------------

@dataclass
class Splits:
    parallel: list[Sentence]  # the small parallel set the bridge is trained on
    validation: list[Sentence]
    heldout: list[Sentence]  # new sentences: none in the parallel or validation set

    def coverage(self) -> dict:
        """Whether every lemma of the held-out sentences was seen in the parallel set."""
        seen = set().union(*(s.words() for s in self.parallel)) if self.parallel else set()
        held = [s.words() for s in self.heldout]
        return {"lemmas_in_parallel_set": len(seen),
                "heldout_sentences_all_lemmas_seen": sum(w <= seen for w in held),
                "heldout_sentences": len(held)}


def make_splits(language: Language, parallel: int, validation: int, heldout: int, seed: int = 0) -> Splits:
    """Distinct sentences, split into parallel / validation / held-out. The parallel set is
    topped up until every lemma of the lexicon occurs in it at least once, so held-out sentences
    are new combinations of known words (as FLORES sentences are new sentences, not new words)."""
    rng = random.Random(seed + 1000)
    seen: set[Sentence] = set()

    def fresh() -> Sentence:
        while True:
            s = language.sentence(rng)
            if s not in seen:
                seen.add(s)
                return s

    par = [fresh() for _ in range(parallel)]
    missing = set(language.lexicon) - set().union(*(s.words() for s in par)) if par else set()
    while missing and par:
        s = fresh()
        if s.words() & missing:
            par[rng.randrange(len(par))] = s  # keeps the size: swap in a sentence with a missing word
            missing = set(language.lexicon) - set().union(*(x.words() for x in par))
    val = [fresh() for _ in range(validation)]
    held = [fresh() for _ in range(heldout)]
    return Splits(par, val, held)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def parse_english(lang: Language, text: str, strict: bool = True) -> Sentence | None:
    """The sentence an English text renders, or None if the grammar cannot produce it: for
    scoring translations word by word (which noun, which verb was right). strict=False also
    reads texts with wrong agreement or a / an ("the dogs sees a apple")."""
    words = text.split()
    nouns = {n: (n, False) for n in lang.categories["noun"]} | {n + "s": (n, True) for n in lang.categories["noun"]}

    def np_at(i: int):
        if i >= len(words) or words[i] not in ("the", "a", "an", "some"):
            return None, i
        det = "the" if words[i] == "the" else "a"
        adjective = words[i + 1] if i + 1 < len(words) and words[i + 1] in lang.categories["adjective"] else None
        j = i + 1 + (adjective is not None)
        if j >= len(words) or words[j] not in nouns:
            return None, i
        noun, plural = nouns[words[j]]
        return NounPhrase(noun, adjective, det, plural), j + 1

    subject, i = np_at(0)
    if subject is None or i >= len(words):
        return None
    verb = words[i][:-1] if words[i].endswith("s") and words[i][:-1] in lang.categories["verb"] else words[i]
    obj, end = np_at(i + 1)
    if verb not in lang.categories["verb"] or obj is None or end != len(words):
        return None
    parsed = Sentence(subject, verb, obj)
    return parsed if not strict or lang.english(parsed) == " ".join(words) else None
