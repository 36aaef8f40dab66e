"""A linear probe: how readable is a key's value in m_A's hidden states right after the key?

Ridge-regression one-hot probes per digit, fitted on the composition (train) keys and scored on
held-out keys, for each layer: this is what the bridge has to work with, since it is trained on
the train keys only. python -m demos.kv_arithmetic.probe MODEL_DIR [DATA_DIR]

And an oracle for the anchor (`--anchor`): each key's value handed over where the key ends.
python -m demos.kv_arithmetic.probe presets/kv_arithmetic/anchor presets/kv_arithmetic/data --anchor
"""
from __future__ import annotations

import random
import sys

import torch
from pathlib import Path

from .base import hidden_at, probe_digits, token_ids
from .data import KVSpace, evaluate


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
        x, answer = torch.stack(rows)[None], ""
        for _ in range(6):
            token = int(anchor(inputs_embeds=x).logits[0, -1].argmax())
            if token == tokenizer.eos_token_id:
                break
            answer += tokenizer.convert_ids_to_tokens(token)
            x = torch.cat([x, table[token][None, None]], 1)
        hits += answer == str(evaluate([kv.values[k] for k in ks], ops))
    return hits / n


if __name__ == "__main__":
    import json

    from .base import load_model

    model, tokenizer = load_model(Path(sys.argv[1]))
    data = Path(sys.argv[2] if len(sys.argv) > 2 else Path(sys.argv[1]).parent / "data")
    kv = KVSpace.from_dict(json.loads((data / "kv.json").read_text()))
    if "--anchor" in sys.argv:
        print(f"values at the last letters: {value_oracle(model, tokenizer, kv):.2f}, "
              f"other letters blanked: {value_oracle(model, tokenizer, kv, blank_letters=True):.2f}")
        sys.exit()
    for ctx in ("{k}+", "{other}+{k}="):
        print(ctx, "probe", json.dumps(value_probe(model, tokenizer, kv, ctx)))
        print(ctx, "logit lens", json.dumps(logit_lens(model, tokenizer, kv, ctx)))
