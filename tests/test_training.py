"""The trainer: learning, stopping, checkpoints, exact resume, divergence, truncation."""
import copy
import math
import random

import pytest
import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.engine.bridge import noisy_augment_states
from calm_core.training.anchor_targets import anchor_kl_losses
from calm_core.training.batches import collate, predicting_positions, prepare, token_losses
from calm_core.training.data import Example
from calm_core.training.trainer import TrainConfig, Trainer, parameter_role

from .conftest import assert_same_bridges, cache_pair, make_pair, randomize_bridge


def reverse_task(n, seed):
    """A tiny learnable task: write the letters of the prompt backwards."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdef") for _ in range(4)) for _ in range(n)]
    return [Example(w + "=", w[::-1]) for w in words]


@pytest.fixture
def calm(tokenizers):
    anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=32, seed=1)
    augment = make_pair("llama", tokenizers["bpe"], layers=2, width=24, seed=2)
    return ComposedLM(anchor, [augment], CALMConfig(every=1))


def config(**kw):
    base = dict(steps=30, lr=3e-3, batch_size=8, warmup_steps=5, log_every=10, eval_every=10, progress=False)
    return TrainConfig(**{**base, **kw})


def test_training_lowers_validation_loss_and_opens_the_gates(calm):
    seen = []
    trainer = Trainer(calm, reverse_task(120, 0), reverse_task(24, 1), config(steps=60, accuracy_examples=0),
                      callback=seen.append)  # no probe: its checks add records when due, a matter of timing
    before = trainer.validation_loss()
    result = trainer.train()
    assert result.stop_reason == "finished" and result.step == 60
    assert result.history[-1]["val_loss"] < before - 0.1
    assert all(g > 0 for g in result.history[-1]["gates"])
    assert [r["step"] for r in seen] == [10, 20, 30, 40, 50, 60]
    assert set(seen[0]) >= {"step", "loss", "val_loss", "lr", "gates", "tokens_per_s"}
    assert seen[0]["lr"] > seen[-1]["lr"]  # cosine decay


def test_stop_keeps_what_was_learned(calm, tmp_path):
    initial = {k: v.clone() for k, v in calm.bridge.state_dict().items()}
    trainer = None

    def stop_at_ten(record):
        if record["step"] == 10:
            trainer.request_stop()

    trainer = Trainer(calm, reverse_task(64, 0), None, config(steps=100, out_dir=str(tmp_path)), callback=stop_at_ten)
    result = trainer.train()
    assert result.stop_reason == "stopped" and result.step == 10
    assert any(not torch.equal(initial[k], v) for k, v in calm.bridge.state_dict().items())
    checkpoint = tmp_path / "checkpoints" / "step-000010"
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "bridge.safetensors", "bridge_config.json", "optimizer.safetensors", "trainer_state.json"]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize("cache, noise", [(False, 0.0), (True, 0.0), (True, 0.5)])
def test_resume_reaches_the_same_bridge(tokenizers, tmp_path, cache, noise):
    def fresh():
        anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=32, seed=1)
        augment = make_pair("llama", tokenizers["bpe"], layers=2, width=24, seed=2)
        torch.manual_seed(0)
        return ComposedLM(anchor, [augment], CALMConfig(every=1))

    train = reverse_task(40, 0)  # 40 examples, batch 8: the run crosses epochs
    whole = fresh()
    Trainer(whole, train, None, config(steps=20, cache_augment_states=cache, augment_noise=noise)).train()

    first = fresh()
    Trainer(first, train, None, config(steps=20, checkpoint_every=10, cache_augment_states=cache, augment_noise=noise,
                                       out_dir=str(tmp_path))).train()
    second = fresh()
    trainer = Trainer(second, train, None, config(steps=20, cache_augment_states=cache, augment_noise=noise))
    trainer.resume(tmp_path / "checkpoints" / "step-000010")
    assert trainer.step == 10
    trainer.train()
    for (name, a), b in zip(whole.bridge.state_dict().items(), second.bridge.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_gradient_accumulation_matches_one_big_batch(tokenizers):
    results = []
    for accum in (1, 4):
        anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=32, seed=1)
        augment = make_pair("llama", tokenizers["bpe"], layers=2, width=24, seed=2)
        torch.manual_seed(0)
        c = ComposedLM(anchor, [augment], CALMConfig(every=1))
        Trainer(c, reverse_task(32, 0), None, config(steps=5, grad_accum=accum, cache_augment_states=False)).train()
        results.append(c.bridge.state_dict())
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_augment_cache_is_used_when_it_fits_and_off_when_not(calm, caplog):
    fits = Trainer(calm, reverse_task(16, 0), None, config(steps=2)).train()
    assert fits.augment_cache and fits.cache_note.startswith("cache on")
    with caplog.at_level("WARNING", logger="calm_core.training.trainer"):
        over = Trainer(calm, reverse_task(16, 0), None, config(steps=2, cache_budget_mb=1e-6)).train()
    # off is said, with the size it needed, in the result and in the log: it costs both frozen models every step
    assert not over.augment_cache and "over cache_budget_mb" in over.cache_note and " MB" in over.cache_note
    assert over.cache_note in caplog.text
    unasked = Trainer(calm, reverse_task(16, 0), None, config(steps=2, cache_augment_states=False)).train()
    assert not unasked.augment_cache and "cache_augment_states=False" in unasked.cache_note


def test_divergence_restores_the_last_good_bridge(calm, monkeypatch):
    import calm_core.training.trainer as training

    trainer = Trainer(calm, reverse_task(32, 0), None, config(steps=30))
    real = training.row_losses
    monkeypatch.setattr(training, "row_losses",
                        lambda *args: real(*args) * (float("nan") if trainer.step >= 12 else 1.0))
    result = trainer.train()
    assert result.stop_reason == "diverged" and "lower learning rate" in result.message
    assert all(torch.isfinite(p).all() for p in calm.bridge.parameters())


def test_long_examples_are_truncated_and_counted(calm):
    long = [Example("", "abc " * 300)] + reverse_task(8, 0)
    trainer = Trainer(calm, long, None, config(steps=1, max_length=64))
    assert trainer.truncated == 1
    assert max(len(r.anchor_ids) for r in trainer.train_rows) == 64


def test_loss_is_taken_on_the_completion_only(calm):
    trainer = Trainer(calm, [Example("abc=", "cba")], None, config(steps=1))
    row = trainer.train_rows[0]
    tokens = [calm.anchor.tokenizer.convert_ids_to_tokens(i) for i, t in zip(row.anchor_ids, row.targets) if t]
    assert tokens == ["c", "b", "a", calm.anchor.tokenizer.eos_token]


def test_bf16_autocast_trains_the_float32_bridge(calm):
    result = Trainer(calm, reverse_task(16, 0), reverse_task(4, 1), config(steps=3, bf16=True, log_every=1)).train()
    assert result.stop_reason == "finished" and all(math.isfinite(h["loss"]) for h in result.history)
    assert all(p.dtype == torch.float32 for p in calm.bridge.parameters())


def test_cached_states_mix_chunks_of_different_lengths(calm):
    """Rows from two 64-row cache chunks padded to different lengths land in one batch."""
    short = [Example("", "ab")] * 64
    long = [Example("abcdef=", "fedcba" * 3)] * 64
    trainer = Trainer(calm, short + long, None, config(steps=3, batch_size=16))
    result = trainer.train()
    assert result.augment_cache and result.stop_reason == "finished"
    cached, prefix = trainer._states.batch([0, 64])  # one row from each chunk
    batch, _ = collate(calm, [trainer.train_rows[0], trainer.train_rows[64]])
    augment = batch.augments[0]
    uncached = calm.augment_states(0, augment.input_ids, augment.attention_mask)
    for got, want in zip(cached[0], uncached):
        torch.testing.assert_close(got[augment.attention_mask], want[augment.attention_mask], atol=1e-5, rtol=1e-5)
    # and the anchor's frozen prefix, replayed, gives the logits of a full forward
    real = batch.anchor.attention_mask  # padding positions are never read
    torch.testing.assert_close(calm.forward(batch, cached, prefix)[real], calm.forward(batch)[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("insert, layers", [("after", [1, 2]), ("before", [2, 3]), ("before", [0, 3])])
def test_the_frozen_cache_trains_the_same_bridge(tokenizers, insert, layers):
    """Augmenting states and the anchor's layers below the bridge, stored once: the same steps, the same bridge."""
    bridges = []
    for cache in (False, True):
        calm = cache_pair(tokenizers, anchor_layers=layers, insert=insert)
        result = Trainer(calm, reverse_task(24, 0), None, config(steps=6, cache_augment_states=cache)).train()
        assert result.augment_cache == cache
        bridges.append(calm.bridge.state_dict())
    assert_same_bridges(*bridges)


