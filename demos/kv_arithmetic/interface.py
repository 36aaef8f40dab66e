"""Research tool: teach the anchor to take an operand's value as a vector where the operand ends.

Activation patching (probe.py) showed why bridges fail on KV-MATH: the trained anchor reads an
operand's digits at the digit positions, which in `k1+k2=` lie inside a key, before m_A can know
the value. This fine-tunes the anchor (never on a key of D_KV) so that its arithmetic also works
when an operand is an unknown name and its value arrives, added after decoder layer `layer`, at
the character that ends the operand (the operator or "="), where m_A holds a key's value:

- interchange training (Geiger et al.'s interchange interventions): run the anchor on `95+22=`
  (the donor, trained on its answer as NUM-MATH), add its own states at the operator positions
  to the run on `qw+22=` (the recipient, unknown name) and train the recipient on `117`;
- digit codes (`--codes`): add a learned sum of three digit embeddings instead (what a linear
  bridge can produce from m_A, whose value heads make digits linearly readable), started at the
  least-squares fit of the anchor's own states; `--anneal` moves from donor states to codes,
  `--aux` pulls the donor's own states towards the codes.

The "oracle" accuracy is the recipient's exact match (teacher forced): what an ideal bridge
writing there could reach. Measured (see README): interchange 2% -> 75% in 800 steps of 128, but a
linear map from m_A's states to those donor states does not generalise (held-out R^2 0.63 even
fitted on all keys); digit codes, which a linear bridge can reach, plateau at 11-15%.

    python -m demos.kv_arithmetic.interface presets/kv_arithmetic OUT [--codes --anneal 0.5 --aux 0.5]
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import data as D
from .base import add_settings_arguments, apply_arguments, lr_at

PLACES_CODES = 30  # hundreds, tens, units: ten embeddings each


@dataclass
class InterfaceSettings:
    layer: int = 1  # the values arrive after this decoder layer (the bridge's anchor layer)
    steps: int = 800
    batch: int = 128
    lr: float = 1e-3
    named: float = 0.9  # share of pairs whose recipient has at least one unknown name
    max_value: int = 200
    codes: bool = False
    code_lr: float = 3e-3
    anneal: float = 0.0  # share of the steps over which donor states give way to codes
    aux: float = 0.0  # weight of the pull of the donor's states towards the codes
    seed: int = 0
    threads: int = 1
    # the bridge trained afterwards on the preset's composition data
    compose_augment_layers: list[int] = field(default_factory=lambda: [2])
    compose_steps: int = 1500
    gate: str = "none"


def digit_ids(value: int) -> list[int]:
    return [value // 100 % 10, 10 + value // 10 % 10, 20 + value % 10]


def interchange_pair(rng: random.Random, max_value: int, forbidden: set[str], named: bool = True):
    """(donor, recipient, answer, [(recipient position, donor position, value)]): positions are
    character indices of the operators that end each named operand."""
    nums = [rng.randint(1, max_value) for _ in range(2)]
    ops = [rng.choice("+-")]
    donor, recipient, pairs = "", "", []
    for i, (x, after) in enumerate(zip(nums, ops + ["="])):
        donor += str(x) + after
        if named and (rng.random() < 0.5 or (i == 1 and not pairs)):
            while (name := D.random_key(rng)) in forbidden:
                pass
            recipient += name + after
            pairs.append((len(recipient) - 1, len(donor) - 1, x))
        else:
            recipient += str(x) + after
    return donor, recipient, str(D.evaluate(nums, ops)), pairs


class AnchorInterface:
    """The anchor, the layer where values arrive, and the optional digit codes."""

    def __init__(self, anchor, tokenizer, s: InterfaceSettings):
        from calm_core.models import decoder_layers

        self.model, self.tok, self.s = anchor, tokenizer, s
        self.block = decoder_layers(anchor)[s.layer]
        self.vocab = tokenizer.get_vocab()
        self.codes = self._fitted_codes() if s.codes else None
        self.alpha = 0.0  # weight of the donor states against the codes
        self.aux = torch.zeros(())

    def encode(self, rows: list[tuple[str, str]]):
        """(ids, mask, labels) right-padded, loss on the answer and EOS."""
        ids = [[self.tok.bos_token_id] + [self.vocab[c] for c in p + a] + [self.tok.eos_token_id] for p, a in rows]
        T = max(map(len, ids))
        I = torch.full((len(ids), T), self.tok.pad_token_id)
        M, L = torch.zeros_like(I), torch.full_like(I, -100)
        for i, ((p, _), r) in enumerate(zip(rows, ids)):
            I[i, :len(r)], M[i, :len(r)] = torch.tensor(r), 1
            L[i, 1 + len(p):len(r)] = torch.tensor(r[1 + len(p):])
        return I, M, L

    @torch.no_grad()
    def _fitted_codes(self, n: int = 600) -> torch.nn.Embedding:
        """Digit codes whose sum is the least-squares fit of the anchor's own operator states."""
        rng, feats, states = random.Random(self.s.seed + 5), [], []
        for _ in range(n):
            v1, v2, op = rng.randint(1, self.s.max_value), rng.randint(1, self.s.max_value), rng.choice("+-")
            ids, _, _ = self.encode([(f"{v1}{op}{v2}=", "")])
            hidden = self.model(input_ids=ids, output_hidden_states=True).hidden_states[self.s.layer + 1][0]
            for v, pos in ((v1, len(str(v1)) + 1), (v2, len(str(v1)) + len(str(v2)) + 2)):
                f = torch.zeros(PLACES_CODES)
                f[digit_ids(v)] = 1
                feats.append(f)
                states.append(hidden[pos])
        codes = torch.nn.Embedding(PLACES_CODES, states[0].shape[-1])
        codes.weight.data.copy_(torch.linalg.lstsq(torch.stack(feats), torch.stack(states)).solution)
        return codes

    def run(self, batch: list):
        """Donor forward (its states captured after the layer), recipient forward (values added
        at its operators). Returns both model outputs and both label tensors."""
        dI, dM, dL = self.encode([(d, a) for d, _, a, _ in batch])
        rI, rM, rL = self.encode([(r, a) for _, r, a, _ in batch])
        captured = {}
        handle = self.block.register_forward_hook(
            lambda m, a, o: captured.setdefault("h", o[0] if isinstance(o, tuple) else o))
        try:
            donor = self.model(input_ids=dI, attention_mask=dM, labels=dL)
        finally:
            handle.remove()
        where = [(b, rp + 1, dp + 1, digit_ids(x)) for b, (*_, pairs) in enumerate(batch) for rp, dp, x in pairs]
        b, rpos, dpos, digits = (torch.tensor(c) for c in zip(*where)) if where else (None,) * 4

        def add_values(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if b is None:
                return output
            source = captured["h"][b, dpos]
            values = source
            if self.codes is not None:
                code = self.codes(digits).sum(1)
                values = code if self.alpha <= 0 else self.alpha * source + (1 - self.alpha) * code
                self.aux = (source - code).pow(2).sum(-1).mean() / source.detach().var(0).sum().clamp(min=1e-6)
            hidden = hidden.index_put((b, rpos), values, accumulate=True)
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        handle = self.block.register_forward_hook(add_values, prepend=True)
        try:
            recipient = self.model(input_ids=rI, attention_mask=rM, labels=rL)
        finally:
            handle.remove()
        return donor, recipient, dL, rL

    @torch.no_grad()
    def accuracy(self, forbidden: set[str], n: int = 400, seed: int = 123, alpha: float = 0.0) -> dict:
        """Teacher-forced exact match of the donors (NUM-MATH) and of the recipients (the oracle)."""
        def exact(logits, labels):
            ok = (logits[:, :-1].argmax(-1) == labels[:, 1:]) | (labels[:, 1:] == -100)
            return float(ok.all(1).float().mean())

        rng, saved = random.Random(seed), self.alpha
        self.alpha = alpha
        try:
            self.model.eval()
            donor, recipient, dL, rL = self.run([interchange_pair(rng, self.s.max_value, forbidden) for _ in range(n)])
        finally:
            self.alpha = saved
        return {"num_math": exact(donor.logits, dL), "oracle": exact(recipient.logits, rL)}

    def train(self, forbidden: set[str], log=print) -> list[dict]:
        s, params = self.s, list(self.model.parameters())
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.98), weight_decay=0.1)
        opt_codes = torch.optim.Adam(self.codes.parameters(), lr=s.code_lr) if self.codes is not None else None
        rng, history, t0 = random.Random(s.seed), [], time.perf_counter()
        try:
            for step in range(s.steps):
                self.model.train()
                batch = [interchange_pair(rng, s.max_value, forbidden, named=rng.random() < s.named) for _ in range(s.batch)]
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, s.steps, s.lr, 30)
                self.alpha = max(0.0, 1 - step / (s.anneal * s.steps)) if s.codes and s.anneal > 0 else 0.0
                donor, recipient, _, _ = self.run(batch)
                loss = donor.loss + recipient.loss + (s.aux * self.aux if self.codes is not None else 0.0)
                opt.zero_grad(set_to_none=True)
                if opt_codes is not None:
                    opt_codes.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                if opt_codes is not None:
                    opt_codes.step()
                if (step + 1) % max(1, s.steps // 8) == 0 or step + 1 == s.steps:
                    rec = {"step": step + 1, "alpha": self.alpha, "donor_loss": float(donor.loss.detach()),
                           "recipient_loss": float(recipient.loss.detach()), **self.accuracy(forbidden),
                           "seconds": time.perf_counter() - t0}
                    history.append(rec)
                    log(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
        finally:
            self.model.eval()
            for p in params:
                p.requires_grad_(False)
        return history


def main(argv=None) -> None:
    from .base import load_model, log, save_model
    from .pipeline import ROW_FILES, Settings, accuracy, compose

    p = argparse.ArgumentParser(prog="python -m demos.kv_arithmetic.interface", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", help="a KV preset folder (anchor/, augment/, data/)")
    p.add_argument("out")
    add_settings_arguments(p, InterfaceSettings)
    args = p.parse_args(argv)
    s = apply_arguments(InterfaceSettings(), args)
    torch.set_num_threads(s.threads)
    root, out = Path(args.preset), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kv = D.KVSpace.from_dict(json.loads((root / "data" / "kv.json").read_text()))
    anchor, tok = load_model(root / "anchor")
    interface = AnchorInterface(anchor, tok, s)
    forbidden = set(kv.values)
    log(f"before: {interface.accuracy(forbidden)}; donor states: {interface.accuracy(forbidden, alpha=1.0)}")
    history = interface.train(forbidden, log=log)
    save_model(anchor, tok, out / "anchor")
    read = lambda name: [(r["prompt"], r["completion"]) for r in map(json.loads, (root / "data" / f"{name}.jsonl").read_text().splitlines())]
    files = {n: read(n) for n in ("composition_train", "composition_validation", *ROW_FILES.values())}
    augment, _ = load_model(root / "augment")
    calm, info = compose(Settings(compose_anchor_layers=[s.layer], compose_augment_layers=s.compose_augment_layers,
                                  gate=s.gate, compose_steps=s.compose_steps), anchor, augment, tok, files, out / "bridge")
    table = {row: accuracy(calm, None, files[name][:150], 8) for row, name in ROW_FILES.items()}
    log(f"CALM: {table}")
    (out / "interface.json").write_text(json.dumps({"settings": asdict(s), "history": history, "calm": table,
                                                    "compose_seconds": info["seconds"]}, indent=2))


if __name__ == "__main__":
    main()
