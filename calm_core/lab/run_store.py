"""Every training run of a session, kept: one folder per run (run.json with its name, models, recipe, every setting,
curves, final scores and time; metrics.jsonl; the last checkpoint: bridge + optimizer state; the rehearsal rows its
recipe added) in a bounded runs folder of the session's own. A later run that fails or is stopped never touches an
earlier run's folder; when more than MAX_KEPT runs are kept, the oldest ended one goes.

Why not trackio: a run here must carry its bridge and optimizer state (to resume it and to download it as one file)
and stay private to its session on a shared server; trackio keeps metrics in one database per project for all who
log to it. The curves are kept in run.json beside the bridge instead, and the Runs tab draws them."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..errors import CALMError
from ..training.checkpoints import is_checkpoint
from ..training.examples import Example, read_jsonl, write_jsonl

MAX_KEPT = int(os.environ.get("CALM_KEPT_RUNS", "10"))  # runs a session keeps (each: a bridge and its optimizer state)
RUNS_ROOT = Path(os.environ.get("CALM_RUNS_DIR", Path(tempfile.gettempdir()) / "calm-lab-runs"))
RECORD_FILE, EXTRA_FILE = "run.json", "extra_examples.jsonl"
STALE_AFTER_S = float(os.environ.get("CALM_RUNS_STALE_HOURS", "24")) * 3600  # a session folder nobody has written to
MAX_IMPORT_BYTES = 2 * 2**30  # a run's bridge and optimizer state: the real pair's take about 80 MB
_RUN_FILE = re.compile(r"(run\.json|metrics\.jsonl|extra_examples\.jsonl|checkpoints/step-\d{6}/[\w-]+\.(json|safetensors))")


@dataclass
class RunRecord:
    id: str
    name: str
    models: list[str]
    adapters: list[str | None]
    bridge_config: dict  # the CALMConfig the bridge was built with
    settings: dict  # every TrainConfig field the run used (out_dir and progress aside)
    data: dict  # where the examples came from: train / validation paths, fingerprint, counts, preset
    folder: str
    status: str = "running"  # running, finished, stopped, diverged, failed
    started_at: str = ""
    seconds: float = 0.0  # wall time of the run, resumed parts added
    history: list[dict] = field(default_factory=list)  # the trainer's records (per-channel gates left out)
    accuracy: list[dict] = field(default_factory=list)  # held-out exact match: {"step", "exact_match", "seconds"}
    message: str = ""

    @property
    def step(self) -> int:
        return max([h["step"] for h in self.history] + [a["step"] for a in self.accuracy] + [0])

    @property
    def final(self) -> dict:
        last = self.history[-1] if self.history else {}
        return {"step": self.step, "loss": last.get("loss"), "validation loss": last.get("val_loss"),
                "held-out exact match %": self.accuracy[-1]["exact_match"] if self.accuracy else None}

    def label(self) -> str:
        return f"{self.id} · {self.name} · {self.status} at step {self.step}/{self.settings.get('steps')}"

    def checkpoint(self) -> Path | None:
        """The run's last checkpoint (bridge + optimizer state), None when it has none."""
        found = sorted(p for p in (Path(self.folder) / "checkpoints").glob("step-*") if is_checkpoint(p))
        return found[-1] if found else None


