"""What the frozen models compute for a training example, computed once and reused every epoch.

Three things depend on the text alone: the augmenting models' states at their composition layers, the
anchor's states below the first layer the bridge writes into (anchor_prefix.py), and, for rows trained
toward the anchor alone (Example.keep_anchor), the anchor's own next-token log-probabilities at their
targets. With all stored, a training step runs only the anchor above the bridge, the bridge and the loss.
States are computed in fixed-order chunks of rows, so their values never depend on which batch
first needed them (a resumed run matches an uninterrupted one).

Rows that all open alike (a chat template's system turn: 24 of SmolLM2's 62 tokens a row on the real preset, 39 of
Gemma's 88) have that opening computed once, with its keys and values kept: every chunk continues from a copy
(shared_opening.py). The states are those of a whole-row forward, to float rounding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.anchor_prefix import prefix_depth, prefix_states
from .batches import collate, predicting_mask
from .shared_opening import Opening, usable_length

CHUNK = 64  # rows computed together


def bytes_per_token(calm) -> int:
    """Stored float32 bytes per token, counting an anchor token and an augmenting token alike (an estimate)."""
    augment = sum(member.info.width * _layers(bridge) * 4 for member, bridge in zip(calm.augments, calm.bridge.augments))
    return augment + (calm.anchor.info.width * 4 if prefix_depth(calm) else 0)


def cache_bytes(calm, rows, reference_bytes: int = 4) -> int:
    """What storing every row's frozen states takes (float32 states; keep_anchor rows' reference
    log-probabilities over the whole vocabulary at reference_bytes a number)."""
    augment = sum(member.info.width * _layers(bridge) * 4 * sum(len(row.augment_ids[k]) for row in rows)
                  for k, (member, bridge) in enumerate(zip(calm.augments, calm.bridge.augments)))
    anchor = calm.anchor.info.width * 4 * sum(len(row.anchor_ids) for row in rows) if prefix_depth(calm) else 0
    kept = sum(row.num_targets for row in rows if row.keep_anchor)
    return augment + anchor + references_bytes(calm, kept, reference_bytes)


def opening_note(calm, rows) -> str:
    """What the rows' shared opening saves, for a run's message ("" where it is not used)."""
    many = len(calm.augments) > 1
    counts = [("the anchor", usable_length(calm.anchor.model, [r.anchor_ids for r in rows]) if prefix_depth(calm) else 0)]
    counts += [(f"augmenting model {k + 1}" if many else "the augmenting model",
                usable_length(member.model, [r.augment_ids[k] for r in rows])) for k, member in enumerate(calm.augments)]
    said = [f"{n} tokens for {who}" for who, n in counts if n]
    return f"; the opening every row shares is run once ({', '.join(said)})" if said else ""


def _layers(bridge) -> int:
    """Distinct augmenting layers a model's blocks read: each is stored once."""
    return len(set(bridge.augment_layers))


def references_bytes(calm, targets: int, reference_bytes: int = 4) -> int:
    """The anchor alone's log-probabilities over its whole vocabulary at `targets` keep_anchor target tokens."""
    return targets * _vocab(calm) * reference_bytes


def _vocab(calm) -> int:
    return calm.anchor.model.get_output_embeddings().weight.shape[0]


