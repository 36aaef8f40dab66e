"""The benchmark suite (benchmarks/) at a microscopic size, so that its code does not rot between runs.

Numbers are not checked, only that every piece runs and reports; calm-pytorch's rows are skipped
with a note when it is not installed.
"""
import json

import torch

from benchmarks import measure, models, peer_calm_pytorch, run, train_speed


def test_growth_per_step_sees_a_leak_and_not_a_swing():
    leak = [100 + 2 * i for i in range(40)]
    swing = [100 + (10 if i % 3 == 0 else 0) for i in range(40)]
    assert abs(measure.growth_per_step(leak) - 2) < 1e-9
    assert abs(measure.growth_per_step(swing)) < 0.5


def test_tiny_quick_run_writes_tables_json_and_goals(tmp_path, capsys):
    out = tmp_path / "latest.json"
    run.main(["--tiny", "--quick", "--threads", str(torch.get_num_threads()), "--out", str(out)])
    results = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "### Goals" in printed and "### Training step" in printed
    for system in ("ours", "ours_cached", "anchor"):
        assert results["training"][system]["tokens_per_s"] > 0
    for system in ("ours", "ours_uncached", "anchor_hf", "augment_hf", "ours_char", "char_augment_hf"):
        assert results["generation"][system]["tokens_per_s"] > 0
    assert [r["length"] for r in results["scaling"]["context"]] == [16, 32]
    assert [r["every"] for r in results["scaling"]["composition_layers"]] == [1, 8]
    assert len(results["goals"]) == 5
    peer_rows = (results["training"]["peer"], results["generation"]["peer"])
    if peer_calm_pytorch.unavailable():
        assert all("skipped" in r for r in peer_rows) and "SKIP" in printed
    else:
        assert all(r["tokens_per_s"] > 0 for r in peer_rows)
        assert results["parameters"]["calm-pytorch"]["trainable"] > 0


def test_a_fresh_process_gets_the_arguments_it_understands(capsys):
    """measure_isolated() runs train_speed.main() in a child process; here the same command line runs in
    this one (a child would pay the imports again, longer than this whole file)."""
    threads = torch.get_num_threads()
    train_speed.main(train_speed.child_args("anchor", models.TINY, 2, 16, steps=2, warmup=1, threads=threads))
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 2 and result["peak_rss_mib"] > 0
