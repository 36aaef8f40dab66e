"""`run.py --profile`: where the time of one composed training step and one composed generation goes.

torch.profiler's table of the ops with the most self CPU time, to explain a missed goal. The
training step is taken inside Trainer.train() through its per-step callback (started after the
warm-up steps, stopped one step later), so it is the step the benchmark times.
"""
from __future__ import annotations

from torch.profiler import ProfilerActivity, profile

from . import gen_speed, models, train_speed


def training_step(setup: models.Setup, batch: int, length: int, warmup: int, cache: bool, rows: int) -> str:
    profiler = profile(activities=[ProfilerActivity.CPU])
    steps_done = 0

    def callback(*_):
        nonlocal steps_done
        steps_done += 1
        if steps_done == warmup:
            profiler.start()
        elif steps_done == warmup + 1:
            profiler.stop()

    system = "ours_cached" if cache else "ours"
    train_speed.runner(system, setup.shapes, batch, length, warmup + 1, callback, setup)()
    return profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def generation(setup: models.Setup, prompt_tokens: int, new_tokens: int, rows: int) -> str:
    text, _ = models.prompt(setup.tokenizer, prompt_tokens)
    gen_speed.ours_generate(setup.calm, text, new_tokens)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        gen_speed.ours_generate(setup.calm, text, new_tokens)
    return profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def report(setup: models.Setup, batch: int, length: int, prompt_tokens: int, new_tokens: int, rows: int = 20) -> str:
    warmup = 2  # the cached variant fills its cache in step 1
    parts = []
    for cache in (False, True):
        title = f"composed training step, batch {batch} x {length}, {'with' if cache else 'without'} the augment cache"
        parts += [f"### {title}", training_step(setup, batch, length, warmup, cache, rows)]
    parts += [f"### composed cached generation, {new_tokens} tokens from {prompt_tokens}",
              generation(setup, prompt_tokens, new_tokens, rows)]
    return "\n\n".join(parts)

