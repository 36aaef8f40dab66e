"""CALM benchmark suite: our composition against the frozen models alone and against calm-pytorch.

    pip install -r benchmarks/requirements.txt     # the peer, calm-pytorch 0.2.2 (optional)
    python benchmarks/run.py [--quick] [--out PATH] [--threads 2]
    python benchmarks/run.py --profile             # where the time of our step and generation goes

Same two models for every system (benchmarks/models.py): anchor GPT-2 12 x 256 (8 heads),
augment GPT-2 8 x 192 (6 heads), vocab 512, composition every 4th augmenting layer. Measured:
training tokens/s, peak RSS and RSS growth per step (batch 8 x 128; train_speed.py), greedy
generation tokens/s (64 new tokens from 32, batch 1; gen_speed.py), scaling with context length
and composition layers (scaling.py), trainable parameters; then the issue-6 goals as ratios
within this run (report.py). Prints markdown, writes JSON. Without calm-pytorch its rows and goals
are skipped. The default run is sized for under 10 minutes on 2 quiet cores, --quick for under 2;
--tiny swaps in microscopic models to check that the code runs (its numbers mean nothing).
Timings taken beside other heavy jobs are not comparable.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path[0] == str(ROOT / "benchmarks"):  # run as a script: import the package, not its files as top-level modules
    sys.path[0] = str(ROOT)

import torch  # noqa: E402  (after the path fix above)
import transformers  # noqa: E402

from benchmarks import gen_speed, measure, models, peer_calm_pytorch, profiling, report, scaling, train_speed  # noqa: E402


@dataclasses.dataclass
class Settings:
    shapes: str = "full"
    threads: int = 2
    quick: bool = False
    batch: int = 8
    length: int = 128
    warmup: int = 2  # untimed steps; the cached variant fills its cache in the first
    steps: int = 10  # timed steps of the anchor and calm-pytorch
    memory_steps: int = 200  # timed steps of ours, with and without the cache: the memory check
    prompt_tokens: int = 32
    new_tokens: int = 64
    repeats: int = 5  # timed generations per system, after one warm-up
    lengths: tuple = (128, 512, 2048)
    tokens_per_step: int = 1024  # scaling: 8 x 128, 2 x 512, 1 x 2048
    everys: tuple = (1, 2, 4, 8)
    scaling_steps: int = 3
    scaling_repeats: int = 2


QUICK_SETTINGS = dict(quick=True, warmup=1, steps=3, memory_steps=10, repeats=1, lengths=(128, 512),
                      tokens_per_step=512, everys=(1, 8), scaling_steps=1, scaling_repeats=1)
TINY_SETTINGS = dict(shapes="tiny", batch=2, length=16, prompt_tokens=8, new_tokens=8, lengths=(16, 32),
                     tokens_per_step=32)


def parse(argv: list[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few steps and repeats, two scaling points each")
    parser.add_argument("--tiny", action="store_true",
                        help="microscopic models and batches, training measured in this process: checks the code, not the speed")
    parser.add_argument("--profile", action="store_true", help="only profile our training step and generation")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-steps", type=int, help="timed steps of ours (default 200, 10 with --quick)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "latest.json")
    args = parser.parse_args(argv)
    chosen = {**(QUICK_SETTINGS if args.quick else {}), **(TINY_SETTINGS if args.tiny else {})}
    settings = Settings(threads=args.threads, **chosen)
    if args.memory_steps is not None:
        settings.memory_steps = args.memory_steps
    longest = max(settings.lengths) + settings.new_tokens
    if longest > models.SHAPES[settings.shapes].max_positions:
        parser.error(f"the longest scaling prompt plus new tokens ({longest}) exceeds the models' positions")
    return settings, args


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def training(s: Settings, shapes: models.Shapes, peer_missing: str | None) -> dict:
    out = {}
    for system in train_speed.SYSTEMS:
        if system == "peer" and peer_missing:
            out[system] = {"skipped": peer_missing}
            continue
        steps = s.memory_steps if system.startswith("ours") else s.steps
        if shapes is models.TINY:  # a fresh process per system costs more than the tiny runs; memory means nothing here
            progress(f"training: {system}, {s.warmup} + {steps} steps in this process")
            out[system] = train_speed.measure(system, shapes, s.batch, s.length, steps, s.warmup)
        else:
            progress(f"training: {system}, {s.warmup} + {steps} steps in a fresh process")
            out[system] = train_speed.measure_isolated(system, shapes, s.batch, s.length, steps, s.warmup, s.threads)
    return out


def parameters(setup: models.Setup, peer) -> dict:
    trainable, total = setup.calm.num_parameters()
    count = lambda m: sum(p.numel() for p in m.parameters())
    out = {"ours": {"trainable": trainable, "total": total, "anchor": count(setup.anchor), "augment": count(setup.augment)}}
    if peer is not None:
        out["calm-pytorch"] = peer_calm_pytorch.parameters(peer)
    return out


def environment() -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "memory_reading": "psutil" if measure.psutil is not None else "/proc/self/statm"}
    if not peer_calm_pytorch.unavailable():
        env.update(peer_calm_pytorch.versions())
    return env


def notes(s: Settings) -> list[str]:
    return [
        "Tokens/s count input tokens (batch x length) for every system. Ours is Trainer.train() (calm_core/training.py), "
        "so its step includes collation, clipping, the LR schedule and one logged record per step (log_every=1); "
        "its RSS growth includes Trainer.history keeping those records.",
        f"Ours runs {s.memory_steps} timed training steps per variant (the memory check), the anchor and calm-pytorch "
        f"{s.steps}; each system runs in a fresh process, so its peak RSS (Python, torch, its models) is its own "
        "(except with --tiny, which measures in one process).",
        "The anchor-alone step is forward plus backward to its input embeddings: no weight gradients, no optimizer.",
        "Scaling is ours only; calm-pytorch has no KV cache, so long prompts would take minutes per generation.",
        "Timings taken beside other heavy jobs are not comparable; the goals are ratios within one run.",
    ]


def main(argv: list[str] | None = None):
    s, args = parse(argv)
    torch.set_num_threads(s.threads)
    shapes, started = models.SHAPES[s.shapes], time.perf_counter()
    if args.profile:
        setup = models.build(shapes)
        print(profiling.report(setup, s.batch, s.length, s.prompt_tokens, s.new_tokens))
        return
    peer_missing = peer_calm_pytorch.unavailable()
    if peer_missing:
        progress(f"calm-pytorch rows skipped: {peer_missing}")
    elapsed = {}

    results = {"settings": dataclasses.asdict(s), "environment": environment()}
    results["training"] = training(s, shapes, peer_missing)
    elapsed["training"] = time.perf_counter() - started

    setup = models.build(shapes)
    peer = None if peer_missing else peer_calm_pytorch.build(shapes, models.layer_pairs(shapes))
    results["models"] = {"anchor": "GPT-2 {} layers x {} ({} heads)".format(*shapes.anchor),
                         "augment": "GPT-2 {} layers x {} ({} heads)".format(*shapes.augment),
                         "vocab": shapes.vocab, "pairs": models.layer_pairs(shapes)}
    results["parameters"] = parameters(setup, peer)

    progress("generation")
    text, ids = models.prompt(setup.tokenizer, s.prompt_tokens)
    results["generation"] = gen_speed.measure(setup.calm, text, ids, s.new_tokens, s.repeats, peer,
                                              models.compose_char_augment(setup))
    if peer_missing:
        results["generation"]["peer"] = {"skipped": peer_missing}
    elapsed["generation"] = time.perf_counter() - started - sum(elapsed.values())

    progress(f"scaling: context lengths {s.lengths}")
    # One warm-up step is enough here: scaling trains without the cache.
    results["scaling"] = {"context": scaling.context(setup, s.lengths, s.tokens_per_step, s.new_tokens, s.scaling_steps,
                                                     1, s.scaling_repeats)}
    progress(f"scaling: composition every {s.everys} augmenting layers")
    results["scaling"]["composition_layers"] = scaling.composition_layers(
        setup, s.everys, s.batch, s.length, s.prompt_tokens, s.new_tokens, s.scaling_steps, 1, s.scaling_repeats)
    elapsed["scaling"] = time.perf_counter() - started - sum(elapsed.values())
    elapsed["total"] = time.perf_counter() - started

    results["goals"] = report.goals(results)
    results["peer"] = {"differences": peer_calm_pytorch.differences(shapes, s.batch, s.length), "skipped": peer_missing}
    results["notes"] = notes(s) + [f"Elapsed: {', '.join(f'{k} {v:.0f} s' for k, v in elapsed.items())}."]
    results["elapsed_s"] = elapsed
    report.write_json(results, args.out)
    print(report.markdown(results))
    progress(f"wrote {args.out}")


if __name__ == "__main__":
    main()
