"""app.py as a separate process, for the benchmarks and tests that talk to it over HTTP: a free port, waiting until it
answers, stopping it, the peak memory of its process tree, and the text of a chat message it returned."""
from __future__ import annotations

import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil


class AppDidNotStart(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until_answering(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Returns once url answers; AppDidNotStart (with the log's tail) if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not answers(url):
        if process.poll() is not None:
            raise AppDidNotStart(f"app.py exited with code {process.returncode}:\n{log_path.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AppDidNotStart(f"app.py did not answer at {url} within {timeout_s:g} s:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.5)


def stop(process: subprocess.Popen, timeout_s: float = 15) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)


def tree_rss(pid: int) -> int:
    """Resident bytes of pid and all its descendants."""
    try:
        root = psutil.Process(pid)
        tree = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for member in tree:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakMemory(threading.Thread):
    """Polls tree_rss(pid) until stopped is set; peak holds the highest reading."""

    def __init__(self, pid: int, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak, self.stopped = pid, every_s, 0, threading.Event()

    def run(self):
        while not self.stopped.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self.stopped.wait(self.every_s)


def text_of(message: dict) -> str:
    """A chat message's text, whether its content came back as a string or as a list of parts."""
    content = message["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content if isinstance(p, dict))
