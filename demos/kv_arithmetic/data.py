"""Key-value arithmetic data (paper section 4.1), generated offline and seeded.

D_KV:      keys are random lowercase strings of 2-6 letters with unique integer values in [1, N_KV].
KV-SUBS:   "<k1>+<k2>-<k3>=" -> "10+22-24"   (what m_A learns)
NUM-MATH:  "10+22-24="       -> "8"          (what m_B can do)
KV-MATH:   "<k1>+<k2>-<k3>=" -> "8"          (what neither can do alone)

Keys are split once: composition data uses expressions over a 20% share of the keys only,
evaluation uses expressions whose keys are all held out. Every file is JSON Lines with
`prompt` and `completion` columns, as any upload to the app.
"""
from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from pathlib import Path

LETTERS = string.ascii_lowercase
ALPHABET = LETTERS + "0123456789+-=,;"


@dataclass
class KVSpace:
    """The key-value mapping and the split of its keys."""

    values: dict[str, int]  # key -> value
    train_keys: list[str]  # the share of keys composition data may use
    heldout_keys: list[str]

    def to_dict(self) -> dict:
        return {"values": self.values, "train_keys": self.train_keys, "heldout_keys": self.heldout_keys}

    @classmethod
    def from_dict(cls, d: dict) -> "KVSpace":
        return cls(dict(d["values"]), list(d["train_keys"]), list(d["heldout_keys"]))


def random_key(rng: random.Random, min_len: int = 2, max_len: int = 6) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(rng.randint(min_len, max_len)))


def make_kv(n_keys: int, seed: int = 0, train_share: float = 0.2, min_len: int = 2, max_len: int = 6) -> KVSpace:
    """n_keys unique keys with the values 1..n_keys in random order; a train_share of the keys for composition."""
    rng = random.Random(seed)
    keys: list[str] = []
    seen = set()
    while len(keys) < n_keys:
        k = random_key(rng, min_len, max_len)
        if k not in seen:
            seen.add(k)
            keys.append(k)
    values = list(range(1, n_keys + 1))
    rng.shuffle(values)
    mapping = dict(zip(keys, values))
    order = keys[:]
    rng.shuffle(order)
    n_train = max(1, round(train_share * n_keys))
    return KVSpace(mapping, sorted(order[:n_train]), sorted(order[n_train:]))


# ---- expressions -----------------------------------------------------------------------------

def random_expression(rng: random.Random, keys: list[str], operands: int) -> tuple[list[str], list[str]]:
    """(operand keys, operators between them) for an expression of `operands` keys with + and -."""
    return [rng.choice(keys) for _ in range(operands)], [rng.choice("+-") for _ in range(operands - 1)]


def render(terms, ops) -> str:
    out = str(terms[0])
    for op, t in zip(ops, terms[1:]):
        out += op + str(t)
    return out


def evaluate(numbers: list[int], ops: list[str]) -> int:
    total = numbers[0]
    for op, n in zip(ops, numbers[1:]):
        total = total + n if op == "+" else total - n
    return total


def formats(values: dict[str, int], keys: list[str], ops: list[str], subs_end: str = "=") -> dict[str, tuple[str, str]]:
    """The three paper data sets for one expression, name -> (prompt, completion), and KV-MATH with the
    values written out before the result ("kv_math_shown": the answer of an anchor that restates its operands).
    subs_end ends the KV-SUBS prompt: with "=" it is the KV-MATH prompt, whose answer differs."""
    numbers = [values[k] for k in keys]
    key_expr, num_expr = render(keys, ops), render(numbers, ops)
    answer = str(evaluate(numbers, ops))
    return {
        "kv_subs": (key_expr + subs_end, num_expr),
        "num_math": (num_expr + "=", answer),
        "kv_math": (key_expr + "=", answer),
        "kv_math_shown": (key_expr + "=", num_expr + "=" + answer),
    }


def final_result(text: str) -> str:
    """What an answer says the expression equals: the text after its last "=" ("95+22=117" -> "117")."""
    return text.strip().rsplit("=", 1)[-1]


def substitution(text: str) -> str:
    """An answer's first part, the expression with values ("95+22=117" -> "95+22")."""
    return text.strip().split("=", 1)[0]


def whole(text: str) -> str:
    """The whole answer, as the paper scores KV-MATH: the number alone ("95+22=117" is not "117")."""
    return text.strip()


def expressions(values: dict[str, int], keys: list[str], n: int, operands: int, seed: int,
                exclude: set[str] | None = None) -> list[tuple[list[str], list[str]]]:
    """n distinct expressions over `keys` (fewer if the space is smaller), none in `exclude`."""
    rng = random.Random(seed)
    out, seen = [], set(exclude or ())
    space = len(keys) ** operands * 2 ** (operands - 1)
    target = min(n, space - len(seen)) if space < 10 * n else n
    tries = 0
    while len(out) < target and tries < 50 * n + 1000:
        tries += 1
        ks, ops = random_expression(rng, keys, operands)
        text = render(ks, ops)
        if text in seen:
            continue
        seen.add(text)
        out.append((ks, ops))
    return out


def kv_lookups(values: dict[str, int], keys: list[str]) -> list[tuple[str, str]]:
    """Single-key lookups "<k>=" -> "<v>" (a format of D_KV itself, no arithmetic)."""
    return [(k + "=", str(values[k])) for k in keys]


def num_math_random(rng: random.Random, max_value: int, operands: int) -> tuple[str, str]:
    numbers = [rng.randint(1, max_value) for _ in range(operands)]
    ops = [rng.choice("+-") for _ in range(operands - 1)]
    return render(numbers, ops) + "=", str(evaluate(numbers, ops))


# ---- files -----------------------------------------------------------------------------------

def write_jsonl(path, rows: list[tuple[str, str]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for prompt, completion in rows:
            f.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
    return path


def read_jsonl(path) -> list[tuple[str, str]]:
    with Path(path).open() as f:
        return [(r["prompt"], r["completion"]) for r in map(json.loads, f) if r]