class RunStore:
    """The runs folder of one session: RUNS_ROOT/<a random id>/run-001, run-002, ..."""

    def __init__(self, root: str | Path | None = None, max_kept: int = MAX_KEPT):
        if root is None:
            sweep_stale(RUNS_ROOT)
        self.root = Path(root) if root else RUNS_ROOT / uuid.uuid4().hex[:12]
        self.max_kept, self._count = max_kept, 0
        self.records: dict[str, RunRecord] = {}

    def new(self, name: str, **values) -> RunRecord:
        self._count += 1
        run_id = f"run-{self._count:03d}"
        folder = self.root / run_id
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        record = RunRecord(id=run_id, name=name or run_id, folder=str(folder),
                           started_at=time.strftime("%Y-%m-%d %H:%M:%S"), **values)
        self.records[run_id] = record
        self._evict()
        self.save(record)
        return record

    def _evict(self) -> None:
        ended = [r for r in self.records.values() if r.status != "running"]
        while len(self.records) > self.max_kept and ended:
            gone = ended.pop(0)
            shutil.rmtree(gone.folder, ignore_errors=True)
            del self.records[gone.id]

    def get(self, run_id: str) -> RunRecord:
        run_id = str(run_id or "").split(" · ")[0].strip()  # a Runs-tab label or the id itself
        if run_id not in self.records:
            raise CALMError(f"No run {run_id!r} in this session; its runs are: {', '.join(self.records) or 'none yet'}.")
        return self.records[run_id]

    def list(self) -> list[RunRecord]:
        return list(self.records.values())

    def save(self, record: RunRecord) -> None:
        """run.json, written whole then renamed into place (a reader never sees half of it)."""
        path = Path(record.folder) / RECORD_FILE
        if not path.parent.is_dir():
            return  # evicted, or the session's folder was removed
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record), indent=1, default=str))
        os.replace(tmp, path)

    def save_examples(self, record: RunRecord, examples: list[Example]) -> None:
        """The rows a recipe added (rehearsal), so that resuming trains on exactly the same data."""
        write_jsonl(Path(record.folder) / EXTRA_FILE, examples)

    def load_examples(self, record: RunRecord) -> list[Example]:
        return read_jsonl(Path(record.folder) / EXTRA_FILE)

    def archive(self, record: RunRecord) -> Path:
        """The run's folder as one .zip (bridge, optimizer state, settings, history), in a fresh temporary folder."""
        target = Path(tempfile.mkdtemp(prefix="calm-run-")) / f"{record.id}-{_slug(record.name)}"
        return Path(shutil.make_archive(str(target), "zip", root_dir=record.folder))

    def import_archive(self, path) -> RunRecord:
        """A run's .zip (as archive() writes it) back into this session's runs under a new id, to look at, compare or
        resume (a run whose process ended while it trained is marked interrupted). Only the files a run holds are
        taken, each size-bounded; anything else in the archive is refused."""
        try:
            archive = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise CALMError(f"{Path(str(path)).name} is not a run's .zip: {exc}") from None
        with archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            strange = [m.filename for m in members if not _RUN_FILE.fullmatch(m.filename)]
            if strange or RECORD_FILE not in {m.filename for m in members}:
                raise CALMError(f"{Path(str(path)).name} is not a run's .zip (as the Runs tab's Download run writes it): "
                                + (f"unexpected {', '.join(strange[:3])}" if strange else f"no {RECORD_FILE}"))
            if sum(m.file_size for m in members) > MAX_IMPORT_BYTES:
                raise CALMError(f"{Path(str(path)).name} unpacks to more than {MAX_IMPORT_BYTES / 2**30:.0f} GiB.")
            try:
                values = json.loads(archive.read(RECORD_FILE))
                names = {f.name for f in fields(RunRecord)} - {"id", "folder", "started_at"}
                values = {k: v for k, v in values.items() if k in names}
                name = values.pop("name", "imported")
                record = self.new(f"{name} (imported)", **values)
            except (TypeError, ValueError) as exc:
                raise CALMError(f"{RECORD_FILE} in {Path(str(path)).name} is not a run record: {exc}") from None
            for member in members:
                if member.filename != RECORD_FILE:
                    target = Path(record.folder) / member.filename
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(member))
        record.status = "interrupted" if record.status == "running" else record.status
        self.save(record)
        return record

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.records.clear()


def sweep_stale(root: Path, max_age_s: float = STALE_AFTER_S) -> None:
    """Remove session folders untouched for max_age_s: a session whose page went away without the app hearing of it
    (an API client, a crash) must not keep its runs on the server's disk for ever."""
    now = time.time()
    for folder in root.glob("*") if root.is_dir() else []:
        try:
            newest = max([p.stat().st_mtime for p in folder.rglob("run.json")] + [folder.stat().st_mtime])
        except OSError:
            continue
        if now - newest > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)[:40].strip("-") or "run"


def data_fingerprint(splits, limit: int = 20_000) -> str:
    """What the training rows are, in 16 hex digits (the first `limit` rows and the count): a resumed run must
    train on the same data."""
    digest = hashlib.sha256(str(len(splits.train)).encode())
    for i, e in enumerate(splits.train):
        if i >= limit:
            break
        digest.update(json.dumps([e.prompt, e.completion, e.keep_anchor]).encode())
    return digest.hexdigest()[:16]