@pytest.mark.parametrize("gate_scale,position_scale,value_scale",
                         [(1.0, 1.0, 1.0), (10.0, 1.0, 1.0), (1.0, 25.0, 1.0), (5.0, 25.0, 1.0), (1.0, 1.0, 0.0),
                          (5.0, 1.0, 0.5)])
def test_learning_rate_scales_move_only_their_parameters_faster(tokenizers, gate_scale, position_scale, value_scale):
    """gate_lr_scale: the tanh gates; position_lr_scale: the recency biases and null keys; value_lr_scale: the
    projection, value and output maps (0: not moved at all); the rest at lr."""
    def first_step(**scales):
        anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=32, seed=1)
        augment = make_pair("llama", tokenizers["bpe"], layers=2, width=24, seed=2)
        torch.manual_seed(0)
        calm = ComposedLM(anchor, [augment], CALMConfig(every=1, recency=4, null_slot=True))
        randomize_bridge(calm)  # open gates: every parameter gets a gradient on the first step
        before = {n: p.detach().clone() for n, p in calm.bridge.named_parameters()}
        Trainer(calm, reverse_task(16, 0), None, config(steps=1, warmup_steps=1, **scales)).train()
        return {n: (p.detach() - before[n]).abs().max() for n, p in calm.bridge.named_parameters()}

    base = first_step()
    scaled = first_step(gate_lr_scale=gate_scale, position_lr_scale=position_scale, value_lr_scale=value_scale)
    assert any(n.endswith(".recency") for n in base) and all(v > 0 for v in base.values())
    assert {parameter_role(n) for n in base} == {"gate", "position", "value", "other"}
    for name in base:
        module, leaf = name.rsplit(".", 2)[-2:]
        ratio = (gate_scale if leaf == "gate" else position_scale if leaf in ("recency", "null_key") else
                 value_scale if module in ("proj", "v", "o") else 1.0)
        if ratio == 0:
            assert scaled[name] == 0, name
        else:  # Adam's first step is about lr per parameter whatever the gradient's size
            torch.testing.assert_close(scaled[name], base[name] * ratio, rtol=1e-3, atol=1e-9)


