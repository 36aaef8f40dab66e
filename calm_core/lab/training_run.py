"""A session's training run: the recipe's start on a new bridge, the memory checked before work starts (the frozen-
state cache gets what the memory ledger says this session may still use), the run in a thread of its own, what the
app shows of it (RunState: step, loss, held-out exact match, time left), and every run kept in the session's runs
folder (run_store.py), from which a stopped one resumes. LabSession inherits this; a failed start leaves the session
as it was."""
from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..engine.compose import ComposedLM
from ..errors import CALMError
from ..training import recipes
from ..training.trainer import TrainConfig, Trainer
from . import bounds, comparison, priority, run_settings
from .resources import LEDGER, device_of_calm, frozen_cache_bytes, training_bytes
from .run_store import RunRecord

# training runs at once in this process: one per two processors (a run's matrix products use two threads well; more
# runs than that only share the same cores, each slower), at least one; CALM_MAX_RUNS overrides
MAX_RUNS = int(os.environ.get("CALM_MAX_RUNS") or max(1, (os.cpu_count() or 2) // 2))
RUNS = threading.BoundedSemaphore(MAX_RUNS)
ACTIVE: "weakref.WeakSet[RunState]" = weakref.WeakSet()  # the runs holding a place now, for when_a_run_ends()
LEDGER_BUDGET = "what this session may still use on this machine (the memory ledger)"


@dataclass(eq=False)  # compared by identity: a run is one run (and sits in ACTIVE, a weak set)
class RunState:
    """What the app shows about the current or last training run."""

    total: int = 0
    step: int = 0
    running: bool = False
    message: str = ""
    prepared: tuple[int, int] = (0, 0)  # examples prepared so far, of how many (before the first step)
    preparing: str = "examples"  # what: the examples (tokens), then the frozen models' states (frozen_cache.fill)
    history: list[dict] = field(default_factory=list)
    started: float = 0.0  # time.perf_counter() at the first step's record
    started_step: int = 0
    accuracy: list[dict] = field(default_factory=list)  # held-out exact match: {"step", "exact_match", "seconds"}
    run_id: str = ""  # the run's id in the session's runs (run_store.py)

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
            if self.accuracy:
                parts.append(f"held-out exact match {self.accuracy[-1]['exact_match']:.0f}%")
            recent = [h["tokens_per_s"] for h in self.history[-5:]]  # smoothed: one window can be a few ms
            parts.append(f"{sum(recent) / len(recent):.0f} tokens/s")
            left = self.eta_s()
            if left is not None:
                parts.append(f"{about(left)} left")
        elif self.running and self.prepared[1]:
            parts.append(f"preparing {self.preparing} {self.prepared[0]:,}/{self.prepared[1]:,}")
        parts += [self.run_id] if self.run_id else []  # the name the Runs tab lists it under
        return " · ".join(parts) + (f"\n\n{self.message}" if self.message else "")


def when_a_run_ends() -> str:
    """When a place frees up, from the running runs' own pace: what a refused student is told."""
    left = [r.eta_s() for r in list(ACTIVE) if r.running]
    known = [s for s in left if s is not None]
    if not known:
        return "the running ones have only just started (their pace is not known yet): try again in a minute"
    return f"the first to end finishes in {about(min(known))} (at its pace so far): you can start then"


def about(seconds: float) -> str:
    """"about 3 min" / "about 40 s": a time left, as the status line and a refusal say it."""
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {max(seconds, 1):.0f} s"


class TrainingRuns:
    """The training half of LabSession (which sets calm, splits, run, trainer, baselines, _thread, _lock)."""

    @property
    def training(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _refuse_while_training(self, what: str) -> None:
        if self.training:
            raise CALMError(f"A training run is in progress; stop it before you {what}.")

    def start_training(self, config: TrainConfig, name: str = "", resume: str | None = None) -> RunState:
        """Check the run fits (batch against memory, at the data's longest example), then train in a
        thread of its own; the examples are prepared there, so Stop is answered at once. The run is kept in
        the session's runs under `name`; `resume`: a kept run's id, continued from its last checkpoint."""
        with self._lock:  # two clicks on Train in one session start one run
            calm = self.require()
            self._refuse_while_training("start another")
            if self.splits is None:
                raise CALMError("No training data: upload a file or pick a preset data set first.")
            if not RUNS.acquire(blocking=False):
                runs = "1 training run is" if MAX_RUNS == 1 else f"{MAX_RUNS} training runs are"
                raise CALMError(f"{runs} in progress on this server, as many as it takes at once (they share its "
                                f"processors); {when_a_run_ends()}.")
            try:
                if resume:
                    record = self.runs.get(resume)
                    calm, config = self._resumable(calm, record), TrainConfig(**{**record.settings, "progress": False})
                    run = self._start(calm, config, record)
                    self.calm, self.preset_bridge, self._solo = calm, False, {}  # only once it started
                    return run
                return self._start(calm, config, name=name)
            except BaseException:
                RUNS.release()
                raise

    def _resumable(self, calm, record: RunRecord):
        """A new composition of the session's models in the run's bridge shape (the checkpoint fills its weights; the
        session's own bridge is untouched until the run has started), or a CALMError that says why it cannot be."""
        why = []
        if record.settings.get("method") != "calm":
            why.append(f"it trained a {record.settings.get('method')} baseline; baselines train again from the start")
        if record.models != self.names or record.adapters != self.adapters:
            why.append(f"it trained on {' + '.join(record.models)}, the session now has {' + '.join(self.names)}")
        if record.data.get("fingerprint") != self.data_info.get("fingerprint"):
            why.append(f"it trained on other data ({record.data.get('source')}); choose the same data first")
        if record.checkpoint() is None:
            why.append("it kept no checkpoint")
        elif record.step >= record.settings["steps"] and record.status == "finished":
            why.append(f"it finished all {record.settings['steps']:,} steps; start a new run to train further")
        if why:
            raise CALMError(f"{record.id} cannot resume here: " + "; ".join(why) + ".")
        from ..engine.config import CALMConfig

        pairs = [(m.model, m.tokenizer) for m in [calm.anchor] + calm.augments]
        return ComposedLM(pairs[0], pairs[1:], CALMConfig(**record.bridge_config))

    def _start(self, composed, config: TrainConfig, record: RunRecord | None = None, name: str = "") -> RunState:
        examples, notes, extra, asked_budget = list(self.splits.train), [], [], config.cache_budget_mb
        if record is not None:  # resuming: the rows the recipe added then, not a new start
            extra = self.runs.load_examples(record)
            examples, notes = examples + extra, [f"resuming {record.id} from step {record.step:,}"]
        elif config.method == "calm" and recipes.is_new(composed):  # the recipe starts a new bridge, once
            changes, extra, notes = recipes.prepare(composed, recipes.get_recipe(config.recipe), examples, config.seed)
            config, examples = replace(config, **changes), examples + extra
        elif config.method == "calm" and composed.recipe and composed.recipe.get("name") != config.recipe:
            notes = [f"this bridge was started by recipe {composed.recipe.get('name')}; recipe {config.recipe}'s "
                     "learning rates apply, its start applies to a new bridge (Start over)"]
        tokens = bounds.longest_tokens(composed, examples, config.max_length)
        copy = comparison.copy_bytes(composed, config.method)
        device = device_of_calm(composed)
        with LEDGER.reserve(copy, f"Copying the anchor for the {config.method} baseline", "Free memory first.", device):
            calm = comparison.model_for(composed, config.method)
        # a step with the frozen-state cache on runs only the anchor above the bridge: it needs far less than one
        # without, so the cache gets what is left beside the cached step; the reservation covers either path (the
        # trainer decides, once the rows are prepared, whether the cache fits its budget)
        uncached = copy + training_bytes(calm, config.batch_size, tokens)
        cached = copy + training_bytes(calm, config.batch_size, tokens, cached=config.cache_augment_states)
        budget_name = "cache_budget_mb"
        if config.cache_budget_mb is None:  # the cache takes what is left to this session, whenever it fits
            config = replace(config, cache_budget_mb=max(0, LEDGER.room(device) - cached) / 2**20)
            budget_name = LEDGER_BUDGET
        validation = min(len(self.splits.validation), config.eval_examples)
        need = max(uncached, cached + frozen_cache_bytes(calm, config, len(examples) + validation, tokens,
                                                         self.splits.kept + len(examples) - len(self.splits.train)))
        fits = bounds.largest_batch(calm, tokens)
        reservation = LEDGER.reserve(need, f"Training with batch size {config.batch_size:,}",
                                     f"At this data's longest example ({tokens:,} tokens) at most batch size {fits:,} "
                                     "fits now: lower the batch size.", device)
        reservation.__enter__()  # held until the run ends, released in _train
        said = "; ".join(notes)
        fresh = record is None
        try:
            if fresh:
                kept = {k: v for k, v in asdict(config).items() if k not in ("out_dir", "progress")}
                kept["cache_budget_mb"] = asked_budget  # None: what memory allows where it runs
                record = self.runs.new(name, models=list(self.names), adapters=list(self.adapters),
                                       bridge_config=asdict(composed.config), settings=kept, data=dict(self.data_info))
                self.runs.save_examples(record, extra)
            # checkpoints along the way (the newest kept), so a run whose process ends mid-way can resume
            config = replace(config, out_dir=record.folder, save_total_limit=1,
                             checkpoint_every=config.checkpoint_every or max(25, config.steps // 10))
            self.trainer = Trainer(calm, examples, self.splits.validation, config, callback=self._record)
            self.trainer.cache_budget_name = budget_name
            self.trainer.before_step = priority.yield_to_interactive  # chat replies on this server go first
            if not fresh:
                self.trainer.resume(record.checkpoint())
                composed.recipe = _recipe_of(record.checkpoint())
        except BaseException:
            if fresh and record is not None:
                record.status, record.message = "failed", "It failed to start."
                self.runs.save(record)
            reservation.__exit__(None, None, None)
            raise
        record.status, self.record = "running", record
        self.run = RunState(total=config.steps, running=True, prepared=(0, len(examples)), run_id=record.id,
                            message=said[:1].upper() + said[1:] + ("." if said else ""),
                            history=[dict(h) for h in self.trainer.history], step=self.trainer.step,
                            accuracy=list(self.trainer.probe.curve) if self.trainer.probe else [])
        ACTIVE.add(self.run)
        self._thread = threading.Thread(target=self._train, args=(reservation,), name="calm-training", daemon=True)
        self._thread.start()
        return self.run

    def _record(self, record: dict) -> None:
        if not self.run.started:
            self.run.started, self.run.started_step = time.perf_counter(), record["step"]
        self.run.history.append(record)
        self.run.step = record["step"]
        if self.trainer is not None and self.trainer.probe is not None:
            self.run.accuracy = list(self.trainer.probe.curve)
        self._keep()

    def _keep(self, status: str | None = None) -> None:
        """The current run's record, brought up to date in its folder (per-channel gates left out: the means stay)."""
        record = self.record
        record.history = [{k: v for k, v in h.items() if k != "gate_values"} for h in self.run.history]
        record.accuracy = list(self.run.accuracy)
        record.seconds = self._seconds_before + time.perf_counter() - self._run_started
        record.status, record.message = status or record.status, self.run.message
        self.runs.save(record)

    def _prepared(self, done: int, total: int, what: str = "examples") -> None:
        self.run.prepared, self.run.preparing = (done, total), what

    def _train(self, reservation) -> None:
        started, status = self.run.message, "failed"
        self._run_started, self._seconds_before = time.perf_counter(), self.record.seconds
        try:
            result = self.trainer.train(prepare_progress=self._prepared)
            status = result.stop_reason
            if self.trainer.config.method != "calm":
                self.baselines[self.trainer.config.method] = self.trainer.calm
            self.run.step = result.step
            self.run.message = " ".join(m for m in (started, result.message or f"Finished {result.step} steps.") if m)
            if result.truncated:
                self.run.message += f" {result.truncated} examples were truncated to the models' context."
            if result.cache_note:  # "cache on: ..." / "cache off: ...", with the budget that decided
                self.run.message += f" Frozen-state {result.cache_note}"
            if result.accuracy_note:
                self.run.message += f" The {result.accuracy_note}."
        except CALMError as exc:
            self.run.message = str(exc)
        except Exception as exc:  # surfaced in the page; the bridge keeps its last state
            self.run.message = f"Training failed: {type(exc).__name__}: {exc}"
        finally:
            try:
                if self.trainer.probe is not None:
                    self.run.accuracy = list(self.trainer.probe.curve)
                if status == "failed" and self.trainer.step and self.trainer.config.method == "calm":
                    self.trainer.save_checkpoint(Path(self.record.folder) / "checkpoints" / f"step-{self.trainer.step:06d}")
                self._keep(status)
            except Exception as exc:  # the run's record is a convenience; the run's own outcome stands
                self.run.message += f" (Keeping the run's record failed: {exc}.)"
            self.run.running = False
            ACTIVE.discard(self.run)
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

    # ---- kept runs ------------------------------------------------------------------------------

    def run_settings_file(self, run_id: str, directory) -> Path:
        """The run's settings as YAML with the command line's option names (`python -m calm_core train --config`)."""
        record = self.runs.get(run_id)
        path = Path(directory) / f"{record.id}.yaml"
        path.write_text(run_settings.to_yaml(record))
        return path

    def run_command(self, run_id: str) -> str:
        return run_settings.to_command(self.runs.get(run_id))

    def import_run(self, path) -> RunRecord:
        """A run's .zip (Download run, perhaps from an earlier session or another server) into this session's runs:
        to compare it, export it, or resume it on the same models and data."""
        return self.runs.import_archive(path)

    def run_archive(self, run_id: str) -> Path:
        """The run's folder as one .zip: bridge, optimizer state, settings (run.json) and history."""
        record = self.runs.get(run_id)
        if record.status == "running":
            raise CALMError(f"{record.id} is still training; download it when it has ended (or Stop it).")
        return self.runs.archive(record)


def _recipe_of(checkpoint) -> dict:
    from ..engine.persistence import read_description

    return read_description(checkpoint).get("recipe") or {}
