"""What each base model is trained on (samplers of segment lists for base.train_lm).

m_A (augmenting): knows D_KV, never sees arithmetic. Formats of D_KV only:
  KV-SUBS            "ab+xyz="            -> "95+22"
  single lookups     "ab="                -> "95"
  plus value heads (base.ValueHeads) reading each key's value at the character after the key.
m_B (anchor): does arithmetic, never sees a key of D_KV (nor any letter): NUM-MATH
  "95+22=" -> "117", plus value heads reading each operand at the character after it.
"""
from __future__ import annotations

import random

from .data import evaluate, render


def augment_sampler(values: dict[str, int], operands: int, lookup: float = 0.3):
    """KV-SUBS and single lookups; every key's value is also read by the value heads at the
    character right after the key (the operator or "="), where the bridge will look for it."""
    keys = list(values)

    def sample(rng: random.Random):
        if rng.random() < lookup:
            k = rng.choice(keys)
            return [(k, False), ("=", False, values[k]), (str(values[k]), True)]
        n = rng.randint(2, operands) if operands > 2 else 2
        ks = [rng.choice(keys) for _ in range(n)]
        ops = [rng.choice("+-") for _ in range(n - 1)]
        segs = []
        for k, after in zip(ks, ops + ["="]):
            segs += [(k, False), (after, False, values[k])]
        return segs + [(render([values[k] for k in ks], ops), True)]

    return sample


def anchor_sampler(max_value: int, operands: int):
    """NUM-MATH with random operands in [1, max_value]: digits only, so never a key of D_KV. Each
    operand's value is also read by the value heads at the character after it."""
    def sample(rng: random.Random):
        n = rng.randint(2, operands) if operands > 2 else 2
        nums = [rng.randint(1, max_value) for _ in range(n)]
        ops = [rng.choice("+-") for _ in range(n - 1)]
        segs = []
        for x, after in zip(nums, ops + ["="]):
            segs += [(str(x), False), (after, False, x)]
        return segs + [(str(evaluate(nums, ops)), True)]

    return sample
