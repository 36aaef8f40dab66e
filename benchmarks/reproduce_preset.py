"""Reproduce a preset in class time (issue 38, item 3): the app's own calls, as a student presses them.

    python -m benchmarks.reproduce_preset kv_arithmetic            # goal: >= 90% on held-out keys in <= 10 min
    python -m benchmarks.reproduce_preset real_knowledge           # goal: >= 80% on held-out people in <= 10 min

`lab.use_preset(name); lab.reset_bridge(); lab.start_training(lab.train_config()); lab.wait()` (the Train tab with
untouched fields: the preset's recipe and recorded settings), timed from pressing Train to the end (the recipe's
start and the frozen-state cache included); then `lab.calm.generate` on the preset's held-out set, scored
as its table is. Prints one JSON line; --steps runs fewer steps (a smoke run, not the goal)."""
from __future__ import annotations

import argparse
import json
import time

import torch

from calm_core.lab import LabSession
from calm_core.training.data import DataConfig, load_examples
from calm_core.training.evaluation import SCORERS


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int, help="instead of the preset's (exploring class-time settings)")
    parser.add_argument("--lr", type=float, help="instead of the preset's")
    parser.add_argument("--bf16", choices=["on", "off"], help="instead of the preset's precision")
    parser.add_argument("--limit", type=int, default=None, help="held-out examples scored (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lab = LabSession()
    preset = lab.use_preset(args.preset)
    lab.reset_bridge()
    changes = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size), ("lr", args.lr)) if v}
    if args.bf16:
        changes["bf16"] = args.bf16 == "on"
    config = lab.train_config(**changes)
    started = time.perf_counter()
    lab.start_training(config)
    lab.wait()
    train_s = time.perf_counter() - started
    label = next((n for n in preset.eval_files if "held-out" in n), next(iter(preset.eval_files)))
    path = preset.eval_files[label]
    examples, _, _ = load_examples(path, DataConfig())
    examples = examples[:args.limit] if args.limit else examples
    prompts = [e.prompt for e in examples]
    tokens = preset.eval_max_new_tokens or preset.max_new_tokens
    answers = []
    for i in range(0, len(prompts), 32):
        answers += lab.calm.generate(prompts[i:i + 32], max_new_tokens=tokens)
    score = SCORERS[preset.scoring(label)]
    exact = 100 * sum(score(a) == score(e.completion) for a, e in zip(answers, examples)) / len(examples)
    values = [json.loads(line).get("value") for line in open(path) if line.strip()][:len(examples)]
    named = None
    if all(values):  # sentence answers with the fact in a "value" column: the value named in the first line too
        from demos.real_knowledge.scoring import names

        named = round(100 * sum(names(a, v) for a, v in zip(answers, values)) / len(examples), 1)
    result = {"preset": args.preset, "recipe": config.recipe, "steps": config.steps, "batch_size": config.batch_size,
              "lr": config.lr, "bf16": config.bf16, "train_wall_s": round(train_s, 1), "set": label,
              "examples": len(examples), "exact_match": round(exact, 1), "value_named": named, "message": lab.run.message,
              "accuracy_curve": [(p["step"], round(p["exact_match"], 1)) for p in lab.run.accuracy]}
    result["machine"] = machine(args.threads)
    print(json.dumps(result))
    return result


def machine(threads: int) -> str:
    """The CPU the times were taken on (times differ about 2x between the machines this project has run on)."""
    import re
    from pathlib import Path

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = re.search(r"model name\s*:\s*(.*)", info)
    return (f"{model.group(1).strip() if model else 'unknown CPU'}, {threads} threads, "
            f"{torch.backends.cpu.get_cpu_capability()}")


if __name__ == "__main__":
    main()
