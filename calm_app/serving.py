"""How the page is served: gradio's event queue, told not to spin while nobody uses it."""
from __future__ import annotations

import gradio as gr

# gradio's queue looks for new events every 1 ms and for progress every 10 ms when free: 10% of a core, idle
IDLE_POLL_S = {"sleep_when_free": 0.02, "progress_update_sleep_when_free": 0.05}


def quiet_queue(blocks: gr.Blocks) -> gr.Blocks:
    """Let the event queue poll every 20 ms (progress every 50 ms) instead of every 1 ms: an idle server (a classroom
    between lessons, a Space) then costs a few % of a core less, and an event waits at most 20 ms more to start."""
    queue = getattr(blocks, "_queue", None)
    for name, seconds in IDLE_POLL_S.items():
        if queue is not None and getattr(queue, name, seconds) < seconds:
            setattr(queue, name, seconds)
    return blocks
