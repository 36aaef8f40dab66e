"""Tiny models and tokenizers, all built offline and seeded; and, under CI, no quiet skips (strict_ci.py)."""
import os

import pytest
import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.models.tiny import bpe_tokenizer, char_tokenizer, tiny_model

# one app server (tiny preset) for every module that asks for app_url: imported into each module, the fixture
# would start one server per module and keep them all until the session ends
from .app_server import app_url  # noqa: F401,E402

pytest_plugins = ["tests.strict_ci"]

# The suite's sessions (and the app servers it starts) train several runs at once on purpose; a 2-core server's own
# default is one run at a time (training_run.MAX_RUNS).
os.environ.setdefault("CALM_MAX_RUNS", "8")


@pytest.fixture(scope="session")
def preset_root(tmp_path_factory):
    """A presets folder holding the tiny preset (app_fixtures.write_tiny_preset); tests only read it."""
    from .app_fixtures import write_tiny_preset

    root = tmp_path_factory.mktemp("presets")
    write_tiny_preset(root)
    return root


@pytest.fixture(scope="session", autouse=True)
def runs_folder(tmp_path_factory):
    """Every LabSession of the suite (and the app servers it starts, through the environment) keeps its runs in the
    suite's own temporary folder, not in the machine's."""
    import os

    from calm_core.lab import run_store

    root = tmp_path_factory.mktemp("calm-lab-runs")
    os.environ["CALM_RUNS_DIR"] = str(root)
    before, run_store.RUNS_ROOT = run_store.RUNS_ROOT, root
    yield root
    run_store.RUNS_ROOT = before

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a small corpus for a tiny tokenizer",
    "naïve café, déjà vu: 12 + 30 = 42",
] * 4


@pytest.fixture(scope="session")
def tokenizers():
    """Named tokenizers: character level with and without BOS, byte-level BPE with and without."""
    return {
        "char_bos": char_tokenizer(add_bos=True),
        "char": char_tokenizer(add_bos=False),
        "bpe": bpe_tokenizer(CORPUS, vocab_size=320, add_bos=False),
        "bpe_bos": bpe_tokenizer(CORPUS, vocab_size=320, add_bos=True),
    }


def make_pair(arch, tokenizer, layers=2, width=32, heads=4, seed=0):
    return tiny_model(arch, len(tokenizer), layers=layers, width=width, heads=heads, seed=seed), tokenizer


def cache_pair(tokenizers, **config):
    """The Llama anchor (4 layers) + GPT-2 augmenting model (2) that the frozen-cache tests train twice, the cache
    off and on; the bridge seeded alike both times."""
    anchor = make_pair("llama", tokenizers["char_bos"], layers=4, width=32, seed=1)
    augment = make_pair("gpt2", tokenizers["bpe"], layers=2, width=24, seed=2)
    torch.manual_seed(0)
    return ComposedLM(anchor, [augment], CALMConfig(augment_layers=[0, 1], **config))


def assert_same_bridges(first: dict, second: dict):
    for name in first:
        torch.testing.assert_close(first[name], second[name], atol=1e-5, rtol=1e-4, msg=name)


def randomize_bridge(calm, seed=0, std=0.3):
    """Non-zero bridge weights and open gates, so that every path through the bridge matters."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in calm.bridge.named_parameters():
            if name.endswith("gate"):
                p.fill_(1.0)
            else:
                p.normal_(0, std)
    return calm


@pytest.fixture
def composed(tokenizers):
    """A GPT-2 anchor composed with a Llama augment that reads a different tokenizer."""
    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=4, width=32, seed=1)
    augment = make_pair("llama", tokenizers["bpe"], layers=4, width=24, seed=2)
    return ComposedLM(anchor=anchor, augments=[augment], config=CALMConfig(every=2))
