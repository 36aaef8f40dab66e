"""Start a bridge's value path as a translation between the two models' output vocabularies.

A bridge block that reads an augmenting model's *final* hidden state h (after its final norm) reads what that
model is about to say: its next-token logits are U_aug h. Where the two tokenizers share token strings (" Paris",
"ing", ...), there is a linear map M from that space to the anchor's: the one with E_anchor M ~ U_aug over the
shared rows, so that the anchor's output layer, shown M h, scores each shared token as the augmenting model does.

`init_value_path` writes M into each such block (projection = M, value and output projections = identity), so a
bridge starts able to carry "the augmenting model would say X here" to "say X". Only the value path is set: the
gates stay at 0 (the composition still starts exactly equal to the anchor), and where to attend (queries, keys,
recency biases) is still learned. Why: with a random value path, attention and value map must be found together
from scratch, and a bridge on a few hundred examples learns both slowly (demos/real_knowledge/README.md).

    calm = ComposedLM(anchor, [augment], CALMConfig(augment_layers=[depth, depth], relative=True))
    report = init_value_path(calm, answers=[" Paris", " Rome"])   # weight the tokens the answers use
"""
from __future__ import annotations

import weakref

import torch

from ..errors import CALMError
from ..models.loading import final_norm

_shared: dict[tuple[int, int], tuple] = {}


def shared_tokens(anchor_tokenizer, augment_tokenizer) -> list[tuple[int, int]]:
    """(anchor id, augment id) pairs whose decoded strings are identical and not special or blank.

    Decoding every token of a 262k vocabulary takes seconds; the pairs are kept per pair of tokenizer objects
    (loaded tokenizers are shared, calm_core.models.loading.load_tokenizer) while both are alive."""
    key = (id(anchor_tokenizer), id(augment_tokenizer))
    kept = _shared.get(key)
    if kept and kept[0]() is anchor_tokenizer and kept[1]() is augment_tokenizer and kept[2] == _sizes(
            anchor_tokenizer, augment_tokenizer):
        return list(kept[3])
    pairs = _decode_shared(anchor_tokenizer, augment_tokenizer)
    try:
        _shared[key] = (weakref.ref(anchor_tokenizer), weakref.ref(augment_tokenizer),
                        _sizes(anchor_tokenizer, augment_tokenizer), tuple(pairs))
    except TypeError:  # an object without weak references is simply not kept
        pass
    return pairs


def _sizes(*tokenizers) -> tuple[int, ...]:
    return tuple(len(t) for t in tokenizers)  # tokens added since would change the pairs


def _decode_shared(anchor_tokenizer, augment_tokenizer) -> list[tuple[int, int]]:
    augment_ids: dict[str, int] = {}
    special = set(augment_tokenizer.all_special_ids)
    for i in range(len(augment_tokenizer)):
        if i not in special:
            augment_ids.setdefault(augment_tokenizer.decode([i]), i)
    special = set(anchor_tokenizer.all_special_ids)
    pairs = []
    for i in range(len(anchor_tokenizer)):
        text = anchor_tokenizer.decode([i])
        if i not in special and text.strip() and text in augment_ids:
            pairs.append((i, augment_ids[text]))
    return pairs


def output_map(anchor_out: torch.Tensor, augment_out: torch.Tensor, pairs: list[tuple[int, int]],
               weights: torch.Tensor | None = None, ridge: float = 1e-3) -> torch.Tensor:
    """M (D_anchor, D_aug) minimising sum_pairs w * ||E_anchor[a] M - U_aug[b]||^2 + ridge * ||M||^2.

    anchor_out: the anchor's output embeddings (V_anchor, D_anchor); augment_out: (V_aug, D_aug)."""
    if not pairs:
        raise CALMError("The two tokenizers share no token strings: a vocabulary-initialised value path needs some.")
    a = torch.tensor([p[0] for p in pairs])
    b = torch.tensor([p[1] for p in pairs])
    X, Y = anchor_out[a].double(), augment_out[b].double()  # (N, D_anchor), (N, D_aug)
    w = torch.ones(len(pairs), dtype=torch.float64) if weights is None else weights.double()
    gram = X.T @ (w[:, None] * X)
    gram += ridge * gram.diagonal().mean() * torch.eye(X.shape[1], dtype=torch.float64)
    return torch.linalg.solve(gram, X.T @ (w[:, None] * Y)).float()  # (D_anchor, D_aug)


