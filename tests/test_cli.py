"""The command line end to end on a tiny model pair: train, eval, generate, reload, errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from calm_core.cli import main

from .conftest import make_pair

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tokenizers):
    root = tmp_path_factory.mktemp("cli")
    for name, (arch, tok, seed) in {"anchor": ("gpt2", "char_bos", 1), "augment": ("llama", "bpe", 2)}.items():
        model, tokenizer = make_pair(arch, tokenizers[tok], layers=2, width=32, seed=seed)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    rows = [{"source": w + "=", "target": w[::-1]} for w in ["abcd", "bcda", "cdab", "dabc", "acbd", "bdac"] * 4]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def run_train(ws, out, *extra):
    return main(["train", "--anchor", str(ws / "anchor"), "--augment", str(ws / "augment"), "--every", "1",
                 "--data", str(ws / "data.jsonl"), "--column-map", "source=prompt,target=completion",
                 "--out", str(out), "--steps", "6", "--batch-size", "4", "--log-every", "2", "--eval-every", "3",
                 "--no-progress", *extra])


def test_train_eval_generate_and_reload(workspace, capsys):
    out = workspace / "run"
    assert run_train(workspace, out) == 0
    assert {p.name for p in out.iterdir()} >= {"config.json", "metrics.jsonl", "bridge", "checkpoints", "summary.json"}
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    assert json.loads((out / "config.json").read_text())["steps"] == 6
    capsys.readouterr()

    assert main(["eval", "--bridge", str(out / "bridge"), "--data", str(workspace / "data.jsonl"),
                 "--column-map", "source=prompt,target=completion", "--limit", "4", "--max-new-tokens", "4",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| CALM |" in printed and "chrf signature" in printed
    rows = json.loads((out / "eval.json").read_text())["rows"]
    assert len(rows) == 3

    assert main(["generate", "--bridge", str(out / "bridge"), "--prompt", "abcd=", "--max-new-tokens", "4"]) == 0
    generated = capsys.readouterr().out

    from calm_core import ComposedLM

    calm = ComposedLM.from_pretrained(out / "bridge")
    assert calm.generate("abcd=", max_new_tokens=4) + "\n" == generated
    assert any(g.abs().max() > 0 for g in calm.gates())


def test_bridge_shape_options_reach_the_saved_bridge(workspace):
    from calm_core import ComposedLM

    out = workspace / "run_shape"
    assert run_train(workspace, out, "--insert", "before", "--recency", "2", "--null-slot", "--window", "1") == 0
    config = ComposedLM.from_pretrained(out / "bridge").config
    assert (config.insert, config.recency, config.null_slot, config.window) == ("before", 2, True, 1)


def test_augment_noise_option_reaches_the_trainer(workspace):
    out = workspace / "run_noise"
    assert run_train(workspace, out, "--augment-noise", "0.5") == 0
    checkpoint = json.loads((out / "checkpoints" / "step-000006" / "bridge_config.json").read_text())
    assert checkpoint["train_config"]["augment_noise"] == 0.5
    assert run_train(workspace, workspace / "run_bad_noise", "--augment-noise", "-1") == 2


@pytest.mark.parametrize("args, recipe, scales", [
    ([], "plain", (1.0, 1.0, 1.0)),
    (["--recipe", "knowledge"], "knowledge", (5.0, 25.0, 1.0)),  # every=1 reads no final state: value path trains
    (["--recipe", "knowledge", "--gate-lr-scale", "2"], "knowledge", (2.0, 25.0, 1.0)),  # a given scale wins
    (["--recipe", "knowledge-varied"], "knowledge-varied", (5.0, 25.0, 1.0)),  # + the data tricks, said in the log
])
def test_recipe_option_starts_the_bridge_and_is_saved_with_it(workspace, tmp_path, capsys, args, recipe, scales):
    out = tmp_path / "run_recipe"
    assert run_train(workspace, out, *args) == 0
    saved = json.loads((out / "bridge" / "bridge_config.json").read_text())
    err = capsys.readouterr().err
    assert saved["recipe"]["name"] == recipe and f"recipe {recipe}" in err
    if recipe == "knowledge-varied":  # plain prompts get variants; no capitalised subject: that step says it cannot
        assert "question variants: " in err and "unknown subjects cannot apply" in err
    checkpoint = json.loads((out / "checkpoints" / "step-000006" / "bridge_config.json").read_text())["train_config"]
    assert (checkpoint["gate_lr_scale"], checkpoint["position_lr_scale"], checkpoint["value_lr_scale"]) == scales
    assert checkpoint["recipe"] == recipe


def test_yaml_config_and_command_line_precedence(workspace, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("steps: 4\nlr: 0.002\nwarmup_steps: 3\nseed: 5\n")
    assert run_train(workspace, tmp_path / "run", "--config", str(config), "--lr", "0.003") == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["lr"], saved["warmup_steps"], saved["seed"], saved["steps"]) == (0.003, 3, 5, 6)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["step"] == 6  # run_train's --steps wins
    (tmp_path / "bad.yaml").write_text("stepz: 3\n")
    assert run_train(workspace, tmp_path / "bad", "--config", str(tmp_path / "bad.yaml")) == 2


@pytest.mark.parametrize("args, message", [
    (["--column-map", "source=prompt"], "completion"),
    (["--anchor", "/no/such/model"], "Could not load model"),
])
def test_errors_are_one_message_not_a_traceback(workspace, tmp_path, capsys, args, message):
    base = ["train", "--anchor", str(workspace / "anchor"), "--augment", str(workspace / "augment"), "--every", "1",
            "--data", str(workspace / "data.jsonl"), "--out", str(tmp_path / "x"), "--steps", "1", "--no-progress"]
    if args[0] == "--column-map":
        base += args
    else:
        base[2] = args[1]
        base += ["--column-map", "source=prompt,target=completion"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_two_processes_match_one(workspace, tmp_path):
    """accelerate launch with 2 CPU processes (gloo) gives the bridge a 1-process run gives."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    common = ["train", "--anchor", str(workspace / "anchor"), "--augment", str(workspace / "augment"), "--every", "1",
              "--data", str(workspace / "data.jsonl"), "--column-map", "source=prompt,target=completion",
              "--steps", "4", "--batch-size", "8", "--no-progress", "--seed", "3"]
    one = subprocess.run([sys.executable, "-m", "calm_core", *common, "--out", str(tmp_path / "one")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          "-m", "calm_core", *common, "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "one" / "bridge" / "bridge.safetensors"), load_file(tmp_path / "two" / "bridge" / "bridge.safetensors")
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("method", ["lora", "finetune"])
def test_a_baseline_trains_from_the_command_line_at_the_bridges_parameter_count(workspace, tmp_path, method):
    from calm_core import load_causal_lm
    from calm_core.training.baselines import AnchorBaseline

    bridge_run, out = tmp_path / "calm", tmp_path / method
    assert run_train(workspace, bridge_run, "--steps", "1") == 0
    assert run_train(workspace, out, "--method", method) == 0
    summary = json.loads((out / "summary.json").read_text())
    bridge = json.loads((bridge_run / "summary.json").read_text())["trainable_parameters"]
    assert summary["method"] == method and summary["step"] == 6
    assert abs(summary["trainable_parameters"] - bridge) <= 0.5 * bridge
    baseline = AnchorBaseline.from_pretrained(out / "baseline", load_causal_lm(str(workspace / "anchor")))
    assert baseline.num_parameters()[0] == summary["trainable_parameters"]
    assert not (out / "bridge").exists()
