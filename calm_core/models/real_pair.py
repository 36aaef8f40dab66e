"""The real pretrained pair, offline: Gemma 3 270M (base) and SmolLM2-135M-Instruct.

Both come as GGUF files (weight_sources.py: from pip packages, pinned by sha256). Reading a GGUF
file means dequantising every tensor and converting a 262k-entry tokenizer (about 25 s for SmolLM2,
80 s for Gemma on 2 cores), so this module does it once and writes both as ordinary model folders
(safetensors, float32) into a cache; every later load takes seconds. The app does it at first use
(ensure_prepared); by hand:

    pip install -r requirements.txt
    python -m calm_core.models.real_pair     # prepares into ~/.cache/calm-lab/real-pair

CALM_REAL_PAIR_DIR moves the cache; CALM_REAL_PAIR_AUTO=0 turns preparing at first use off.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from ..errors import ModelLoadError
from . import weight_sources
from .weight_sources import GEMMA, SMOLLM2

try:
    import fcntl
except ImportError:  # not on Windows: preparation there is not guarded against a second process
    fcntl = None

PREPARE_COMMAND = "python -m calm_core.models.real_pair"
MARKER = "calm_source.json"  # written last, with the GGUF file's sha256: without it a folder is not prepared
LOCK = ".prepare.lock"

# name -> (what it is, its folder in the cache, where its GGUF file comes from)
MODELS = {
    "gemma": ("Gemma 3 270M (base)", "gemma-3-270m", GEMMA),
    "smollm2": ("SmolLM2-135M-Instruct", "smollm2-135m-instruct", SMOLLM2),
}
SHARE = {"gemma": 0.7, "smollm2": 0.3}  # of the preparation's time on 2 cores, for progress


def cache_dir() -> Path:
    return Path(os.environ.get("CALM_REAL_PAIR_DIR") or Path.home() / ".cache" / "calm-lab" / "real-pair")


def model_dir(key: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / MODELS[key][1]


def _is_prepared(key: str, root: Path | None = None) -> bool:
    """Its marker is there and names the pinned sha256 (an older or other conversion is not prepared)."""
    try:
        marker = json.loads((model_dir(key, root) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("sha256") == MODELS[key][2].sha256


def prepared_pair(root: Path | None = None) -> dict[str, Path] | None:
    """{"gemma": folder, "smollm2": folder} once both are prepared from the pinned weights, else None."""
    return {key: model_dir(key, root) for key in MODELS} if all(_is_prepared(k, root) for k in MODELS) else None


def prepares_at_first_use() -> bool:
    """Whether using the pair here prepares it when it is not prepared: not switched off, and both
    GGUF files can be had (their packages installed, or pip there to fetch SmolLM2)."""
    return os.environ.get("CALM_REAL_PAIR_AUTO", "1") != "0" and all(
        weight_sources.available(source) for _, _, source in MODELS.values())


def display_name(path) -> str:
    """"Gemma 3 270M (base)" for a prepared folder, else the folder's own name."""
    for title, folder, _ in MODELS.values():
        if Path(path).name == folder:
            return title
    return Path(path).name


@contextlib.contextmanager
def _locked(root: Path, log):
    """One preparation per cache folder at a time, across threads and processes (flock on a file)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a") as handle:
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log("another session is preparing the real pair; waiting for it ...")
                fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def prepare(root: Path | None = None, force: bool = False, log=print, progress=None) -> dict[str, Path]:
    """Convert both GGUF files into model folders under root (once; force redoes it).
    progress(fraction, message), if given, hears each step."""
    from .loading import load_causal_lm

    root = root or cache_dir()
    report = lambda fraction, message: (log(message), progress and progress(fraction, message))
    done = 0.0
    with _locked(root, lambda message: report(0.0, message)):
        work = root / "gguf"
        for key, (title, folder, source) in MODELS.items():
            target, share = root / folder, SHARE[key]
            if _is_prepared(key, root) and not force:
                done += share
                report(done, f"{title}: ready in {target}")
                continue
            started = time.perf_counter()
            report(done, f"{title}: getting its GGUF file and checking its sha256 ...")
            gguf = weight_sources.obtain(source, work, log)
            report(done + 0.05 * share, f"{title}: converting {gguf.name} to float32 (about "
                                        f"{round(110 * share, -1):.0f} s on 2 cores) ...")
            model, tokenizer = load_causal_lm(str(gguf))
            report(done + 0.85 * share, f"{title}: writing the model folder ...")
            partial = root / (folder + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            del model
            marker = {"title": title, "gguf": gguf.name, "sha256": source.sha256, "dtype": "float32"}
            (partial / MARKER).write_text(json.dumps(marker, indent=2))
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
            done += share
            report(done, f"{title}: written to {target} in {time.perf_counter() - started:.0f} s")
        shutil.rmtree(work, ignore_errors=True)  # the GGUF files written here (Gemma's 240 MB) are not needed any more
    return prepared_pair(root)


def ensure_prepared(progress=None, log=print) -> dict[str, Path]:
    """The prepared pair; prepared first where it is not (once per cache folder, about 2 min on 2 cores)."""
    folders = prepared_pair()
    if folders is not None:
        return folders
    if os.environ.get("CALM_REAL_PAIR_AUTO", "1") == "0":
        raise ModelLoadError("The real pair is not prepared on this server, and preparing it at first use is off "
                             f"(CALM_REAL_PAIR_AUTO=0). Prepare it once with: {PREPARE_COMMAND}")
    return prepare(log=log, progress=progress)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calm_core.models.real_pair",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help=f"cache folder (default {cache_dir()})")
    parser.add_argument("--force", action="store_true", help="convert again even if prepared")
    args = parser.parse_args(argv)
    try:
        folders = prepare(args.dir, args.force)
    except ModelLoadError as exc:
        raise SystemExit(f"error: {exc}") from exc
    for key, folder in folders.items():
        print(f"{key}: {folder}")


if __name__ == "__main__":
    main()