def answer_weights(pairs, anchor_tokenizer, answers, weight: float | None, share: float) -> torch.Tensor:
    """A weight for the shared pairs whose anchor token occurs in the answers' tokenizations, 1 for the others:
    `weight` where given, else the weight that gives the answer tokens `share` of the fit's total weight."""
    used = set()
    for text in answers:
        used.update(anchor_tokenizer(text, add_special_tokens=False)["input_ids"])
    hit = torch.tensor([a in used for a, _ in pairs])
    if weight is None:
        if not 0.0 < share < 1.0:
            raise CALMError(f"answer_share must lie strictly between 0 and 1, not {share}.")
        weight = share / (1.0 - share) * max(1, int((~hit).sum())) / max(1, int(hit.sum()))
    return torch.where(hit, torch.tensor(float(weight)), torch.tensor(1.0))


@torch.no_grad()
def init_value_path(calm, answers: list[str] = (), answer_share: float = 0.7, answer_weight: float | None = None,
                    ridge: float = 1e-3) -> dict:
    """Write the vocabulary map into every block that reads an augmenting model's final state.

    answers: texts the composition will be trained to write (its completions): the shared tokens they use carry
    `answer_share` of the fit's weight (or each `answer_weight`, where given), so the map is most exact where it
    matters. Why a share: a hundred answer tokens among 46K shared ones at weight 100 hold a fifth of the fit,
    and the map then ranked the right town first among 40 for 84% of m_A's states where m_A itself did for
    99.7%; at a 0.7 share (weight ~1000) the map does for 99.7% (demos/real_knowledge/README.md).
    Returns, per augmenting model, the number of shared tokens, how many were weighted and with what weight,
    the blocks set, and the fit's relative residual over all shared tokens and over the answer tokens."""
    anchor = calm.anchor
    norm = final_norm(anchor.model)
    norm_weight = getattr(norm, "weight", None)
    if norm_weight is not None and type(norm).__name__.startswith("Gemma"):  # Gemma's RMSNorm scales by 1 + weight
        norm_weight = 1.0 + norm_weight
    anchor_out = anchor.model.get_output_embeddings().weight.float()
    if norm_weight is not None:  # logits = (E * g) (x / rms(x)): fit against the output layer as the norm feeds it
        anchor_out = anchor_out * norm_weight.float()[None]
    report = []
    for member, augment_bridge in zip(calm.augments, calm.bridge.augments):
        blocks = [blk for blk, layer in zip(augment_bridge.blocks, augment_bridge.augment_layers)
                  if layer == member.info.num_layers]
        if not blocks:
            raise CALMError("init_value_path sets blocks that read an augmenting model's final state (augment layer "
                            f"{member.info.num_layers} here); this composition reads layers {augment_bridge.augment_layers}.")
        pairs = shared_tokens(anchor.tokenizer, member.tokenizer)
        weights = answer_weights(pairs, anchor.tokenizer, answers, answer_weight, answer_share)
        augment_out = member.model.get_output_embeddings().weight.float()
        M = output_map(anchor_out, augment_out, pairs, weights, ridge)  # (D_anchor, D_aug)
        a = torch.tensor([p[0] for p in pairs]); b = torch.tensor([p[1] for p in pairs])
        error = anchor_out[a] @ M - augment_out[b]  # (N, D_aug)
        residual = (error.norm() / augment_out[b].norm()).item()
        hit = weights > 1
        answer_residual = (error[hit].norm() / augment_out[b][hit].norm()).item() if hit.any() else None
        for block in blocks:
            _write(block, M)
        report.append({"shared_tokens": len(pairs), "weighted": int(hit.sum()),
                       "answer_weight": round(float(weights.max()), 2) if hit.any() else None, "blocks": len(blocks),
                       "relative_residual": round(residual, 4),
                       "answer_residual": None if answer_residual is None else round(answer_residual, 4)})
    return {"augments": report}


def _write(block, M: torch.Tensor) -> None:
    """projection = M (after the block's LayerNorm, which starts as the identity up to scale), value and
    output = identity: each head then carries its slice of M h. The gate is left as it is (0 at the start)."""
    if block.proj.weight.shape != M.shape:
        raise CALMError(f"Block projection {tuple(block.proj.weight.shape)} does not match the map {tuple(M.shape)}.")
    scale = M.norm(dim=1).mean()  # keep the projection's rows at unit size: the gate learns the magnitude
    block.proj.weight.copy_((M / scale).to(block.proj.weight.dtype))
    block.proj.bias.zero_()
    for linear in (block.v, block.o):
        linear.weight.copy_(torch.eye(linear.weight.shape[0], dtype=linear.weight.dtype))
