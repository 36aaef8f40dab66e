"""Clocks and memory readings shared by the benchmark modules.

Timings are medians after warm-up, because these machines are noisy and the first call of
anything pays for lazy initialisation. Memory is the process's resident set size (RSS): psutil
when it is installed (it comes with accelerate), else /proc/self/statm, so the suite adds no
dependency; the peak comes from getrusage.
"""
from __future__ import annotations

import os
import resource
import statistics
import sys
import time

try:
    import psutil
except ImportError:  # the /proc reading below serves Linux without it
    psutil = None

MIB = 2**20


def rss_mib() -> float:
    """Resident memory of this process now, in MiB."""
    if psutil is not None:
        return psutil.Process().memory_info().rss / MIB
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def peak_rss_mib() -> float:
    """The highest resident memory this process has had, in MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak / 1024


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of fn() over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class StepProbe:
    """Called after every training step: notes the time and the RSS, then summarises.

    Step k's duration is the time between the calls after steps k-1 and k (start() stands in for
    step 0), so a trainer's own loop can be measured through its per-step callback. RSS readings
    start after the last warm-up step, when optimizer state and caches exist."""

    def __init__(self):
        self.times: list[float] = []
        self.rss: list[float] = []
        self.rss_before = 0.0

    def start(self) -> None:
        self.rss_before = rss_mib()
        self.times = [time.perf_counter()]

    def __call__(self, *_) -> None:
        self.times.append(time.perf_counter())
        self.rss.append(rss_mib())

    def summary(self, warmup: int, tokens_per_step: int) -> dict:
        steps = [b - a for a, b in zip(self.times, self.times[1:])]
        if len(steps) <= warmup:
            raise ValueError(f"{len(steps)} steps ran; need more than the {warmup} warm-up steps.")
        timed, rss = steps[warmup:], self.rss[warmup - 1:] if warmup else [self.rss_before] + self.rss
        step_s = statistics.median(timed)
        return {
            "steps": len(timed), "warmup": warmup, "step_s": step_s, "tokens_per_s": tokens_per_step / step_s,
            "rss_before_mib": self.rss_before, "rss_after_warmup_mib": rss[0], "rss_end_mib": rss[-1],
            "rss_growth_mib_per_step": growth_per_step(rss), "peak_rss_mib": peak_rss_mib(),
        }


def growth_per_step(rss: list[float]) -> float:
    """RSS growth per step, robust to the allocator's ups and downs.

    RSS read between steps swings by megabytes as freed blocks go back to the system or not, so
    a least-squares slope over a few steps is mostly noise. This compares the medians of the first
    and last quarters of the readings, divided by the steps between them: a steady leak shows in
    full, a swing moves one median little."""
    if len(rss) < 2:
        return 0.0
    quarter = max(1, len(rss) // 4)
    return (statistics.median(rss[-quarter:]) - statistics.median(rss[:quarter])) / (len(rss) - quarter)
