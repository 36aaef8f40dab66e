"""Held-out exact match while a bridge trains: a small fixed validation sample, decoded greedily in one batch, at
an interval chosen from what decoding costs, so that the probe takes at most `share` of the run (10% by default).

The loss says the bridge is learning; this curve says the answers are becoming right, which is what a student came to
see. The interval is not a setting: from the run's time so far (the frozen states' fill included) and its pace, the
probe projects the run's whole time, counts how many more measurements fit in the share at the dearest one's cost, and
spreads them evenly over the steps left. The first (before step one, priced as an open bridge's) and the last (at the
end) are always taken; any two at least a tenth of the run's steps apart."""
from __future__ import annotations

import time

import torch

from ..engine.batched_generation import generate_batch
from .data import Example
from .evaluation import SCORERS

MIN_GAP = 0.1  # share of the run's steps between two measurements, and between the last due one and the end
LONGEST_ANSWER = 32  # tokens: references longer than this are text to write, not answers to match exactly


class AccuracyProbe:
    def __init__(self, calm, examples: list[Example], sample: int = 32, scoring: str = "exact", share: float = 0.1):
        tokens = lambda text: len(calm.anchor.tokenizer(text, add_special_tokens=False)["input_ids"])
        answers = [(e, tokens(e.completion)) for e in examples[:4 * sample] if e.completion.strip() and not e.keep_anchor]
        pairs = [(e, n) for e, n in answers if n <= LONGEST_ANSWER][:sample]
        self.calm, self.examples = calm, [e for e, _ in pairs]
        self.max_new_tokens = max((n for _, n in pairs), default=1) + 1  # one more: the answer must also end
        self.score, self.share = SCORERS[scoring], share
        self.curve: list[dict] = []  # {"step", "exact_match" (%), "seconds"} per measurement
        self.spent_s = 0.0  # time decoding, all measurements
        self.run_s = 0.0  # the run's time since it began (the frozen states' fill included), the probe's own left out
        self._pace: tuple[int, float] | None = None  # (step, run_s) at the first due(): the steps' pace from there

    def __bool__(self) -> bool:
        return bool(self.examples)

    def due(self, run_s: float, step: int, steps: int) -> bool:
        """Whether to measure after `step` of `steps`, run_s seconds into the run (the probe's own time left out).
        The run's whole time is projected from its pace since the first call; the measurements that still fit in
        `share` of it (the probe's time included), priced at the dearest so far, the end's included, are spaced
        evenly over the steps left; none within MIN_GAP of the steps of the last one or of the end: a point a few
        steps from another adds nothing."""
        self.run_s = run_s
        if not self.curve:
            return True
        first_step, first_s = self._pace = self._pace or (step, run_s)
        last = self.curve[-1]["step"]
        if step == first_step or steps - step < MIN_GAP * steps or step - last < MIN_GAP * steps:
            return False
        projected = run_s + (run_s - first_s) / (step - first_step) * (steps - step)
        cost = max(p["seconds"] for p in self.curve)
        # k more fit where (spent + k cost) <= share of (projected + spent + k cost): the whole run holds the probe too
        allowed = self.share / max(1 - self.share, 1e-9) * projected - self.spent_s
        fit = int(allowed // max(cost, 1e-9))  # the end's measurement among them
        return fit >= 2 and step - last >= (steps - last) / fit

    @torch.no_grad()
    def measure(self, step: int) -> float:
        """Exact match (%) of the sample's greedy answers at `step`, decoded as one batch with KV caches."""
        started = time.perf_counter()
        training = self.calm.bridge.training
        self.calm.bridge.eval()
        try:  # the first check decodes every layer, closed ones too (the same answers): priced as later ones are
            scales = None if self.curve else self.calm.block_scales()
            answers = generate_batch(self.calm, [e.prompt for e in self.examples], self.max_new_tokens, scales=scales)
        finally:
            self.calm.bridge.train(training)
        right = sum(self.score(a) == self.score(e.completion) for a, e in zip(answers, self.examples))
        seconds = time.perf_counter() - started
        self.spent_s += seconds
        self.curve.append({"step": step, "exact_match": 100.0 * right / len(self.examples), "seconds": seconds})
        return self.curve[-1]["exact_match"]

    def summary(self) -> str:
        if not self.curve:
            return ""
        share = self.spent_s / max(self.run_s + self.spent_s, 1e-9)
        return (f"held-out exact match {self.curve[-1]['exact_match']:.1f}% on {len(self.examples)} validation "
                f"examples (checked {len(self.curve)} times, {100 * share:.0f}% of the run's time)")
