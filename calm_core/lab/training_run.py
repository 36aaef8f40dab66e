"""A session's training run: the recipe's start on a new bridge, the memory checked before work starts (the frozen-
state cache gets what the memory ledger says this session may still use), the run in a thread of its own, and what
the app shows of it (RunState: step, loss, time left). LabSession inherits this; a failed start leaves the session
as it was."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace

from ..errors import CALMError
from ..training import recipes
from ..training.trainer import TrainConfig, Trainer
from . import bounds, comparison
from .resources import LEDGER, device_of_calm, frozen_cache_bytes, training_bytes

MAX_RUNS = int(os.environ.get("CALM_MAX_RUNS", "8"))  # training runs at once in this process
RUNS = threading.BoundedSemaphore(MAX_RUNS)
LEDGER_BUDGET = "what this session may still use on this machine (the memory ledger)"


@dataclass
class RunState:
    """What the app shows about the current or last training run."""

    total: int = 0
    step: int = 0
    running: bool = False
    message: str = ""
    prepared: tuple[int, int] = (0, 0)  # examples prepared so far, of how many (before the first step)
    history: list[dict] = field(default_factory=list)
    started: float = 0.0  # time.perf_counter() at the first step's record
    started_step: int = 0

    def eta_s(self) -> float | None:
        """Seconds left at the pace since the first record (None before two records)."""
        if not self.running or self.step <= self.started_step or not self.started:
            return None
        pace = (time.perf_counter() - self.started) / (self.step - self.started_step)
        return pace * max(0, self.total - self.step)

    def status(self) -> str:
        last = self.history[-1] if self.history else {}
        parts = [f"Step {self.step}/{self.total}"]
        if last:
            parts.append(f"loss {last['loss']:.4f}")
            if last.get("val_loss") is not None:
                parts.append(f"validation loss {last['val_loss']:.4f}")
            recent = [h["tokens_per_s"] for h in self.history[-5:]]  # smoothed: one window can be a few ms
            parts.append(f"{sum(recent) / len(recent):.0f} tokens/s")
            left = self.eta_s()
            if left is not None:
                parts.append(f"about {left / 60:.0f} min left" if left >= 90 else f"about {left:.0f} s left")
        elif self.running and self.prepared[1]:
            parts.append(f"preparing examples {self.prepared[0]:,}/{self.prepared[1]:,}")
        return " · ".join(parts) + (f"\n\n{self.message}" if self.message else "")


class TrainingRuns:
    """The training half of LabSession (which sets calm, splits, run, trainer, baselines, _thread, _lock)."""

    @property
    def training(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _refuse_while_training(self, what: str) -> None:
        if self.training:
            raise CALMError(f"A training run is in progress; stop it before you {what}.")

    def start_training(self, config: TrainConfig) -> RunState:
        """Check the run fits (batch against memory, at the data's longest example), then train in a
        thread of its own; the examples are prepared there, so Stop is answered at once."""
        with self._lock:  # two clicks on Train in one session start one run
            calm = self.require()
            self._refuse_while_training("start another")
            if self.splits is None:
                raise CALMError("No training data: upload a file or pick a preset data set first.")
            if not RUNS.acquire(blocking=False):
                raise CALMError(f"{MAX_RUNS} training runs are in progress on this server, as many as it takes at "
                                "once (they share its processors); try again when one has ended.")
            try:
                return self._start(calm, config)
            except BaseException:
                RUNS.release()
                raise

    def _start(self, composed, config: TrainConfig) -> RunState:
        examples, notes = list(self.splits.train), []
        if config.method == "calm" and recipes.is_new(composed):  # the recipe starts a new bridge, once
            changes, extra, notes = recipes.prepare(composed, recipes.get_recipe(config.recipe), examples)
            config, examples = replace(config, **changes), examples + extra
        elif config.method == "calm" and composed.recipe and composed.recipe.get("name") != config.recipe:
            notes = [f"this bridge was started by recipe {composed.recipe.get('name')}; recipe {config.recipe}'s "
                     "learning rates apply, its start applies to a new bridge (Start over)"]
        tokens = bounds.longest_tokens(composed, examples, config.max_length)
        copy = comparison.copy_bytes(composed, config.method)
        device = device_of_calm(composed)
        with LEDGER.reserve(copy, f"Copying the anchor for the {config.method} baseline", "Free memory first.", device):
            calm = comparison.model_for(composed, config.method)
        need = copy + training_bytes(calm, config.batch_size, tokens)
        budget_name = "cache_budget_mb"
        if config.cache_budget_mb is None:  # the cache takes what is left to this session, whenever it fits
            config = replace(config, cache_budget_mb=max(0, LEDGER.room(device) - need) / 2**20)
            budget_name = LEDGER_BUDGET
        need += frozen_cache_bytes(calm, config, len(examples), tokens, self.splits.kept + len(examples) -
                                   len(self.splits.train))
        fits = bounds.largest_batch(calm, tokens)
        reservation = LEDGER.reserve(need, f"Training with batch size {config.batch_size:,}",
                                     f"At this data's longest example ({tokens:,} tokens) at most batch size {fits:,} "
                                     "fits now: lower the batch size.", device)
        reservation.__enter__()  # held until the run ends, released in _train
        said = "; ".join(notes)
        self.run = RunState(total=config.steps, running=True, prepared=(0, len(examples)),
                            message=said[:1].upper() + said[1:] + ("." if said else ""))
        try:
            self.trainer = Trainer(calm, examples, self.splits.validation, config, callback=self._record)
            self.trainer.cache_budget_name = budget_name
        except BaseException:
            self.run.running = False
            reservation.__exit__(None, None, None)
            raise
        self.trainer.step = 0
        self._thread = threading.Thread(target=self._train, args=(reservation,), name="calm-training", daemon=True)
        self._thread.start()
        return self.run

    def _record(self, record: dict) -> None:
        if not self.run.started:
            self.run.started, self.run.started_step = time.perf_counter(), record["step"]
        self.run.history.append(record)
        self.run.step = record["step"]

    def _prepared(self, done: int, total: int) -> None:
        self.run.prepared = (done, total)

    def _train(self, reservation) -> None:
        started = self.run.message
        try:
            result = self.trainer.train(prepare_progress=self._prepared)
            if self.trainer.config.method != "calm":
                self.baselines[self.trainer.config.method] = self.trainer.calm
            self.run.step = result.step
            self.run.message = " ".join(m for m in (started, result.message or f"Finished {result.step} steps.") if m)
            if result.truncated:
                self.run.message += f" {result.truncated} examples were truncated to the models' context."
            if result.cache_note:  # "cache on: ..." / "cache off: ...", with the budget that decided
                self.run.message += f" Frozen-state {result.cache_note}"
        except CALMError as exc:
            self.run.message = str(exc)
        except Exception as exc:  # surfaced in the page; the bridge keeps its last state
            self.run.message = f"Training failed: {type(exc).__name__}: {exc}"
        finally:
            self.run.running = False
            reservation.__exit__(None, None, None)
            RUNS.release()

    def stop_training(self) -> bool:
        """Ask a running run to stop after its current step; False when nothing is running."""
        if not self.training or self.trainer is None:
            return False
        self.trainer.request_stop()
        return True

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
