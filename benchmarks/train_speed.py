"""Training speed and memory of one system's step on batch x length tokens.

Systems:
  ours          Trainer (calm_core.training.trainer) without the augmenting-state cache: each step runs the
                augment (no grad, stopping at its deepest composition layer), the anchor with the
                bridge, backward into the bridge, clipping and AdamW on the bridge.
  ours_cached   the same Trainer with the cache: the augment's states are computed once per example
                (in the first, warm-up, step) and each step runs only the anchor and the bridge.
  anchor        the anchor alone: forward and backward to its inputs (no weight gradients), the
                frozen model's share of a composed step.
  peer          calm-pytorch's step (peer_calm_pytorch.py).

Each system is measured in a fresh process (`python -m benchmarks.train_speed SYSTEM ...`, one
JSON line out), so that its peak RSS is its own and memory that an earlier system freed to the
allocator cannot hide a later system's growth. The step time is the median after warm-up; RSS is
read after every step, and measure.growth_per_step turns the readings into a growth per step.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from calm_core.training.batches import token_losses
from calm_core.training.data import Example
from calm_core.training.trainer import TrainConfig, Trainer

from . import models, peer_calm_pytorch
from .measure import StepProbe

SYSTEMS = ("ours", "ours_cached", "anchor", "peer")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = 64  # rows the steps cycle through; the cached variant fills its cache for all in step 1


def ours_runner(calm, tok, batch: int, length: int, steps: int, callback, cache: bool):
    """Trainer.train() for `steps` steps, calling callback after each (log_every=1)."""
    examples = [Example("", text) for text in models.texts(tok, max(EXAMPLES, batch), length)]
    config = TrainConfig(steps=steps, batch_size=batch, lr=1e-4, warmup_steps=1, log_every=1, eval_every=10**9,
                         max_length=length, cache_augment_states=cache, progress=False)
    trainer = Trainer(calm, examples, None, config, callback=callback)
    assert all(len(row.anchor_ids) == length for row in trainer.train_rows), "every row must be `length` tokens"

    def run():
        result = trainer.train()
        assert result.augment_cache == cache and result.step == steps, result
    return run


def anchor_runner(anchor, tok, batch: int, length: int, steps: int, callback):
    """The anchor's forward and backward to its input embeddings (its weights are frozen), with
    the same loss as ours, on token ids of the same texts."""
    rows = models.token_ids(tok, max(EXAMPLES, batch), length)

    def run():
        for step in range(steps):
            ids = rows.roll(-step * batch, 0)[:batch]
            embeds = anchor.get_input_embeddings()(ids).detach().requires_grad_(True)
            token_losses(anchor(inputs_embeds=embeds).logits, ids).mean().backward()
            callback()
    return run


def runner(system: str, shapes: models.Shapes, batch: int, length: int, steps: int, callback,
           setup: models.Setup | None = None):
    """A zero-argument function running `steps` steps of `system`, calling callback after each.
    Only what the system needs is built (so that its memory is its own), unless setup is given."""
    tok = models.tokenizer(shapes.vocab)
    if system in ("ours", "ours_cached"):
        calm = (setup or models.build(shapes)).calm
        return ours_runner(calm, tok, batch, length, steps, callback, cache=system == "ours_cached")
    if system == "anchor":
        anchor = setup.anchor if setup else models.anchor_model(shapes)
        return anchor_runner(anchor, tok, batch, length, steps, callback)
    if system == "peer":
        peer = peer_calm_pytorch.build(shapes, models.layer_pairs(shapes))
        return peer_calm_pytorch.train_runner(peer, models.token_ids(tok, batch, length + 1), steps, callback)
    raise ValueError(f"Unknown system {system!r}; choose from {SYSTEMS}.")


def measure(system: str, shapes: models.Shapes, batch: int, length: int, steps: int, warmup: int,
            setup: models.Setup | None = None) -> dict:
    """Run warmup + steps steps of one system in this process and summarise them."""
    probe = StepProbe()
    run = runner(system, shapes, batch, length, warmup + steps, probe, setup)
    probe.start()
    run()
    return probe.summary(warmup, batch * length)


def child_args(system: str, shapes: models.Shapes, batch: int, length: int, steps: int, warmup: int,
               threads: int) -> list[str]:
    """The command line of main() that measures one system as measure() would."""
    return [system, "--shapes", shapes.name, "--batch", str(batch), "--length", str(length), "--steps", str(steps),
            "--warmup", str(warmup), "--threads", str(threads)]


def measure_isolated(system: str, shapes: models.Shapes, batch: int, length: int, steps: int, warmup: int,
                     threads: int) -> dict:
    """measure() in a fresh Python process; see the module docstring for why."""
    args = child_args(system, shapes, batch, length, steps, warmup, threads)
    command = [sys.executable, "-m", "benchmarks.train_speed", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.train_speed {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("system", choices=SYSTEMS)
    parser.add_argument("--shapes", choices=sorted(models.SHAPES), default="full")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = models.SHAPES[args.shapes]
    print(json.dumps(measure(args.system, shapes, args.batch, args.length, args.steps, args.warmup)))


if __name__ == "__main__":
    main()