@pytest.mark.parametrize("name,value", [("gate_lr_scale", 0), ("position_lr_scale", 0), ("value_lr_scale", -1),
                                        ("value_lr_scale", float("nan"))])
def test_learning_rate_scales_must_be_positive(name, value):
    from calm_core.errors import CALMError

    with pytest.raises(CALMError, match=name):
        TrainConfig(**{name: value})


def test_augment_noise_is_relative_and_cleared_after_use(calm):
    blocks = calm.bridge.blocks()
    states = torch.randn(2, 5, 24)
    plain = blocks[0].memory(states)

    def noisy(x):
        with noisy_augment_states(blocks, 0.5, torch.Generator().manual_seed(0)):
            return blocks[0].memory(x)

    keys, values = noisy(states)
    assert not torch.allclose(values, plain[1])
    # relative to each state's RMS: a state 100x larger gets 100x the noise, the same after LayerNorm
    torch.testing.assert_close(noisy(100 * states)[1], values, atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError):
        with noisy_augment_states(blocks, 0.5):
            raise RuntimeError
    assert all(b.augment_noise == 0 and b.noise_generator is None for b in blocks)
    torch.testing.assert_close(blocks[0].memory(states)[1], plain[1])


def test_augment_noise_changes_training_reproducibly_and_never_inference(tokenizers):
    def trained(noise):
        anchor = make_pair("gpt2", tokenizers["char_bos"], layers=2, width=32, seed=1)
        augment = make_pair("llama", tokenizers["bpe"], layers=2, width=24, seed=2)
        torch.manual_seed(0)
        c = ComposedLM(anchor, [augment], CALMConfig(every=1))
        Trainer(c, reverse_task(16, 0), None, config(steps=3, warmup_steps=1, augment_noise=noise)).train()
        return c

    quiet, noisy, again = trained(0.0), trained(1.0), trained(1.0)
    v = lambda c: c.bridge.blocks()[0].v.weight
    assert not torch.allclose(v(quiet), v(noisy))
    torch.testing.assert_close(v(noisy), v(again), atol=0, rtol=0)
    batch, _ = collate(noisy, prepare(noisy, reverse_task(4, 1), None, True)[0])
    torch.testing.assert_close(noisy.forward(batch), noisy.forward(batch), atol=0, rtol=0)


