"""What each base model is trained on (samplers of segment lists for base.train_lm).

m_A (augmenting): knows D_KV, never sees arithmetic. Formats of D_KV only:
  KV-SUBS            "ab+xyz="            -> "95+22"
  inline values      "ab" 95 "+xyz" 22 "=" -> "95+22"  (the loss covers the inline digits too, so
                     each value is predicted right after its key and is readable at its last letter)
  single lookups     "ab="                -> "95"
m_B (anchor): does arithmetic, never sees a key of D_KV. NUM-MATH, and (optionally) the general
  skill of arithmetic over variables defined in context, with names drawn outside D_KV:
  "qw=95,rty=22;qw+rty=" -> "117"
"""
from __future__ import annotations

import random

from .data import evaluate, random_key, render


def augment_sampler(values: dict[str, int], operands: int, inline: float = 0.3, lookup: float = 0.15,
                    digits: float = 0.0):
    """digits: share of single-digit lookups "ab," -> units digit, "ab;" -> tens digit, so that every
    digit of a value has to be retrievable from the key's own position."""
    keys = list(values)

    def sample(rng: random.Random):
        if digits and rng.random() < digits:
            k = rng.choice(keys)
            v = values[k]
            return [(k + ",", False), (str(v % 10), True)] if rng.random() < 0.5 else [(k + ";", False), (str(v // 10 % 10), True)]
        r = rng.random()
        if r < lookup:
            k = rng.choice(keys)
            return [(k + "=", False), (str(values[k]), True)]
        n = rng.randint(2, operands) if operands > 2 else 2
        ks = [rng.choice(keys) for _ in range(n)]
        ops = [rng.choice("+-") for _ in range(n - 1)]
        answer = render([values[k] for k in ks], ops)
        if r < lookup + inline:
            segs = []
            for i, k in enumerate(ks):
                segs += [((ops[i - 1] if i else "") + k, False), (str(values[k]), True)]
            return segs + [("=", False), (answer, True)]
        return [(render(ks, ops) + "=", False), (answer, True)]

    return sample


def anchor_sampler(max_value: int, operands: int, forbidden: set[str], in_context: float = 0.5,
                   distractor: float = 0.3):
    def name(rng):
        while True:
            k = random_key(rng)
            if k not in forbidden:
                return k

    def sample(rng: random.Random):
        n = rng.randint(2, operands) if operands > 2 else 2
        nums = [rng.randint(1, max_value) for _ in range(n)]
        ops = [rng.choice("+-") for _ in range(n - 1)]
        answer = str(evaluate(nums, ops))
        if rng.random() >= in_context:
            return [(render(nums, ops) + "=", False), (answer, True)]
        names = []
        while len(names) < n:
            k = name(rng)
            if k not in names:
                names.append(k)
        defs = list(zip(names, nums))
        if rng.random() < distractor:
            defs.append((name(rng), rng.randint(1, max_value)))
        rng.shuffle(defs)
        context = ",".join(f"{k}={v}" for k, v in defs) + ";"
        return [(context + render(names, ops) + "=", False), (answer, True)]

    return sample