class FrozenStates:
    """Per-chunk stored states of the training rows; batch() returns them for a list of row indices."""

    def __init__(self, calm, rows, reference_dtype: torch.dtype = torch.float32, bf16: bool = False):
        self.calm, self.rows, self.chunks = calm, rows, {}
        self.with_prefix = prefix_depth(calm) > 0
        self.reference_dtype = reference_dtype
        self.bf16 = bf16  # computed as a bf16 training step computes them uncached (autocast): half the time on a CPU
        # chunks of rows of similar length (a chunk is padded to its longest row: mixed lengths waste most of the
        # fill on padding); the order depends on the rows alone, so a resumed run fills the same chunks
        order = sorted(range(len(rows)), key=lambda i: (sum(len(ids) for ids in rows[i].augment_ids)
                                                         + len(rows[i].anchor_ids), i))
        self.members = [order[c:c + CHUNK] for c in range(0, len(order), CHUNK)]  # chunk -> its row indices
        self.place = {i: (c, j) for c, members in enumerate(self.members) for j, i in enumerate(members)}
        self.openings = {}  # "anchor" / augmenting model k -> its Opening: computed with the first chunk

    def _opening(self, key, model, ids_of, run) -> Opening | None:
        """The rows' shared opening through `model` (ids_of(row): its tokens there), computed once."""
        if key not in self.openings:
            self.openings[key] = Opening.of(model, [ids_of(row) for row in self.rows], run)
        return self.openings[key]

    def _compute(self, chunk: int) -> dict:
        device = next(self.calm.anchor.model.parameters()).device.type
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=self.bf16):
            return self._compute_chunk(chunk)

    def _compute_chunk(self, chunk: int) -> dict:
        batch, _ = collate(self.calm, [self.rows[i] for i in self.members[chunk]])
        augments = []
        for k, enc in enumerate(batch.augments):
            run = lambda ids, mask, cache=None, k=k: self.calm.augment_states(k, ids, mask, cache=cache)
            opening = self._opening(k, self.calm.augments[k].model, lambda row, k=k: row.augment_ids[k], run)
            augments.append(_stored(opening.states(enc.input_ids, enc.attention_mask) if opening
                                    else run(enc.input_ids, enc.attention_mask)))
        prefix = None
        if self.with_prefix:
            run = lambda ids, mask, cache=None: [prefix_states(self.calm, ids, mask, cache=cache)]
            opening = self._opening("anchor", self.calm.anchor.model, lambda row: row.anchor_ids, run)
            ids, mask = batch.anchor.input_ids, batch.anchor.attention_mask
            prefix = (opening.states(ids, mask) if opening else run(ids, mask))[0].float().cpu()
        return {"augments": augments, "prefix": prefix, "references": self._references(chunk)}

    @torch.no_grad()
    def _references(self, chunk: int) -> dict[int, torch.Tensor]:
        """{row index: (targets, V) the anchor alone's log-probabilities at its targets} for keep_anchor rows."""
        kept = [i for i in self.members[chunk] if self.rows[i].keep_anchor]
        if not kept:
            return {}
        batch, labels = collate(self.calm, [self.rows[i] for i in kept])
        positions = predicting_mask(labels)
        with self.calm.gate_scale(0.0):
            logits = self.calm.forward(batch, positions=positions)  # (N, V), row by row
        per_row = torch.log_softmax(logits.float(), -1).to(self.reference_dtype).cpu().split(positions.sum(1).tolist())
        return dict(zip(kept, per_row))

    def fill(self, progress=None, stop=None, bar: bool = False) -> bool:
        """Compute every chunk now, calling progress(rows done, rows, what) after each (or, with bar, showing a
        progress bar in the terminal); False when `stop` (an Event) was set between chunks."""
        from tqdm.auto import tqdm

        shown, done = tqdm(total=len(self.rows), desc="frozen states", unit="row", disable=not bar), 0
        try:
            for chunk, members in enumerate(self.members):
                if stop is not None and stop.is_set():
                    return False
                if chunk not in self.chunks:
                    self.chunks[chunk] = self._compute(chunk)
                done += len(members)
                shown.update(len(members))
                if progress is not None:
                    progress(done, len(self.rows), "the frozen models' states")
            return True
        finally:
            shown.close()

    def references(self, indices: list[int]) -> list[torch.Tensor]:
        """The keep_anchor rows' stored reference log-probabilities, in the order of indices (call batch() first)."""
        return [self.chunks[self.place[i][0]]["references"][i] for i in indices if self.rows[i].keep_anchor]

    def batch(self, indices: list[int]) -> tuple[list[list[torch.Tensor]], torch.Tensor | None]:
        """(augmenting states per model and composition layer, anchor prefix states or None), each
        row cut or zero-padded to this batch's longest (a chunk is padded to its own longest row)."""
        for chunk in sorted({self.place[i][0] for i in indices}):
            if chunk not in self.chunks:
                self.chunks[chunk] = self._compute(chunk)
        part = lambda i: self.chunks[self.place[i][0]]
        slot = lambda i: self.place[i][1]
        augments = []
        for k in range(len(self.calm.augments)):
            length = max(len(self.rows[i].augment_ids[k]) for i in indices)
            augments.append([_stack([part(i)["augments"][k][layer][slot(i)] for i in indices], length)
                             for layer in range(len(self.calm.bridge.augments[k].pairs))])
        prefix = None
        if self.with_prefix:
            length = max(len(self.rows[i].anchor_ids) for i in indices)
            prefix = _stack([part(i)["prefix"][slot(i)] for i in indices], length)
        return augments, prefix


def _stored(states: list[torch.Tensor]) -> list[torch.Tensor]:
    """float32 CPU copies, one per distinct layer: blocks that read the same augmenting layer share it."""
    kept: dict[int, torch.Tensor] = {}
    return [kept.setdefault(id(s), s.detach().float().cpu()) for s in states]


def _stack(pieces: list[torch.Tensor], length: int) -> torch.Tensor:
    return torch.stack([F.pad(p[:length], (0, 0, 0, length - min(len(p), length))) for p in pieces])


def free_memory_bytes(device) -> int:
    """Memory free where the cache would live: the GPU's for a GPU run, else the machine's."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)
