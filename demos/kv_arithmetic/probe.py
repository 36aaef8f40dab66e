"""A linear probe: how readable is a key's value in m_A's hidden states right after the key?

Ridge-regression one-hot probes per digit, fitted on the composition (train) keys and scored on
held-out keys, for each layer: this is what the bridge has to work with, since it is trained on
the train keys only. python -m demos.kv_arithmetic.probe MODEL_DIR [DATA_DIR]
"""
from __future__ import annotations

import random
import sys

import torch
from pathlib import Path

from .base import hidden_at, probe_digits
from .data import KVSpace


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
        ids = torch.tensor([[tokenizer.bos_token_id] + [vocab[c] for c in text]])
        top = int(model(input_ids=ids).logits[0, pos + 1, digit_ids].argmax())
        v = kv.values[k]
        hits["first"] += top == int(str(v)[0])
        hits["units"] += top == v % 10
        hits["tens"] += top == v // 10 % 10
    return {name: n / len(kv.heldout_keys) for name, n in hits.items()}


if __name__ == "__main__":
    import json

    from transformers import AutoModelForCausalLM

    from .base import make_tokenizer

    model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
    data = Path(sys.argv[2] if len(sys.argv) > 2 else Path(sys.argv[1]).parent / "data")
    kv = KVSpace.from_dict(json.loads((data / "kv.json").read_text()))
    for ctx in ("{k}+", "{other}+{k}="):
        print(ctx, "probe", json.dumps(value_probe(model, make_tokenizer(), kv, ctx)))
        print(ctx, "logit lens", json.dumps(logit_lens(model, make_tokenizer(), kv, ctx)))
