"""How much of m_A's knowledge the bridge's fixed value path can carry, before any bridge is trained.

The bridge reads m_A's final state h at the fact ("X was born in" -> h) and adds M h to the anchor (M: the
vocabulary map of calm_core.training.vocab_init, kept fixed). Two ceilings follow, measured here on one split's questions
in the anchor's chat prompt, as m_A reads them:
  m_A     % where m_A's own next token at the fact is the town's first token (what m_A knows, in this text)
  map     % where the anchor's output layer, shown M h alone, ranks the right town first among the towns
  vocab   % where it ranks the right town's first token first in the whole vocabulary
A bridge that attends perfectly still cannot beat `map`. World 0, shipped adapter, development people: m_A 100%;
map 83.0% at answer share 0.18 (weight 100, the earlier runs), 100% at 0.7 (the default since the eighth session).

    python -m demos.real_knowledge.read_ceiling presets/real_knowledge/adapter --split dev --shares 0.18 0.7
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from calm_core import load_causal_lm
from calm_core.models.loading import final_norm
from calm_core.models.real_pair import prepared_pair
from calm_core.training.vocab_init import answer_weights, output_map, shared_tokens

from .bridge_training import load_augment
from .scoring import trained_answer
from .world import fact_position


@torch.no_grad()
def ceilings(adapter: Path, rows: list[dict], compose_answers: list[str], shares: list[float]) -> dict:
    pair = prepared_pair()
    anchor, atok = load_causal_lm(str(pair["smollm2"]))
    m_a, tok = load_augment(adapter, pair["gemma"])
    towns = sorted({r["completion"] for r in rows} | {a.strip() for a in compose_answers})
    first_a = torch.tensor([atok(" " + t, add_special_tokens=False)["input_ids"][0] for t in towns])
    first_m = torch.tensor([tok(" " + t, add_special_tokens=False)["input_ids"][0] for t in towns])
    gold = torch.tensor([towns.index(r["completion"]) for r in rows])
    states = []
    for i in range(0, len(rows), 20):  # m_A's final state at the fact, (N, D_aug)
        enc = tok([r["prompt"] for r in rows[i:i + 20]], return_offsets_mapping=True, padding=True, return_tensors="pt")
        out = m_a(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_hidden_states=True)
        for j, r in enumerate(rows[i:i + 20]):
            offsets = [tuple(o) for o, keep in zip(enc["offset_mapping"][j].tolist(), enc["attention_mask"][j]) if keep]
            first = int((enc["attention_mask"][j] == 0).sum()) if tok.padding_side == "left" else 0
            states.append(out.hidden_states[-1][j, first + fact_position(r["prompt"], offsets)])
    H = torch.stack(states).float()
    U = m_a.get_output_embeddings().weight.float()
    pct = lambda hits: round(100.0 * hits.float().mean().item(), 1)  # noqa: E731
    result = {"rows": len(rows), "m_A": pct((H @ U[first_m].T).argmax(1) == gold)}
    A = anchor.get_output_embeddings().weight.float() * final_norm(anchor).weight.float()[None]  # SmolLM2: RMSNorm g
    pairs = shared_tokens(atok, tok)
    for share in shares:
        w = answer_weights(pairs, atok, compose_answers, None, share)
        X = H @ output_map(A, U, pairs, w).T  # (N, D_anchor): M h
        result[f"share {share}"] = {
            "answer_weight": round(float(w.max()), 1),
            "map": pct((X @ A[first_a].T).argmax(1) == gold),
            "vocab": pct((X @ A.T).argmax(1) == first_a[gold])}
    return result


def main(argv=None) -> None:
    from .pipeline import make_data, make_world
    from .settings import Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapter")
    ap.add_argument("--seed", type=int, default=0, help="the world the adapter was trained on")
    ap.add_argument("--split", default="dev", choices=["dev", "test"])
    ap.add_argument("--shares", type=float, nargs="+", default=[0.18, 0.7])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # a diagnostic: leaves the other core to whatever trains
    from calm_core.models.loading import load_tokenizer

    s = Settings(seed=args.seed)
    pair = prepared_pair()
    atok = load_tokenizer(str(pair["smollm2"]))
    data = make_data(s, make_world(s, atok, load_tokenizer(str(pair["gemma"]))), atok)
    answers = [trained_answer(r["completion"]) for r in data["questions"]]  # as train_bridge weights them
    print(json.dumps(ceilings(Path(args.adapter), data[args.split], answers, args.shares), indent=1))


if __name__ == "__main__":
    main()
