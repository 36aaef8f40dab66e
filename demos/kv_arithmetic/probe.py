"""A linear probe: how readable is a key's value in m_A's hidden states right after the key?

Ridge-regression one-hot probes per digit, fitted on the composition (train) keys and scored on
held-out keys, for each layer: this is what the bridge has to work with, since it is trained on
the train keys only. python -m demos.kv_arithmetic.probe MODEL_DIR [DATA_DIR]

And activation patching of the anchor (`--anchor`): ideal states written at the operators.
python -m demos.kv_arithmetic.probe presets/kv_arithmetic/anchor presets/kv_arithmetic/data --anchor
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


@torch.no_grad()
def operator_patching(anchor, tokenizer, kv: KVSpace, layer: int, n: int = 60, last_letters: bool = False,
                      seed: int = 0) -> float:
    """Can the anchor compute KV-MATH at all when handed ideal states? For "k1+k2=" take the anchor's
    own states after `layer` at the operators of the matching "v1+v2=" and write them over its
    states at "k1+k2="'s operators (and its last digits over the keys' last letters with
    last_letters), at every step of greedy decoding: the share answered right bounds what a
    bridge writing only there can do."""
    from calm_core.models import decoder_layers

    from .base import greedy

    rng, keys, block = random.Random(seed), list(kv.values), decoder_layers(anchor)[layer]
    vocab = tokenizer.get_vocab()
    hits = 0
    for _ in range(n):
        k1, k2, op = rng.choice(keys), rng.choice(keys), rng.choice("+-")
        v1, v2 = kv.values[k1], kv.values[k2]
        source, target = f"{v1}{op}{v2}=", f"{k1}{op}{k2}="
        captured = {}
        handle = block.register_forward_hook(lambda m, a, o: captured.setdefault("h", o[0] if isinstance(o, tuple) else o))
        try:
            anchor(input_ids=torch.tensor([[tokenizer.bos_token_id] + [vocab[c] for c in source]]))
        finally:
            handle.remove()
        pairs = [(len(k1), len(str(v1))), (len(target) - 1, len(source) - 1)]  # (target, source) operator positions
        if last_letters:
            pairs += [(t - 1, s - 1) for t, s in pairs]  # last letter <- last digit
        states = {t + 1: captured["h"][0, s + 1] for t, s in pairs}  # +1: BOS

        def patch(module, args, output):
            hidden = (output[0] if isinstance(output, tuple) else output).clone()
            for pos, state in states.items():
                hidden[:, pos] = state
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        handle = block.register_forward_hook(patch, prepend=True)
        try:
            answer = greedy(anchor, tokenizer, [target], max_new_tokens=6)[0]
        finally:
            handle.remove()
        hits += answer == str(v1 + v2 if op == "+" else v1 - v2)
    return hits / n


if __name__ == "__main__":
    import json

    from transformers import AutoModelForCausalLM

    from .base import make_tokenizer

    model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
    data = Path(sys.argv[2] if len(sys.argv) > 2 else Path(sys.argv[1]).parent / "data")
    kv = KVSpace.from_dict(json.loads((data / "kv.json").read_text()))
    if "--anchor" in sys.argv:
        for layer in range(model.config.num_hidden_layers):
            print(f"layer {layer}: operators {operator_patching(model, make_tokenizer(), kv, layer):.2f}, "
                  f"+ last letters {operator_patching(model, make_tokenizer(), kv, layer, last_letters=True):.2f}")
        sys.exit()
    for ctx in ("{k}+", "{other}+{k}="):
        print(ctx, "probe", json.dumps(value_probe(model, make_tokenizer(), kv, ctx)))
        print(ctx, "logit lens", json.dumps(logit_lens(model, make_tokenizer(), kv, ctx)))
