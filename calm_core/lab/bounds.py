"""The range of every number and text a user can type, from the models and the machine, checked
before any work starts, with a message that says the allowed range."""
from __future__ import annotations

import math

from ..errors import CALMError
from ..training.batches import context_length

MAX_STEPS = 100_000
MAX_BATCH = 4096
MAX_EVAL_EXAMPLES = 10_000  # three models generate for each
MAX_LR = 10.0
MAX_GATE_LR_SCALE = 1000.0
MAX_AUGMENT_NOISE = 10.0
MAX_NEW_TOKENS = 1024
MAX_ATTENTION_TOKENS = 256  # a map larger than this is unreadable and slow to draw
MAX_RECENCY = 1024
DEFAULT_CONTEXT = 2048  # for a model that names no context length


def whole(label: str, value, low: int, high: int, why: str = "") -> int:
    """An integer in [low, high], or a CALMError naming the range."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CALMError(f"{label} must be a whole number from {low:,} to {high:,}; got {value!r}.") from None
    if not math.isfinite(number) or number != int(number) or not low <= number <= high:
        shown = int(number) if math.isfinite(number) and number == int(number) else value
        raise CALMError(f"{label} must be a whole number from {low:,} to {high:,}{why}; got {shown!r}.")
    return int(number)


def real(label: str, value, low: float, high: float, low_open: bool = False) -> float:
    """A finite number in [low, high] (or (low, high] with low_open)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        bracket = "above" if low_open else "from"
        raise CALMError(f"{label} must be a number {bracket} {low:g} up to {high:g}; got {value!r}.")
    return number


def context(calm) -> int:
    """Tokens the composition can read at once: the smallest context of its models."""
    limits = [context_length(m.model) for m in [calm.anchor] + calm.augments]
    return min([x for x in limits if x] or [DEFAULT_CONTEXT])


def prompt_tokens(calm, text: str) -> int:
    """The longest tokenization of `text` among the models (each reads the same text)."""
    return max(len(m.tokenizer(text, add_special_tokens=True)["input_ids"]) for m in [calm.anchor] + calm.augments)


def check_prompt(calm, text: str, max_new_tokens: int, what: str = "The prompt") -> int:
    """Refuse a prompt that, with the new tokens asked for, would not fit the models' context."""
    window = context(calm)
    if len(text) > 8 * window:  # far too long to be worth tokenizing
        raise CALMError(f"{what} is {len(text):,} characters; these models read at most {window:,} tokens "
                        f"(about {window:,} characters or fewer). Shorten it.")
    n = prompt_tokens(calm, text)
    if n + max_new_tokens > window:
        room = window - max_new_tokens
        raise CALMError(f"{what} is {n:,} tokens and {max_new_tokens} new tokens are asked for, but these models read "
                        f"at most {window:,} tokens: shorten it to {max(0, room):,} tokens or ask for fewer new tokens.")
    return n


def max_new_tokens(calm, value, label: str = "max new tokens") -> int:
    return whole(label, value, 1, min(MAX_NEW_TOKENS, context(calm) - 1), " (the models' context)")


def check_attention_text(calm, text: str) -> int:
    limit = min(MAX_ATTENTION_TOKENS, context(calm))
    if len(text) > 8 * limit:
        raise CALMError(f"The text is {len(text):,} characters; a cross-attention map shows at most {limit} tokens. "
                        "Shorten it.")
    n = prompt_tokens(calm, text)
    if n > limit:
        raise CALMError(f"The text is {n} tokens; a cross-attention map shows at most {limit} tokens "
                        "(a larger one cannot be read). Shorten it.")
    return n


def longest_tokens(calm, examples, max_length: int | None = None) -> int:
    """Tokens of the longest example (by characters) as the models read it, with BOS and EOS,
    within the context: what one sequence of a batch may take."""
    from ..training.data import longest_examples

    longest = max((prompt_tokens(calm, e.prompt + e.completion) + 1 for e in longest_examples(examples)), default=1)
    return max(1, min([longest, context(calm)] + ([max_length] if max_length else [])))


def longest_prompt_tokens(calm, examples) -> int:
    """Tokens of the longest prompt (by characters) among at most MAX_EVAL_EXAMPLES examples."""
    import heapq

    prompts = heapq.nlargest(4, (e.prompt for e in examples), key=len)
    return max((prompt_tokens(calm, p) for p in prompts), default=0)


def largest_batch(calm, tokens: int) -> int:
    """The largest training batch of `tokens`-long sequences that fits in the memory free now."""
    from .resources import LEDGER, device_of_calm, max_batch_size

    return min(MAX_BATCH, max_batch_size(calm, tokens, LEDGER.room(device_of_calm(calm))))


def schedule(steps: int) -> dict:
    """How a run of `steps` logs (40 times), validates (5 times and at the end: on the real preset each validation-loss
    pass is 100 rows through the anchor above the bridge, 5 s; the held-out accuracy curve is the probe's) and warms up
    (min(20, a tenth of the steps))."""
    return dict(log_every=max(1, steps // 40), eval_every=max(1, steps // 5), warmup_steps=max(1, min(20, steps // 10)))


def train_fields(steps, lr, batch_size, gate_lr_scale=1.0, augment_noise=0.0, method: str = "calm", **more) -> dict:
    """The Train tab's fields as TrainConfig fields, each checked against its range (LabSession.train_config
    completes them)."""
    from ..training.config import TrainConfig

    fields = dict(
        steps=whole("steps", steps, 1, MAX_STEPS), lr=real("learning rate", lr, 0, MAX_LR, low_open=True),
        batch_size=whole("batch size", batch_size, 1, MAX_BATCH),
        gate_lr_scale=real("gate learning rate ×", 1.0 if gate_lr_scale in (None, "") else gate_lr_scale, 0,
                           MAX_GATE_LR_SCALE, low_open=True),
        augment_noise=real("noise on augmenting states", augment_noise or 0.0, 0, MAX_AUGMENT_NOISE),
        method=str(method))  # TrainConfig names the choices when it is none of them
    for name, (low, high, low_open) in ADVANCED_BOUNDS.items():
        if more.get(name) not in (None, ""):
            fields[name] = real(name.replace("_", " "), more[name], low, high, low_open=low_open)
    fields.update({k: v for k, v in more.items() if k in ("recipe", "bf16") and v is not None})
    TrainConfig(**fields)  # the rest of its checks, before anything starts
    return fields


def train_config(steps, lr, batch_size, gate_lr_scale=1.0, augment_noise=0.0, method: str = "calm"):
    """The checked fields as a TrainConfig on the app's schedule (the session's train_config adds its recipe)."""
    from ..training.config import TrainConfig

    fields = train_fields(steps, lr, batch_size, gate_lr_scale, augment_noise, method)
    return TrainConfig(**{**schedule(fields["steps"]), **fields, "progress": False})


# the Train tab's advanced fields: (lowest, highest, lowest excluded)
ADVANCED_BOUNDS = {"position_lr_scale": (0, 100, True), "value_lr_scale": (0, 10, False), "weight_decay": (0, 1, False)}


def heads(calm) -> int:
    return calm.config.num_heads or calm.anchor.info.num_heads
