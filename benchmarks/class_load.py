"""A class at once (issue 40, item 3): four sessions on one app process, one of them training the real preset.

    python -m benchmarks.class_load                     # the real preset trains; about 6 minutes on 2 cores
    python -m benchmarks.class_load --smoke             # the tiny test preset everywhere (tests/test_class_load.py)

app.py is started as a server would run it (its own defaults: training runs at once follow the processors), then,
each through its own gradio_client session:
  A  picks the real preset, starts over with a closed bridge and trains (--steps);
  B, C, D chat (B on the real preset, C and D on the toy presets), --rounds replies each, first with the app idle,
     then while A trains; a reply's time is from sending to the whole reply;
  E  asks to train while A does: it must be told, at once, when it can start.
Reported (one JSON line, and --out): each chatting session's median reply time idle and under load and their ratio
(goal <= 2), the server's peak memory (goal <= 8 GiB), that B's composition answers as before (A's training never
touches it) and that no session lists another's runs, and E's answer with how long it took.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gradio_client import Client
from gradio_client.exceptions import AppError

from .app_process import AppDidNotStart, PeakMemory, free_port, stop, text_of, wait_until_answering

ROOT = Path(__file__).resolve().parents[1]
# chat options after (message, h_calm, h_anchor, h_augment): max_new_tokens, do_sample, temperature, top_k, top_p,
# seed, gate_scale, layers_off, mode
REAL = ("real_knowledge", "", 8, "chat")
TOYS = [("kv_arithmetic", "", 30, "completion"), ("translation", "", 48, "completion")]


def start_app(env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port),
               GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1", **env)
    env["CALM_MAX_RUNS"] = "1"  # one run at a time: the server's default on 2 processors, pinned here
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_answering(url, process, log, 180)
    except AppDidNotStart as exc:
        stop(process)
        raise SystemExit(str(exc)) from None
    return process, url


def session(url: str, preset: str) -> Client:
    client = Client(url, verbose=False)
    client.predict(preset, api_name="/use_preset")
    return client


def reply(client: Client, prompt: str, tokens: int, mode: str) -> tuple[float, str]:
    """(seconds, the composition's answer) for one greedy chat turn."""
    started = time.perf_counter()
    out = client.predict(prompt, [], [], [], tokens, False, 1.0, 0, 1.0, 0, 1.0, [], mode, api_name="/chat")
    return time.perf_counter() - started, text_of(out[0][-1])


def chatting(chatters, rounds: int) -> list[dict]:
    """Every chatter asks `rounds` times, all at once; per chatter the times and the answers."""
    results = [None] * len(chatters)

    def ask(k):
        client, (preset, prompt, tokens, mode) = chatters[k]
        asked = [reply(client, prompt, tokens, mode) for _ in range(rounds)]
        results[k] = {"preset": preset, "seconds": [round(s, 3) for s, _ in asked], "answers": [a for _, a in asked]}
    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(chatters))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results


def runs_listed(client: Client) -> int:
    return len(client.predict([], api_name="/runs")[1]["data"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120, help="A's training steps (long enough to outlast the chats)")
    parser.add_argument("--rounds", type=int, default=4, help="replies per chatting session, idle and under load")
    parser.add_argument("--smoke", action="store_true", help="the tiny preset everywhere (CALM_PRESETS_DIR)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "speed" / "class_load.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="class-load-"))
    env = {"CALM_RUNS_DIR": str(work / "runs")}
    real, toys, batch = REAL, TOYS, 16
    if args.smoke:
        real, toys, batch = ("tiny", "abcd=", 6, "completion"), [("tiny", "fed=", 6, "completion")] * 2, 4
    else:
        real, *toys = [(name, _first_prompt(name), tokens, mode) for name, _, tokens, mode in [real] + toys]
    process, url = start_app(env, work / "app.log")
    memory = PeakMemory(process.pid, every_s=0.2)
    memory.start()
    try:
        chatters = [(session(url, spec[0]), spec) for spec in [real] + toys]
        idle = chatting(chatters, args.rounds)
        trainer = session(url, real[0])
        trainer.predict(api_name="/reset_bridge")
        job = trainer.submit(args.steps, 2e-3, batch, api_name="/train")
        _until_a_step(job)
        loaded = chatting(chatters, args.rounds)
        still_training = not job.done()
        fifth = session(url, toys[0][0])
        asked = time.perf_counter()
        try:
            fifth.predict(5, 1e-3, 4, api_name="/train")
            refusal = "it trained: a place was free"
        except AppError as exc:
            refusal = str(exc)
        refusal_s = time.perf_counter() - asked
        if args.smoke:  # the tiny run would go on for long: its place is what was measured
            trainer.predict(api_name="/stop")
        status = job.result(timeout=3600)[0]
        listed = {"trainer": runs_listed(trainer), "chatters": [runs_listed(c) for c, _ in chatters]}
    finally:
        memory.stopped.set()
        stop(process, timeout_s=30)
    peak = memory.peak
    sessions = []
    for before, during in zip(idle, loaded):
        idle_s, load_s = statistics.median(before["seconds"]), statistics.median(during["seconds"])
        sessions.append({"preset": before["preset"], "idle_s": idle_s, "while_training_s": load_s,
                         "ratio": round(load_s / idle_s, 2), "same_answers": during["answers"] == before["answers"],
                         "idle_all_s": before["seconds"], "while_training_all_s": during["seconds"]})
    result = {"sessions": sessions, "worst_ratio": max(s["ratio"] for s in sessions),
              "chats_overlapped_training": still_training, "training_status": " ".join(status.split())[:600],
              "peak_server_mib": round(peak / 2**20), "runs_listed": listed,
              "fifth_training_request": refusal, "fifth_answered_in_s": round(refusal_s, 2),
              "goals": {"reply_ratio_at_most_2": max(s["ratio"] for s in sessions) <= 2,
                        "peak_at_most_8_gib": peak <= 8 * 2**30,
                        "isolated": all(s["same_answers"] for s in sessions) and listed["chatters"] == [0] * 3
                        and listed["trainer"] == 1,
                        "fifth_told_when": "can start" in refusal or "try again" in refusal},
              "cpu_count": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


def _first_prompt(preset: str) -> str:
    meta = json.loads((ROOT / "presets" / preset / "preset.json").read_text())
    return meta["example_prompts"][0]


def _until_a_step(job, seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while not any(o[0].startswith("Step") and not o[0].startswith("Step 0/") for o in job.outputs()):
        if job.done() or time.monotonic() > deadline:
            raise SystemExit(f"training did not start: {job.outputs()[-1:] or job.status()}")
        time.sleep(0.5)


if __name__ == "__main__":
    main()
