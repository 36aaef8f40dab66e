"""Command line: python -m calm_core {train,eval,generate} ...

Every run writes into --out: config.json (the resolved options), metrics.jsonl, the final
bridge (bridge/), checkpoints/ and eval.json, so runs can be compared and reloaded.
Errors a user can act on (CALMError) are printed as one message, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .engine.config import GATE_TYPES, INSERT_POINTS, CALMConfig
from .errors import CALMError


def _add_models(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--anchor", required=required, help="anchor model: hub id or local folder")
    p.add_argument("--augment", action="append", default=None, help="augmenting model (repeat for several)")
    p.add_argument("--augment-adapter", action="append", default=None,
                   help="a LoRA folder merged into the augmenting model of the same position ('' for none)")
    p.add_argument("--bridge", help="a saved bridge folder (its config names the models unless given)")
    p.add_argument("--dtype", default=None, choices=[None, "float32", "bfloat16", "float16"])
    p.add_argument("--trust-remote-code", action="store_true", help="run model code from the hub (off by default)")


def _add_bridge_shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--anchor-layers", type=_int_list, default=None, help="e.g. 3,7,11")
    p.add_argument("--augment-layers", type=_int_list, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--gate", default="channel", choices=list(GATE_TYPES))
    p.add_argument("--insert", default="after", choices=list(INSERT_POINTS),
                   help="the bridge reads and writes each anchor layer's output (after) or input (before)")
    p.add_argument("--recency", type=int, default=0,
                   help="learned cross-attention biases per head for the N newest augmenting states (0: none)")
    p.add_argument("--null-slot", action="store_true",
                   help="a learned null key (zero value) in the cross-attention: the bridge may write nothing")
    p.add_argument("--window", type=int, default=0,
                   help="each anchor token attends only to the N newest augmenting states (0: all visible)")
    p.add_argument("--no-norm", action="store_true", help="no RMS norm on the augmenting states the bridge reads")
    p.add_argument("--relative", action="store_true",
                   help="each block writes in units of the anchor stream's RMS where it writes (real models' upper "
                        "layers run 10-100x larger than their lower ones)")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _column_map(text: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected column=role pairs like source=prompt,target=completion, got {text!r}")
    return {k.strip(): v.strip() for k, v in pairs}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m calm_core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a bridge on a data file")
    _add_models(train, required=False)
    _add_bridge_shape(train)
    train.add_argument("--data", help="training file: csv, jsonl, json, parquet or txt")
    train.add_argument("--validation", help="validation file (default: a seeded split of --data)")
    train.add_argument("--column-map", type=_column_map, default=None, help="e.g. source=prompt,target=completion")
    train.add_argument("--validation-fraction", type=float, default=0.1)
    train.add_argument("--out", help="output folder for this run")
    train.add_argument("--config", help="YAML file with any of these options (command-line options win)")
    train.add_argument("--resume", help="checkpoint folder to continue from")
    train.add_argument("--method", choices=("calm", "lora", "finetune"), default="calm",
                       help="what is trained: the bridge (calm), or the anchor itself with as many trainable parameters "
                            "as that bridge would have: a LoRA on it (lora) or its top layers (finetune)")
    from .training.config import TrainConfig

    defaults = TrainConfig()
    for name in ("steps", "batch_size", "grad_accum", "warmup_steps", "log_every", "eval_every", "checkpoint_every", "seed",
                 "accuracy_examples"):
        train.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    for name in ("lr", "augment_noise", "weight_decay", "grad_clip", "cache_budget_mb", "accuracy_share"):
        train.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name))
    from .training.recipes import RECIPES, describe

    train.add_argument("--recipe", choices=tuple(RECIPES), default="plain",
                       help="how a new bridge starts and trains; its learning-rate scales unless given below. "
                            + describe().replace("%", "%%"))
    for name in ("gate_lr_scale", "position_lr_scale", "value_lr_scale"):
        train.add_argument("--" + name.replace("_", "-"), type=float, default=None, help="default: the recipe's")
    from .training.evaluation import SCORERS

    train.add_argument("--accuracy-scoring", choices=tuple(SCORERS), default="exact",
                       help="how the held-out answers checked while training are compared with their references")
    train.add_argument("--max-length", type=int, default=None)
    train.add_argument("--bf16", action="store_true")
    train.add_argument("--no-augment-cache", action="store_true", help="recompute augmenting states every step")
    train.add_argument("--no-progress", action="store_true")

    ev = sub.add_parser("eval", help="evaluate anchor, augments and composition on a data file")
    _add_models(ev, required=False)
    _add_bridge_shape(ev)
    ev.add_argument("--data", required=True)
    ev.add_argument("--column-map", type=_column_map, default=None)
    ev.add_argument("--metrics", default="exact_match,chrf,bleu,loss")
    ev.add_argument("--max-new-tokens", type=int, default=32)
    ev.add_argument("--limit", type=int, default=None, help="evaluate the first N examples only")
    ev.add_argument("--out", help="write eval.json here")

    gen = sub.add_parser("generate", help="generate with a composed model")
    _add_models(gen, required=False)
    _add_bridge_shape(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--do-sample", action="store_true")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--gate-scale", type=float, default=1.0)
    return parser


def _parse(argv) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "config", None):
        from .cli_config import apply_config_file

        apply_config_file(parser, args, argv)
    return args


def _calm_config(args) -> CALMConfig:
    return CALMConfig(every=args.every, anchor_layers=args.anchor_layers, augment_layers=args.augment_layers,
                      num_heads=args.heads, gate=args.gate, insert=args.insert,
                      recency=args.recency, null_slot=args.null_slot, window=args.window,
                      relative=args.relative, norm=not args.no_norm)


def _dtype(name):
    import torch

    return None if name is None else getattr(torch, name)


def load_composition(args):
    """The composed model a command works on: a saved bridge, or fresh models and a new bridge."""
    from .engine.compose import ComposedLM
    from .models.loading import load_causal_lm

    options = dict(dtype=_dtype(args.dtype), trust_remote_code=args.trust_remote_code)
    if args.bridge:
        anchor = load_causal_lm(args.anchor, **options) if args.anchor else None
        augments = [load_causal_lm(name, **options) for name in args.augment or []] if args.anchor else None
        return ComposedLM.from_pretrained(args.bridge, anchor=anchor, augments=augments, **options)
    if not args.anchor or not args.augment:
        raise CALMError("Give --anchor and at least one --augment, or a saved --bridge.")
    adapters = list(args.augment_adapter or [])
    if not any(adapters):
        return ComposedLM.from_names(args.anchor, args.augment, _calm_config(args), **options)
    from .models.adapters import merge_adapter

    augments = [load_causal_lm(name, **options) for name in args.augment]
    augments = [(merge_adapter(m, a), t) if a else (m, t) for (m, t), a in zip(augments, adapters + [""] * len(augments))]
    return ComposedLM(load_causal_lm(args.anchor, **options), augments, _calm_config(args))


def _data_config(args):
    from .training.data import DataConfig

    return DataConfig(column_map=args.column_map, validation_fraction=getattr(args, "validation_fraction", 0.1),
                      seed=getattr(args, "seed", 0) or 0)


def cmd_train(args) -> int:
    from .engine.persistence import save_bridge
    from .training.data import load_splits
    from .training.examples import read_jsonl, write_jsonl
    from .training.trainer import TrainConfig, Trainer

    for needed in ("data", "out"):
        if not getattr(args, needed):
            raise CALMError(f"train needs --{needed}.")
    out = Path(args.out)
    splits = load_splits(args.data, args.validation, _data_config(args))
    import torch

    torch.manual_seed(args.seed)  # the bridge's initial weights
    calm = load_composition(args) if not args.resume else _resume_composition(args)
    if args.method != "calm":
        from .training.baselines import AnchorBaseline

        if args.resume:
            raise CALMError("--resume is for bridges; train a baseline again from the start.")
        calm = AnchorBaseline((calm.anchor.model, calm.anchor.tokenizer), args.method, calm.num_parameters()[0])
    from .training import recipes

    recipe, examples = recipes.get_recipe(args.recipe), list(splits.train)
    scales = {k: v if getattr(args, k) is None else getattr(args, k) for k, v in recipe.train_fields().items()}
    extra_path = Path(args.resume).parent.parent / "extra_examples.jsonl" if args.resume else None
    if extra_path is not None and extra_path.is_file():  # the rows the run's recipe added when it started
        examples += read_jsonl(extra_path)
    elif args.method == "calm" and recipes.is_new(calm):  # a new bridge starts the recipe's way
        changes, extra, notes = recipes.prepare(calm, recipe, examples, seed=args.seed)
        scales, examples = {**scales, **changes}, examples + extra
        print("; ".join(notes), file=sys.stderr)
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(out / "extra_examples.jsonl", extra)
    config = TrainConfig(method=args.method, recipe=recipe.name, **scales,
        steps=args.steps, lr=args.lr, augment_noise=args.augment_noise,
        batch_size=args.batch_size, grad_accum=args.grad_accum,
        warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
        log_every=args.log_every, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
        seed=args.seed, bf16=args.bf16, max_length=args.max_length, cache_augment_states=not args.no_augment_cache,
        accuracy_examples=args.accuracy_examples, accuracy_share=args.accuracy_share,
        accuracy_scoring=args.accuracy_scoring,
        cache_budget_mb=args.cache_budget_mb, out_dir=str(out), progress=not args.no_progress,
    )
    trainer = Trainer(calm, examples, splits.validation, config)
    if trainer.dist.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        record = {k: v for k, v in vars(args).items() if k != "func"}
        record.update(train_examples=len(splits.train), validation_examples=len(splits.validation), data_shape=splits.shape)
        (out / "config.json").write_text(json.dumps(record, indent=2, default=str))
    if args.resume:
        trainer.resume(args.resume)
    if trainer.truncated:
        print(f"note: {trainer.truncated} examples were longer than the models' context and were truncated", file=sys.stderr)
    result = trainer.train()
    if trainer.dist.rank == 0:
        saved = out / ("bridge" if args.method == "calm" else "baseline")
        calm.save_trained(saved) if args.method != "calm" else save_bridge(calm, saved)
        summary = {"method": args.method, "trainable_parameters": calm.num_parameters()[0], "step": result.step, "stop_reason": result.stop_reason, "message": result.message,
                   "truncated": result.truncated, "augment_cache": result.augment_cache,
                   "cache_note": result.cache_note,
                   "final": result.history[-1] if result.history else None}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        last = result.history[-1] if result.history else {}
        print(f"{result.stop_reason} at step {result.step}: loss {last.get('loss')}, validation loss {last.get('val_loss')}; "
              f"{args.method} saved to {saved}")
        if result.message:
            print(result.message, file=sys.stderr)
    return 0 if result.stop_reason != "diverged" else 1


def _resume_composition(args):
    args.bridge = args.bridge or args.resume
    return load_composition(args)


def cmd_eval(args) -> int:
    from .training.data import load_examples
    from .training.evaluation import evaluate

    calm = load_composition(args)
    examples, _, _ = load_examples(args.data, _data_config(args))
    if args.limit:
        examples = examples[: args.limit]
    from tqdm.auto import tqdm

    with tqdm(desc="evaluating", unit="answer") as bar:
        def progress(done, total):
            bar.total = total
            bar.n = done
            bar.refresh()

        table = evaluate(calm, examples, [m.strip() for m in args.metrics.split(",") if m.strip()],
                         args.max_new_tokens, progress)
    print(table.to_markdown())
    for name, signature in table.signatures.items():
        print(f"{name} signature: {signature}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "eval.json").write_text(json.dumps(
            {"rows": table.rows, "signatures": table.signatures, "predictions": table.predictions, "data": args.data}, indent=2))
    return 0


def cmd_generate(args) -> int:
    calm = load_composition(args)
    with calm.gate_scale(args.gate_scale):
        for piece in calm.stream(args.prompt, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed):
            print(piece, end="", flush=True)
    print()
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
        return {"train": cmd_train, "eval": cmd_eval, "generate": cmd_generate}[args.command](args)
    except CALMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