def test_augment_noise_must_not_be_negative():
    from calm_core.errors import CALMError

    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(CALMError, match="augment_noise"):
            TrainConfig(augment_noise=bad)


def test_a_failed_run_restores_bridge_and_optimizer_from_before_its_last_good_step(calm):
    """lr 1e6 diverges within a few steps; what is left is exactly the state before the last step
    that went well (bridge and optimizer, all finite), and a run at a sane lr then trains."""
    trainer = Trainer(calm, reverse_task(32, 0), None, config(steps=30, lr=1e6, warmup_steps=1, log_every=1))
    states = []
    real_step = trainer._train_step

    def recording_step(use_cache):  # the bridge and optimizer before each step
        states.append(trainer._snapshot())
        return real_step(use_cache)

    trainer._train_step = recording_step
    result = trainer.train()
    assert result.stop_reason == "diverged" and "restored" in result.message
    failed = len(states)  # the step that failed was the last one run; the one before it went well
    good = states[failed - 2] if failed >= 2 else states[0]
    assert trainer.step == good["step"]
    for name, value in calm.bridge.state_dict().items():
        assert torch.equal(value, good["bridge"][name]), name
    restored = trainer.optimizer.state_dict()["state"]
    for index, entry in good["optimizer"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(restored[index][key]), torch.as_tensor(value)), (index, key)
    assert all(torch.isfinite(p).all() for p in calm.bridge.parameters())
    assert all(torch.isfinite(torch.as_tensor(v)).all() for e in restored.values() for v in e.values())
    again = Trainer(calm, reverse_task(32, 0), None, config(steps=20, lr=1e-3, log_every=1)).train()
    assert again.stop_reason == "finished" and all(math.isfinite(h["loss"]) for h in again.history)


def test_rows_of_a_large_data_set_are_prepared_as_training_reaches_them(calm, monkeypatch):
    import calm_core.training.trainer as training

    monkeypatch.setattr(training, "PREPARE_ALL", 100)
    trainer = Trainer(calm, reverse_task(1000, 0), None, config(steps=2, batch_size=4))
    result = trainer.train()
    assert result.stop_reason == "finished" and not result.augment_cache
    assert 0 < len(trainer.train_rows._chunks) <= 8  # only the chunks of the 8 examples used


def test_stop_is_answered_while_the_examples_are_prepared(calm):
    trainer = Trainer(calm, reverse_task(3000, 0), None, config(steps=5))
    seen = []

    def progress(done, total):
        seen.append(done)
        trainer.request_stop()

    result = trainer.train(prepare_progress=progress)
    assert result.stop_reason == "stopped" and "preparing" in result.message and seen == [64]
    assert result.step == 0


