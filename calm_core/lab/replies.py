"""The Chat tab's columns answering together: several models' token streams interleaved, so that every column
grows as its model writes, and the pieces per second over all of them."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator


def interleave(streams: list[Iterator[str]], done: Callable[[float], None]) -> Iterator[tuple[str, ...]]:
    """Yields every stream's text so far after each new piece (one piece per live stream per round), then once more
    at the end; calls done(pieces per second) before that last yield."""
    texts, live, started, pieces = [""] * len(streams), [True] * len(streams), time.perf_counter(), 0
    while any(live):
        for i, stream in enumerate(streams):
            if live[i]:
                piece = next(stream, None)
                if piece is None:
                    live[i] = False
                else:
                    texts[i], pieces = texts[i] + piece, pieces + 1
                    yield tuple(texts)
    done(pieces / max(time.perf_counter() - started, 1e-9))
    yield tuple(texts)
