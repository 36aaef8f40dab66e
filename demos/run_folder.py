"""The start of every demo run: its threads set, its output folder made, its clock started."""
from __future__ import annotations

import time
from pathlib import Path

import torch


def start_run(out, threads: int) -> tuple[Path, float]:
    """(the output folder, created; the time the run started)."""
    torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out, time.perf_counter()