def test_a_large_data_set_keeps_only_recent_prepared_chunks(calm, monkeypatch):
    import calm_core.training.trainer as training

    monkeypatch.setattr(training, "PREPARE_ALL", 100)
    monkeypatch.setattr(training, "LAZY_CHUNKS", 2)
    trainer = Trainer(calm, reverse_task(2000, 0), None, config(steps=6, batch_size=8))
    assert trainer.train().stop_reason == "finished"
    assert len(trainer.train_rows._chunks) <= 2
    row = trainer.train_rows[1999]  # a dropped or new chunk is made again, the same
    assert row.anchor_ids == prepare(calm, [reverse_task(2000, 0)[1999]])[0][0].anchor_ids


def test_replaying_threads_never_see_each_others_layers(tokenizers):
    """Two compositions share one anchor (as app sessions do) and train at once: each step replays the
    anchor's prefix under the model's lock, and the shared model's layers are its own afterwards."""
    import threading

    anchor = make_pair("llama", tokenizers["char_bos"], layers=4, width=32, seed=1)
    augment = make_pair("gpt2", tokenizers["bpe"], layers=2, width=24, seed=2)
    layers = list(anchor[0].model.layers)
    calms = [ComposedLM(anchor, [augment], CALMConfig(anchor_layers=[2, 3], augment_layers=[0, 1])) for _ in range(2)]
    results, errors = [], []

    def run(calm):
        try:
            results.append(Trainer(calm, reverse_task(24, 0), None, config(steps=8)).train())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(c,)) for c in calms]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and all(r.stop_reason == "finished" and r.augment_cache for r in results)
    assert list(anchor[0].model.layers) == layers


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma"])
def test_losses_from_the_predicting_positions_or_mask_only_equal_those_from_every_position(tokenizers, arch):
    """Training applies the output layer only where a label follows (predicting_positions, or per row with
    predicting_mask): same losses, same gradients, whether the model takes logits_to_keep or not."""
    from calm_core.training.batches import predicting_mask, predicting_positions, token_losses

    anchor = make_pair(arch, tokenizers["char_bos"], layers=2, width=32, seed=1)
    augment = make_pair("llama", tokenizers["bpe"], layers=2, width=24, seed=2)
    calm = randomize_bridge(ComposedLM(anchor, [augment], CALMConfig(every=1)))
    examples = [Example("a longer prompt here: ", "xy"), Example("ab", "cde fg"), Example("q: ", "z")]
    rows, _ = prepare(calm, examples)
    batch, labels = collate(calm, rows)
    positions = predicting_positions(labels)
    assert 0 < len(positions) < labels.shape[1] - 1
    mask = predicting_mask(labels)
    assert mask.sum() == (labels != -100).sum() < len(positions) * len(examples)  # tighter than the union
    results = []
    for kept in (None, positions, mask):
        calm.bridge.zero_grad()
        logits = calm.forward(batch, positions=kept)
        assert logits.shape[:-1] == ((int(mask.sum()),) if kept is mask else labels.shape if kept is None else
                                     (len(examples), len(positions)))
        losses = token_losses(logits, labels, kept)
        losses.sum().backward()
        results.append((losses.detach(), [p.grad.clone() for p in calm.bridge.parameters()]))
    full, full_grads = results[0]
    assert len(full) == (labels != -100).sum()
    for cut, cut_grads in results[1:]:
        torch.testing.assert_close(full, cut, atol=1e-5, rtol=1e-5)
        for a, b in zip(full_grads, cut_grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _anchor_kl(calm, examples) -> float:
    """Mean KL(anchor alone || composition) over the examples' completion tokens."""
    batch, labels = collate(calm, prepare(calm, examples)[0])
    positions = predicting_positions(labels)
    with torch.no_grad():
        on = calm.forward(batch, positions=positions)
        with calm.gate_scale(0.0):
            off = calm.forward(batch, positions=positions)
    return float(anchor_kl_losses(on, off, labels, positions).mean())


def _keep(examples):
    return [Example(e.prompt, e.completion, keep_anchor=True) for e in examples]


def test_keep_anchor_rows_cost_nothing_while_the_bridge_is_the_anchor(calm):
    """Gates at zero: the composition is the anchor, so rows trained toward the anchor alone have zero loss."""
    seen = []
    Trainer(calm, _keep(reverse_task(16, 0)), None, config(steps=1, log_every=1), callback=seen.append).train()
    assert abs(seen[0]["loss"]) < 1e-6


@pytest.mark.parametrize("cache", [False, True])
def test_keep_anchor_rows_pull_an_open_bridge_back_to_the_anchor(calm, cache):
    randomize_bridge(calm, std=1.0)
    rows = _keep(reverse_task(32, 0))
    before = _anchor_kl(calm, rows)
    Trainer(calm, rows, None, config(steps=150, lr=1e-2, cache_augment_states=cache)).train()
    after = _anchor_kl(calm, rows)
    assert before > 1e-3 and after < 0.5 * before, (before, after)


@pytest.mark.parametrize("form", ["positions", "mask"])
def test_mixed_batches_train_text_rows_on_text_and_kept_rows_toward_the_anchor(tokenizers, form):
    """Text rows keep their cross-entropy, kept rows get KL to the anchor alone; with and without the cache;
    logits at the union of positions or at each row's own targets (the trainer's form)."""
    from calm_core.training.batches import predicting_mask

    choose = predicting_mask if form == "mask" else predicting_positions

    def text_losses(calm, rows):
        batch, labels = collate(calm, rows)
        positions = predicting_positions(labels)
        return token_losses(calm.forward(batch, positions=positions), labels, positions)

    bridges = []
    for cache in (False, True):
        calm = cache_pair(tokenizers, anchor_layers=[1, 3])
        randomize_bridge(calm, std=0.2)
        text, kept = reverse_task(6, 0), _keep(reverse_task(6, 1))
        trainer = Trainer(calm, text + kept, None, config(steps=3, cache_augment_states=cache))
        rows = [trainer.train_rows[i] for i in range(12)]
        batch, labels = collate(calm, rows)
        positions = choose(labels)
        if form == "positions":
            trainer._output = None  # logits at the positions; with the mask, the trainer's own hidden-state path
        with torch.no_grad():
            out = calm.forward(batch, positions=positions, hidden_only=trainer._output is not None)
            losses = trainer._losses(rows, out, labels, positions, None)
            expected_text = text_losses(calm, rows[:6])
        assert losses.numel() == sum(r.num_targets for r in rows)
        n = expected_text.numel()
        torch.testing.assert_close(losses[:n], expected_text, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(losses[n:].mean(), torch.tensor(_anchor_kl(calm, kept)), atol=1e-6, rtol=1e-4)
        assert losses[n:].min() >= -1e-6 and losses[n:].max() > 0
        trainer.train()
        bridges.append(calm.bridge.state_dict())
    assert_same_bridges(*bridges)


@pytest.mark.parametrize("bias, chunk, autocast", [(False, 128, False), (True, 3, False), (False, 4, True)])
def test_chunked_output_layer_cross_entropy_equals_logits_then_cross_entropy(monkeypatch, bias, chunk, autocast):
    """fused_loss.linear_cross_entropy: same losses and same gradient w.r.t. the hidden states as the output layer's
    logits followed by cross-entropy, across chunk boundaries, with a bias and under bf16 autocast."""
    from calm_core.training import fused_loss

    monkeypatch.setattr(fused_loss, "CHUNK", chunk)
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 50, bias=bias).requires_grad_(False)
    hidden, targets = torch.randn(11, 16, requires_grad=True), torch.randint(0, 50, (11,))
    weights = torch.rand(11)  # a loss that weighs tokens unequally: backward scales each row's gradient
    results = []
    for fused in (False, True):
        hidden.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            losses = (fused_loss.linear_cross_entropy(hidden, layer, targets) if fused else
                      torch.nn.functional.cross_entropy(layer(hidden).float(), targets, reduction="none"))
        (losses * weights).sum().backward()
        results.append((losses.detach(), hidden.grad.clone()))
    tolerance = dict(atol=3e-2, rtol=3e-2) if autocast else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[1][0], results[0][0], **tolerance)
    torch.testing.assert_close(results[1][1], results[0][1], **tolerance)


