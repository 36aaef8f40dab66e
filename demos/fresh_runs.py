"""The shipped fresh-seed runs of a demo (results/<demo>/<prefix>N/table.json), in seed order: each was run once with the
settings frozen, so a development-seed table can name them beside its own number."""
from __future__ import annotations

import json
from pathlib import Path


def shipped_runs(results: Path, prefix: str) -> list[dict]:
    """Every results/<prefix>N/table.json as a dict, sorted by N."""
    paths = sorted(Path(results).glob(f"{prefix}*/table.json"), key=lambda p: int(p.parent.name[len(prefix):]))
    return [json.loads(p.read_text()) for p in paths]
