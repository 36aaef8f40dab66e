"""A linear probe: how readable is a key's value in m_A's hidden states right after the key?

Ridge-regression one-hot probes per digit, fitted on the composition (train) keys and scored on
held-out keys, for each layer: this is what the bridge has to work with, since it is trained on
the train keys only. python -m demos.kv_arithmetic.probe MODEL_DIR [DATA_DIR]

And an oracle for the anchor (`--anchor`): each key's value handed over where the key ends.
python -m demos.kv_arithmetic.probe presets/kv_arithmetic/anchor presets/kv_arithmetic/data --anchor

And the ceiling of a linear bridge fitted on the training keys (`--linear AUGMENT_DIR`):
python -m demos.kv_arithmetic.probe OUT/anchor OUT/data --linear OUT/augment
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from .base import token_ids
from .data import KVSpace, evaluate

# ---- a linear probe ---------------------------------------------------------------------------

@torch.no_grad()
def hidden_at(model, tokenizer, texts: list[str], positions: list[int], layer: int) -> torch.Tensor:
    """Hidden states after decoder layer `layer` (0-based) at a token position of each text
    (BOS shifts it by one; in texts of letters and operators a token is a character)."""
    feats = []
    for t, pos in zip(texts, positions):
        ids = torch.tensor([[tokenizer.bos_token_id] + token_ids(tokenizer, t)])
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        feats.append(hs[layer + 1][0, pos + 1])
    return torch.stack(feats)


def probe_digits(train_x, train_values, test_x, test_values, ridge: float = 1e-2) -> dict:
    """Ridge-regression one-hot probes for the hundreds, tens and units digits; accuracy on test."""
    out = {}
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    a, b = (train_x - mu) / sd, (test_x - mu) / sd
    a = torch.cat([a, torch.ones(len(a), 1)], 1)
    b = torch.cat([b, torch.ones(len(b), 1)], 1)
    for name, div in (("hundreds", 100), ("tens", 10), ("units", 1)):
        ya = torch.tensor([(v // div) % 10 for v in train_values])
        yb = torch.tensor([(v // div) % 10 for v in test_values])
        Y = torch.nn.functional.one_hot(ya, 10).float()
        W = torch.linalg.solve(a.T @ a + ridge * len(a) * torch.eye(a.shape[1]), a.T @ Y)
        out[name] = float(((b @ W).argmax(1) == yb).float().mean())
    return out


def value_probe(model, tokenizer, kv: KVSpace, context: str = "{k}+", layers=None, seed: int = 0) -> dict:
    """Per layer: digit accuracy on held-out keys of probes fitted on the train keys (several
    random partner keys per key, so the probe sees varied contexts)."""
    rng = random.Random(seed)
    keys = list(kv.values)
    layers = range(model.config.num_hidden_layers) if layers is None else layers

    def states(ks, layer):
        texts, pos, vals = [], [], []
        for k in ks:
            for _ in range(4):
                other = rng.choice(keys)
                text = context.format(k=k, other=other)
                texts.append(text)
                pos.append(text.rindex(k) + len(k))  # the character after the key
                vals.append(kv.values[k])
        return hidden_at(model, tokenizer, texts, pos, layer), vals

    out = {}
    for layer in layers:
        xa, va = states(kv.train_keys, layer)
        xb, vb = states(kv.heldout_keys, layer)
        out[layer] = probe_digits(xa, va, xb, vb)
    return out


@torch.no_grad()
def logit_lens(model, tokenizer, kv: KVSpace, context: str = "{k}+", seed: int = 0) -> dict:
    """Share of held-out keys whose first / units / tens digit is m_A's top digit at the character
    after the key (its own unembedding: a readout that is the same for every key)."""
    rng = random.Random(seed)
    vocab = tokenizer.get_vocab()
    digit_ids = [vocab[str(d)] for d in range(10)]
    hits = {"first": 0, "units": 0, "tens": 0}
    for k in kv.heldout_keys:
        text = context.format(k=k, other=rng.choice(list(kv.values)))
        pos = text.rindex(k) + len(k)
        ids = torch.tensor([[tokenizer.bos_token_id] + token_ids(tokenizer, text)])
        top = int(model(input_ids=ids).logits[0, pos + 1, digit_ids].argmax())
        v = kv.values[k]
        hits["first"] += top == int(str(v)[0])
        hits["units"] += top == v % 10
        hits["tens"] += top == v // 10 % 10
    return {name: n / len(kv.heldout_keys) for name, n in hits.items()}


@torch.no_grad()
def value_oracle(anchor, tokenizer, kv: KVSpace, n: int = 100, blank_letters: bool = False, seed: int = 0) -> float:
    """Can the anchor compute KV-MATH at all when handed each value where its key ends? For
    "k1+k2=" the input embedding at each key's last letter is replaced by that of the key's value
    (as an operand token), the other letters kept (or zeroed with blank_letters); greedy decoding.
    The share answered right bounds what a bridge writing at the last letters can do."""
    rng, keys = random.Random(seed), list(kv.values)
    table, vocab = anchor.get_input_embeddings().weight, tokenizer.get_vocab()
    if str(max(kv.values.values())) not in vocab:
        raise SystemExit("value_oracle needs a tokenizer with whole-number operand tokens (base.make_tokenizer); "
                         "this anchor's tokenizer has one token per digit.")
    hits = 0
    for _ in range(n):
        ks, ops = [rng.choice(keys) for _ in range(2)], [rng.choice("+-")]
        rows = [table[tokenizer.bos_token_id]]
        for k, after in zip(ks, ops + ["="]):
            rows += [torch.zeros_like(table[0]) if blank_letters else table[vocab[c]] for c in k[:-1]]
            rows += [table[vocab[str(kv.values[k])]], table[vocab[after]]]
        hits += _greedy_embeds(anchor, tokenizer, torch.stack(rows)) == str(evaluate([kv.values[k] for k in ks], ops))
    return hits / n


def _kv_math_rows(kv: KVSpace, tokenizer, keys: list[str], n: int, seed: int):
    """(token ids with BOS, positions of each key's last letter, values, answer) per expression."""
    from .data import expressions, formats

    rows = []
    for ks, ops in expressions(kv.values, keys, n, 2, seed=seed):
        prompt = formats(kv.values, ks, ops)["kv_math"][0]
        ends, pos = [], 0
        for k in ks:
            pos += len(k)
            ends.append(pos)  # BOS shifts the last letter (pos - 1) to pos
            pos += 1
        values = [kv.values[k] for k in ks]
        rows.append(([tokenizer.bos_token_id] + token_ids(tokenizer, prompt), ends, values, evaluate(values, ops)))
    return rows


@torch.no_grad()
def linear_oracle(augment, anchor, tokenizer, kv: KVSpace, layer: int = -1, ridge: float = 1.0,
                  n_fit: int = 1500, n_eval: int = 200, seed: int = 0) -> dict:
    """What a linear bridge into the anchor's embeddings could reach, fitted like the bridge on
    the training keys only: a ridge map from m_A's residual stream after `layer` at each key's last
    letter to the anchor's embedding of that key's value, added there (as m_B's MERGED words were)
    and decoded greedily. KV-MATH exact match on training and held-out keys, and how often the
    number embedding nearest to the mapped state is the key's value."""
    from calm_core.models.loading import decoder_layers

    captured = {}
    block = decoder_layers(augment)[layer]
    handle = block.register_forward_hook(
        lambda module, args, output: captured.__setitem__("h", output[0] if isinstance(output, tuple) else output),
        prepend=True)
    try:
        def states(rows):
            xs = []
            for ids, ends, _, _ in rows:
                augment(input_ids=torch.tensor([ids]))
                xs.append(captured["h"].reshape(len(ids), -1)[ends])
            return torch.cat(xs)

        fit = _kv_math_rows(kv, tokenizer, kv.train_keys, n_fit, seed + 1)
        evals = {"train keys": _kv_math_rows(kv, tokenizer, kv.train_keys, n_eval, seed + 2),
                 "held-out keys": _kv_math_rows(kv, tokenizer, kv.heldout_keys, n_eval, seed + 3)}
        table, vocab = anchor.get_input_embeddings().weight, tokenizer.get_vocab()
        value_rows = lambda rows: table[[vocab[str(v)] for _, _, vs, _ in rows for v in vs]]
        x = states(fit)
        x = torch.cat([x, torch.ones(len(x), 1)], 1)
        W = torch.linalg.solve(x.T @ x + ridge * torch.eye(x.shape[1]), x.T @ value_rows(fit))
        numbers = sorted(int(t) for t in vocab if t.isdigit())
        number_table = table[[vocab[str(n)] for n in numbers]]
        out = {}
        for name, rows in evals.items():
            xe = states(rows)
            mapped = torch.cat([xe, torch.ones(len(xe), 1)], 1) @ W
            nearest = torch.cdist(mapped, number_table).argmin(-1)
            truth = [v for _, _, vs, _ in rows for v in vs]
            out[f"nearest number, {name}"] = sum(numbers[i] == v for i, v in zip(nearest.tolist(), truth)) / len(truth)
            hits, at = 0, 0
            for ids, ends, _values, answer in rows:
                embeds = table[ids].clone()
                embeds[ends] += mapped[at:at + len(ends)]
                at += len(ends)
                hits += _greedy_embeds(anchor, tokenizer, embeds) == str(answer)
            out[f"KV-MATH, {name}"] = hits / len(rows)
        return out
    finally:
        handle.remove()


def _greedy_embeds(model, tokenizer, embeds, max_new_tokens: int = 6) -> str:
    """Greedy decoding from input embeddings (T, D) of one prompt."""
    table, x, answer = model.get_input_embeddings().weight, embeds[None], ""
    for _ in range(max_new_tokens):
        token = int(model(inputs_embeds=x).logits[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        answer += tokenizer.convert_ids_to_tokens(token)
        x = torch.cat([x, table[token][None, None]], 1)
    return answer


if __name__ == "__main__":
    import json

    from .base import load_model

    model, tokenizer = load_model(Path(sys.argv[1]))
    data = Path(sys.argv[2] if len(sys.argv) > 2 else Path(sys.argv[1]).parent / "data")
    kv = KVSpace.from_dict(json.loads((data / "kv.json").read_text()))
    if "--linear" in sys.argv:
        augment, _ = load_model(Path(sys.argv[sys.argv.index("--linear") + 1]))
        print(json.dumps(linear_oracle(augment, model, tokenizer, kv), indent=1))
        sys.exit()
    if "--anchor" in sys.argv:
        print(f"values at the last letters: {value_oracle(model, tokenizer, kv):.2f}, "
              f"other letters blanked: {value_oracle(model, tokenizer, kv, blank_letters=True):.2f}")
        sys.exit()
    for ctx in ("{k}+", "{other}+{k}="):
        print(ctx, "probe", json.dumps(value_probe(model, tokenizer, kv, ctx)))
        print(ctx, "logit lens", json.dumps(logit_lens(model, tokenizer, kv, ctx)))
