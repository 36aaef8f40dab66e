"""What each base model is trained on (samplers of segment lists for base.train_lm).

m_A (augmenting): knows D_KV, never sees arithmetic. Formats of D_KV only:
  KV-SUBS            "ab+xyz="            -> "95+22"
  single lookups     "ab="                -> "95"
  plus value heads (base.ValueHeads) reading each key's value at the character after the key.
m_B (anchor): does arithmetic, never sees a key of D_KV: NUM-MATH "95+22=" -> "117", some operands
  labelled by a random word ("qw95+22="), and some given as a random word that carries the
  operand's embedding at its last letter ("qw+22=" -> "117", 95 merged into "w"; base.MERGED). With
  `restate`, an expression with any such word operand is answered with its operands first:
  "qw+22=" -> "95+22=117"; with `given`, some such expressions come with "95+22=" written as input and
  words carrying other values, and only the result "117" is learned.
"""
from __future__ import annotations

import random

from .base import MERGED
from .data import evaluate, random_key, render


def augment_sampler(values: dict[str, int], operands: int, lookup: float = 0.3, at_last_letter: bool = False,
                    end: str = "="):
    """KV-SUBS (its prompt ended by `end`) and single lookups; every key's value is also read by the
    value heads (if any) at the character right after the key (the operator or `end`), where the bridge
    will look for it, and with at_last_letter also at the key's own last letter."""
    keys = list(values)

    def sample(rng: random.Random):
        if rng.random() < lookup:
            k = rng.choice(keys)
            key = (k, False, values[k]) if at_last_letter else (k, False)
            return [key, ("=", False, values[k]), (str(values[k]), True)]
        n = rng.randint(2, operands) if operands > 2 else 2
        ks = [rng.choice(keys) for _ in range(n)]
        ops = [rng.choice("+-") for _ in range(n - 1)]
        segs = []
        for k, after in zip(ks, ops + [end]):
            segs += [(k, False, values[k]) if at_last_letter else (k, False), (after, False, values[k])]
        return segs + [(render([values[k] for k in ks], ops), True)]

    return sample


def anchor_sampler(max_value: int, operands: int, forbidden: set[str] = frozenset(), labels: float = 0.0,
                   merged: float = 0.0, restate: bool = False, given: float = 0.0):
    """NUM-MATH with random operands in [1, max_value] ("95+22=" -> "117"). Each operand's value is
    read by the value heads (if any) at the character after it. Per operand, with probability
    `labels` a random lowercase word of 1-6 letters, never one of `forbidden`, comes first
    ("qw95+22=" -> "117"): text around numbers, as a general-purpose anchor has seen, so that its
    arithmetic finds an operand as the token before an operator rather than at a fixed distance
    from "="; with probability `merged` the operand *is* such a word, its value's embedding added
    at the word's last letter ("qw+22=" -> "117"): how the bridge will hand it a key's value. With `restate`
    an expression with a word among its operands is answered "95+22=117": the anchor first writes each
    operand it read, then computes from what it wrote (plain "95+22=" stays "117"). Reading a value off a
    word is then learned per operand, and a bridge gets a direct signal for each value it hands over.
    With probability `given`, an expression with merged words comes with its operands already written
    (input, no loss) while its words carry other values (one digit off or random, see other_value):
    only the result is learned, so the result is computed from the written operands, not from what the
    words carried (which, through a bridge, is only approximately a value)."""
    def name(rng):
        while True:
            k = random_key(rng, 1)
            if k not in forbidden:
                return k

    def sample(rng: random.Random):
        n = rng.randint(2, operands) if operands > 2 else 2
        nums = [rng.randint(1, max_value) for _ in range(n)]
        ops = [rng.choice("+-") for _ in range(n - 1)]
        segs, worded, has_merged = [], False, False
        give = restate and given > 0 and rng.random() < given  # no draw when off: older runs stay reproducible
        for x, after in zip(nums, ops + ["="]):
            r = rng.random()
            worded |= r < merged + labels
            if r < merged:
                has_merged = True
                carried = other_value(rng, x, max_value) if give else x
                segs += [(name(rng), False, carried, MERGED), (after, False)]
                continue
            if r < merged + labels:
                segs.append((name(rng), False))
            segs += [(str(x), False), (after, False, x)]
        answer = str(evaluate(nums, ops))
        if give and has_merged:
            return segs + [(render(nums, ops) + "=", False), (answer, True)]
        return segs + [((render(nums, ops) + "=" + answer) if restate and worded else answer, True)]

    return sample


def other_value(rng: random.Random, x: int, max_value: int) -> int:
    """A value in [1, max_value] other than x: half the time one of x's digits changed (the mistakes
    a bridge makes), otherwise any value."""
    while True:
        if rng.random() < 0.5:
            place = 10 ** rng.randrange(len(str(max_value)))
            y = x + (rng.randrange(10) - x // place % 10) * place
        else:
            y = rng.randint(1, max_value)
        if y != x and 1 <= y <= max_value:
            return y