def test_training_through_the_chunked_output_layer_matches_the_logits_path(calm, monkeypatch):
    """The trainer takes its cross-entropy through fused_loss when the anchor's output layer is plain; with it
    turned off (as for a softcapped model) the same run gives the same losses."""
    import calm_core.training.trainer as training

    losses = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(training, "plain_output_layer", lambda model: None)
        bridge = copy.deepcopy(calm.bridge.state_dict())
        seen = []
        trainer = Trainer(calm, reverse_task(16, 0), reverse_task(4, 1), config(steps=4, log_every=1, eval_every=2),
                          callback=seen.append)
        assert (trainer._output is not None) == fused
        trainer.train()
        calm.bridge.load_state_dict(bridge)
        losses.append([(r["loss"], r["val_loss"]) for r in seen])
    assert losses[0][0][0] > 0
    for a, b in zip(*losses):
        assert a[0] == pytest.approx(b[0], rel=1e-4) and (a[1] is None) == (b[1] is None)
        assert a[1] is None or a[1] == pytest.approx(b[1], rel=1e-4)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_output_products_run_in_float32_where_the_cpu_only_emulates_bf16(monkeypatch, native):
    """Without native bf16 every bf16 product is converted around (a Gemma-sized vocabulary: 40 s for one step's
    loss): there the fused loss runs in float32, equal to the float32 loss; with native bf16, in bf16."""
    from calm_core.training import fused_loss

    monkeypatch.setattr(fused_loss, "fast_bf16", lambda device=None: native)
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 50).requires_grad_(False)
    hidden, targets = torch.randn(5, 16), torch.randint(0, 50, (5,))
    exact = torch.nn.functional.cross_entropy(layer(hidden), targets, reduction="none")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = fused_loss.linear_cross_entropy(hidden, layer, targets)
    if native:
        torch.testing.assert_close(fused, exact, atol=3e-2, rtol=3e-2)
        assert not torch.allclose(fused, exact, atol=1e-6, rtol=1e-6)  # bf16 rounding shows
    else:
        torch.testing.assert_close(fused, exact, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps, filled_first", [(20, True), (1, False)])
def test_a_run_that_reaches_every_row_computes_the_frozen_states_before_its_first_step(calm, steps, filled_first):
    """With progress the page can show (rows done, rows, what), and not inside the first steps; a short run that
    reaches few rows computes them as batches reach them."""
    seen = []
    trainer = Trainer(calm, reverse_task(40, 0), None, config(steps=steps, batch_size=8))
    result = trainer.train(prepare_progress=lambda *report: seen.append(report))
    states = [r for r in seen if r[2:] == ("the frozen models' states",)]
    assert result.augment_cache and result.stop_reason == "finished"
    assert (states[-1][:2] == (40, 40)) if filled_first else not states
    assert (len(trainer._states.chunks) == len(trainer._states.members)) or not filled_first


def test_stop_while_the_frozen_states_are_computed_leaves_the_bridge_unchanged(calm):
    trainer = Trainer(calm, reverse_task(200, 0), None, config(steps=40, batch_size=8))
    before = {k: v.clone() for k, v in calm.bridge.state_dict().items()}

    def stop_after_a_chunk(done, total, what="examples"):
        if what != "examples":
            trainer.request_stop()
    result = trainer.train(prepare_progress=stop_after_a_chunk)
    assert result.stop_reason == "stopped" and result.step == 0 and "preparing" in result.message
    assert len(trainer._states.chunks) == 1
    assert all(torch.equal(before[k], v) for k, v in calm.bridge.state_dict().items())
