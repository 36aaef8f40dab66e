"""Interactive work first: on a shared server a chat reply does not take turns with training steps.

A class shares one process: while one student trains, others chat, and both want the same cores. A reply
that alternates with training steps comes about twice as slow, so replies (and other short calls a person
waits on) mark themselves busy with `interactive()`, and a training run calls `yield_to_interactive()`
before each step: it waits while any is busy, at most MAX_WAIT_S per step, so a reply that never ends
(a stream whose page was closed) cannot stop a run.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

MAX_WAIT_S = 5.0  # the longest a training step waits for interactive work

_busy = 0
_changed = threading.Condition()


@contextmanager
def interactive():
    """Marks the enclosed work as a person waiting on it (nestable, thread-safe)."""
    global _busy
    with _changed:
        _busy += 1
    try:
        yield
    finally:
        with _changed:
            _busy -= 1
            _changed.notify_all()


def busy() -> int:
    """How many interactive calls are running now."""
    return _busy


def yield_to_interactive(max_wait_s: float = MAX_WAIT_S) -> float:
    """Waits while interactive work runs (at most max_wait_s); returns the seconds waited."""
    started = time.perf_counter()
    with _changed:
        _changed.wait_for(lambda: _busy == 0, timeout=max_wait_s)
    return time.perf_counter() - started
