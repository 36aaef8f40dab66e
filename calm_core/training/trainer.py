"""Training the bridge: AdamW on the bridge only, warmup + cosine, clipping, accumulation,
live metrics, stop on request, atomic bridge-only checkpoints and exact resume.

The frozen augmenting models never change, so their hidden states at the composition layers
are computed once per example and reused across epochs when they fit the memory budget.
Under `accelerate launch` each process takes its share of every global batch and the bridge's
gradients are summed across processes, so N processes reproduce one process's run.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Callable

import torch

from ..engine.bridge import noisy_augment_states
from ..errors import CALMError
from . import checkpoints
from .accuracy_probe import AccuracyProbe
from .anchor_targets import row_losses
from .batches import collate, epoch_batch, length_groups, predicting_mask
from .config import TrainConfig, TrainResult, lr_factor, parameter_role  # noqa: F401  (the public names)
from .data import Example
from .distributed import Distributed
from .frozen_cache import FrozenStates, cache_bytes, free_memory_bytes, opening_note
from .fused_loss import cross_entropy_losses, plain_output_layer
from .prepared_rows import PreparedRows

log = logging.getLogger("calm_core.training")


class Trainer:
    cache_budget_name = "cache_budget_mb"  # what the cache note calls the budget (the lab: the memory ledger)

    def __init__(self, calm, train: list[Example], validation: list[Example] | None = None,
                 config: TrainConfig | None = None, callback: Callable[[dict], None] | None = None):
        self.calm, self.config, self.callback = calm, config or TrainConfig(), callback
        if not train:
            raise CALMError("No training examples.")
        self.dist = Distributed()
        self.dist.broadcast_parameters(calm.bridge)
        self.train_rows = PreparedRows(calm, train, self.config.max_length, self.config.append_eos,
                                       None if len(train) <= PREPARE_ALL else LAZY_CHUNKS)
        self.val_rows = PreparedRows(calm, (validation or [])[: self.config.eval_examples],
                                     self.config.max_length, self.config.append_eos)
        scales = {"other": 1.0, "gate": self.config.gate_lr_scale, "position": self.config.position_lr_scale,
                  "value": self.config.value_lr_scale}
        by_role: dict[str, list] = {name: [] for name in scales}
        for name, p in calm.bridge.named_parameters():
            by_role[parameter_role(name)].append(p)
        if scales["value"] == 1.0:  # one group as before (checkpoints keep their optimizer layout)
            by_role["other"] += by_role.pop("value")
        # a group at scale 0 never moves (AdamW's decoupled decay is scaled by lr too) and is left out of clipping
        self._trained = [p for r, ps in by_role.items() if scales[r] > 0 for p in ps]
        groups = [{"params": ps, "lr_scale": scales[r]} for r, ps in by_role.items() if ps or r == "other"]
        self.optimizer = torch.optim.AdamW(groups, lr=self.config.lr, weight_decay=self.config.weight_decay)
        self.step = 0
        self.history: list[dict] = []
        self._stop = threading.Event()
        self._states: FrozenStates | None = None  # the frozen models' states, once per row (cache_augment_states)
        self._val_states: FrozenStates | None = None  # the same for the validation rows
        self._use_cache = False
        self.before_step: Callable[[], object] | None = None  # called before every step (outside its timing)
        self._output = plain_output_layer(calm._anchor_model())  # losses through it in chunks (fused_loss.py), or None
        probe = AccuracyProbe(calm, validation or [], self.config.accuracy_examples, self.config.accuracy_scoring,
                              self.config.accuracy_share) if self.config.accuracy_examples else None
        self.probe = probe if probe and self.dist.rank == 0 and self.dist.world == 1 else None

    @property
    def truncated(self) -> int:
        """Examples cut to the models' context (a small data set is prepared to count them)."""
        self.prepare()
        return self.train_rows.truncated + self.val_rows.truncated

    def prepare(self, progress: Callable[[int, int], None] | None = None) -> bool:
        """Prepare every row of a data set small enough to hold as rows (PREPARE_ALL), chunk by chunk,
        so that a stop request is answered between chunks; a larger one is prepared batch by batch as
        training reaches it. False when stopped."""
        self.val_rows.prepare_all()
        if len(self.train_rows) > PREPARE_ALL:
            return True
        for done in self.train_rows.prepare_chunks():
            if progress is not None:
                progress(done, len(self.train_rows))
            if self._stop.is_set():
                return False
        return True

    # ---- control ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop after the current step; the bridge keeps what it has learned."""
        self._stop.set()

    # ---- data ---------------------------------------------------------------------------------

    def batch_indices(self, step: int) -> list[int]:
        return epoch_batch(len(self.train_rows), self.config.batch_size, self.config.seed, step)

    def _cache_decision(self) -> tuple[bool, str]:
        """Whether to cache the frozen models' states, and why: off silently costs a full forward pass of both
        frozen models every step, so the reason (with sizes) goes into TrainResult.cache_note and the log."""
        cfg = self.config
        if not cfg.cache_augment_states:
            return False, "cache off (cache_augment_states=False): every step runs both frozen models."
        if not self.calm.augments:
            return False, "no augmenting model: nothing to cache."
        if not self.train_rows.complete:
            return False, (f"cache off: {len(self.train_rows)} training examples are prepared batch by batch "
                           f"(over {PREPARE_ALL}), so their states are not held; every step runs both frozen models.")
        need_mb = sum(cache_bytes(self.calm, rows, self._reference_dtype.itemsize)
                      for rows in (self.train_rows, self.val_rows)) / 2**20
        budget, name = cfg.cache_budget_mb, self.cache_budget_name
        if budget is None:
            budget, name = free_memory_bytes(next(self.calm.bridge.parameters()).device) / 2 / 2**20, "half the memory free now"
        if need_mb > budget:
            return False, (f"cache off: the frozen states need {need_mb:,.0f} MB, over {name} ({budget:,.0f} MB); every "
                           f"step runs both frozen models (about {math.ceil(need_mb * 1.1):,} MB would cache them).")
        return True, (f"cache on: the frozen states take {need_mb:,.0f} MB of {name} ({budget:,.0f} MB)"
                      f"{opening_note(self.calm, self.train_rows)}.")

    def _fill(self, progress) -> bool:
        """A run that reaches every row computes their frozen states before its first step, with progress (inside
        the first steps they would stall the page and the time-left estimate); False when stopped."""
        cfg = self.config
        if self.dist.world > 1 or (cfg.steps - self.step) * cfg.batch_size < len(self.train_rows):
            return True  # not every row will be needed (or each process needs its own): as batches reach them
        self._states = self._states or FrozenStates(self.calm, self.train_rows, self._reference_dtype, cfg.bf16)
        return self._states.fill(progress, self._stop, bar=cfg.progress and progress is None)

    @property
    def _reference_dtype(self) -> torch.dtype:
        """How keep_anchor rows' reference log-probabilities are stored: as precise as the steps that use them."""
        return torch.bfloat16 if self.config.bf16 else torch.float32

    # ---- training -----------------------------------------------------------------------------

    def _micro_batches(self, indices: list[int]) -> list[list[int]]:
        """This rank's rows, in at most grad_accum-sized parts, each part run as groups of similar length."""
        mine = indices[self.dist.rank::self.dist.world]
        per = max(1, math.ceil(len(mine) / self.config.grad_accum))
        parts = [mine[i:i + per] for i in range(0, len(mine), per)]
        return [[part[j] for j in group] for part in parts
                for group in length_groups([len(self.train_rows[i].anchor_ids) for i in part])]

    def _train_step(self, use_cache: bool) -> tuple[float, int]:
        """One optimizer step; returns (mean token loss over the global batch, target tokens)."""
        cfg, calm = self.config, self.calm
        indices = self.batch_indices(self.step)
        total = self.dist.sum_(torch.tensor(float(sum(self.train_rows[i].num_targets for i in indices[self.dist.rank::self.dist.world]))))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(())
        # the noise is a function of (seed, step, rank), like the batches, so a resumed run matches
        generator = torch.Generator(self._device_type()).manual_seed(
            (cfg.seed * 1000003 + self.step) * 64 + self.dist.rank) if cfg.augment_noise else None
        for micro in self._micro_batches(indices):
            rows = [self.train_rows[i] for i in micro]
            batch, labels = collate(calm, rows)
            states, prefix, references = None, None, None
            if use_cache:
                self._states = self._states or FrozenStates(calm, self.train_rows, self._reference_dtype, cfg.bf16)
                states, prefix = self._states.batch(micro)
                references = self._states.references(micro)
            with torch.autocast(self._device_type(), dtype=torch.bfloat16, enabled=cfg.bf16), \
                    noisy_augment_states(calm.bridge.blocks(), cfg.augment_noise, generator):
                positions = predicting_mask(labels)  # the output layer at target tokens only
                out = calm.forward(batch, augment_states=states, anchor_prefix=prefix, positions=positions,
                                   hidden_only=self._output is not None, share_opening=True)  # (N, D) or (N, V)
                losses = self._losses(rows, out, labels, positions, prefix, references)
            (losses.sum() / total.clamp(min=1)).backward()
            loss_sum += losses.detach().sum().cpu()
        for p in calm.bridge.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.dist.sum_(p.grad)
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self._trained, cfg.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * group["lr_scale"] * lr_factor(self.step, cfg.warmup_steps, cfg.steps)
        self.optimizer.step()
        self.step += 1
        loss = self.dist.sum_(loss_sum) / total.clamp(min=1)
        return float(loss), int(total)

    def _losses(self, rows, logits, labels, positions, prefix=None, references=None) -> torch.Tensor:
        """Per-token losses: cross-entropy on the text, KL to the anchor alone on keep_anchor rows' targets."""
        return row_losses(self.calm, rows, logits, labels, positions, prefix, references, self.config.bf16, self._output)

    def _device_type(self) -> str:
        return next(self.calm.anchor.model.parameters()).device.type

    @torch.no_grad()
    def validation_loss(self) -> float | None:
        if not self.val_rows:
            return None
        total, count, cfg = 0.0, 0, self.config
        for start in range(0, len(self.val_rows), cfg.batch_size):
            indices = list(range(start, min(start + cfg.batch_size, len(self.val_rows))))
            batch, labels = collate(self.calm, [self.val_rows[i] for i in indices])
            positions, states, prefix = predicting_mask(labels), None, None
            if self._use_cache:  # the validation rows' frozen states too: a check costs the anchor above the bridge
                self._val_states = self._val_states or FrozenStates(self.calm, self.val_rows, self._reference_dtype,
                                                                    cfg.bf16)
                states, prefix = self._val_states.batch(indices)
            with torch.autocast(self._device_type(), dtype=torch.bfloat16, enabled=cfg.bf16):
                out = self.calm.forward(batch, augment_states=states, anchor_prefix=prefix, positions=positions,
                                        hidden_only=self._output is not None, share_opening=True)
                losses = cross_entropy_losses(out, labels, positions, self._output)  # keep_anchor rows on their text too
            total, count = total + float(losses.sum()), count + losses.numel()
        return total / max(1, count)

    def train(self, prepare_progress: Callable[..., None] | None = None) -> TrainResult:
        cfg, calm = self.config, self.calm
        result = TrainResult(self.step, self.history, augment_cache=False)
        progress, began = _NoProgress(), time.perf_counter()  # the probe's share counts the whole run, fill included
        try:
            use_cache, result.cache_note = self._cache_decision() if self.prepare(prepare_progress) else (False, "")
            self._use_cache = use_cache
            if self._stop.is_set() or (use_cache and not self._fill(prepare_progress)):
                result.stop_reason, result.message = "stopped", "Stopped while preparing the examples; the bridge is unchanged."
                return result
            result.augment_cache = use_cache
            if cfg.cache_augment_states and not use_cache and calm.augments:
                log.warning(result.cache_note)
            progress = _progress(cfg.progress and self.dist.rank == 0, self.step, cfg.steps)
            last_good = self._snapshot()  # the bridge and optimizer before the last step that went well
            window_loss, window_tokens, window_start, val_loss = 0.0, 0, time.perf_counter(), None
            probe = self.probe
            if probe and (not probe.curve or probe.curve[-1]["step"] != self.step):
                probe.measure(self.step)  # where the curve starts: a closed bridge answers as the anchor does
            while self.step < cfg.steps:
                if self._stop.is_set():
                    result.stop_reason, result.message = "stopped", f"Stopped at step {self.step}; the bridge keeps what it learned."
                    break
                if self.before_step is not None:
                    self.before_step()  # e.g. the lab lets a waiting chat reply go first (lab/priority.py)
                before = self._snapshot()
                loss, tokens = self._train_step(use_cache)
                if not math.isfinite(loss) or not self._finite():
                    failed = self.step
                    self._restore(last_good)
                    result.stop_reason = "diverged"
                    result.message = (f"Training diverged at step {failed} (loss {loss:.3g}); the bridge and optimizer "
                                      f"were restored to how they were before step {self.step + 1}, the last good one. "
                                      f"Try a lower learning rate (now {cfg.lr:g}).")
                    break
                last_good = before
                window_loss, window_tokens = window_loss + loss * tokens, window_tokens + tokens
                progress.update(1)
                last = self.step == cfg.steps
                if self.step % cfg.eval_every == 0 or last:
                    val_loss = self.validation_loss()
                accuracy = None
                if probe and (last or probe.due(time.perf_counter() - began - probe.spent_s, self.step, cfg.steps)):
                    accuracy = probe.measure(self.step)
                    window_start += probe.curve[-1]["seconds"]  # tokens/s counts training only
                if self.step % cfg.log_every == 0 or last or accuracy is not None:
                    elapsed = time.perf_counter() - window_start
                    record = self._record(window_loss / max(1, window_tokens), val_loss, window_tokens / max(elapsed, 1e-9),
                                          accuracy)
                    progress.set_postfix(loss=f"{record['loss']:.4f}")
                    window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
                if cfg.out_dir and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and not last:
                    self.save_checkpoint(Path(cfg.out_dir) / "checkpoints" / f"step-{self.step:06d}")
        except KeyboardInterrupt:
            result.stop_reason, result.message = "stopped", f"Interrupted at step {self.step}; the bridge keeps what it learned."
        finally:
            progress.close()
            self._stop.clear()  # a stop asked for before train() began still counts; afterwards it is spent
        if self.probe and result.stop_reason == "stopped" and self.probe.curve[-1:] and \
                self.probe.curve[-1]["step"] != self.step:
            self.probe.measure(self.step)  # where a stopped run ends
        result.accuracy_note = self.probe.summary() if self.probe else ""
        if cfg.out_dir:
            self.save_checkpoint(Path(cfg.out_dir) / "checkpoints" / f"step-{self.step:06d}")
        result.step, result.truncated = self.step, self.train_rows.truncated + self.val_rows.truncated
        return result

    # ---- divergence -----------------------------------------------------------------------------

    def _snapshot(self) -> dict:
        return {"step": self.step, "bridge": _copy_state(self.calm.bridge),
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def _restore(self, snapshot: dict) -> None:
        self.calm.bridge.load_state_dict(snapshot["bridge"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.step = snapshot["step"]

    def _finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.calm.bridge.parameters())

    def _record(self, loss: float, val_loss: float | None, tokens_per_s: float, accuracy: float | None = None) -> dict:
        gates = self.calm.gates()
        record = {
            "step": self.step, "loss": loss, "val_loss": val_loss, "accuracy": accuracy,
            "lr": self.optimizer.param_groups[0]["lr"],
            "gates": [float(g.abs().mean()) for g in gates],
            "gate_values": [g.tolist() for g in gates],
            "tokens_per_s": tokens_per_s,
        }
        self.history.append(record)
        if self.config.out_dir and self.dist.rank == 0:
            path = Path(self.config.out_dir) / "metrics.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps({k: v for k, v in record.items() if k != "gate_values"}) + "\n")
        if self.callback is not None:
            self.callback(record)
        return record

    # ---- checkpoints (checkpoints.py) ----------------------------------------------------------

    def save_checkpoint(self, directory) -> Path:
        return checkpoints.save_checkpoint(self, directory)

    def resume(self, directory) -> None:
        """Continue from a checkpoint written by save_checkpoint."""
        checkpoints.resume(self, directory)


LAZY_CHUNKS = 256  # prepared chunks of 64 rows kept from a larger data set (the rest are made again when met)
PREPARE_ALL = 20_000  # rows up to which a data set is prepared whole before training (augment cache possible)


def _copy_state(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class _NoProgress:
    def update(self, n=1): ...
    def set_postfix(self, **kw): ...
    def close(self): ...


def _progress(enabled: bool, start: int, total: int):
    if not enabled:
        return _NoProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc="training bridge", unit="step")
