"""ComposedLM: an anchor LM, one or more augmenting LMs, all frozen, and the bridge between them."""
from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from ..errors import CALMError
from ..models import loading
from . import alignment
from .alignment import Encoding
from .bridge import AugmentBridge, Bridge
from .config import CALMConfig
from .inspection import AttentionRecord as AttentionRecord  # re-exported: its old home
from .inspection import Inspection
from .persistence import load_composed, save_bridge


@dataclass
class Member:
    """A frozen base model with its tokenizer and decoder layers."""

    model: nn.Module
    tokenizer: object
    layers: nn.ModuleList
    info: loading.ModelInfo

    @classmethod
    def wrap(cls, pair) -> "Member":
        try:
            model, tokenizer = pair
        except (TypeError, ValueError):
            raise CALMError("Each model must be given as a (model, tokenizer) pair.") from None
        loading.freeze(model)
        return cls(model, tokenizer, loading.decoder_layers(model), loading.describe(model))


@dataclass
class ComposedBatch:
    """A batch of texts as the anchor and each augmenting model read them."""

    texts: list[str]
    anchor: Encoding
    augments: list[Encoding]


@functools.lru_cache(maxsize=None)
def _forward_parameters(model_class) -> frozenset:
    return frozenset(inspect.signature(model_class.forward).parameters)


def _accepts(model, argument: str) -> bool:
    """Whether the model's forward takes `argument` (read once per model class: generation asks every step)."""
    return argument in _forward_parameters(type(model))


class _StopForward(Exception):
    """Raised by a hook once the augmenting model has produced its deepest needed layer."""


class ComposedLM(Inspection):
    """CALM: frozen anchor + frozen augmenting models + a trainable bridge (``self.bridge``)."""

    def __init__(self, anchor, augments=(), config: CALMConfig | None = None):
        self.config = config or CALMConfig()
        self.anchor = Member.wrap(anchor)
        self.augments = [Member.wrap(pair) for pair in augments]
        self.shared = [alignment.same_tokenizer(self.anchor.tokenizer, m.tokenizer) for m in self.augments]
        for member, shared in zip([self.anchor] + self.augments, [all(self.shared)] + self.shared):
            if not shared and not getattr(member.tokenizer, "is_fast", False):
                raise CALMError(
                    f"The tokenizer of {member.info.name} is not a fast tokenizer; aligning two different "
                    f"tokenizers needs character offsets, which only fast tokenizers give."
                )
        self.bridge = self._new_bridge()
        # how this bridge started and trains (training/recipes.py, as a dict, saved in bridge_config.json); None: a
        # new bridge that no recipe has started yet, {}: a loaded bridge saved before recipes were recorded
        self.recipe: dict | None = None
        # gate_scale / layers_off / record_attention apply to the calling thread only, so a
        # training thread and a chat in another thread never see each other's settings.
        self._local = threading.local()

    def _new_bridge(self) -> Bridge:
        heads = self.config.num_heads or self.anchor.info.num_heads
        return Bridge([
            AugmentBridge(
                self.config.layer_pairs(self.anchor.info.num_layers, m.info.num_layers),
                m.info.width, self.anchor.info.width, heads, self.config.gate, self.config.norm,
                self.config.recency, self.config.null_slot, self.config.window, self.config.relative,
            )
            for m in self.augments
        ]).to(loading.device_of(self.anchor.model))

    def reseed_bridge(self, seed: int) -> None:
        """Give the bridge the initial weights that `seed` draws (gates closed as always), whatever the global random
        state was: a run started in the app and the same run from the command line start from the same bridge."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = self._new_bridge()
        self.bridge.load_state_dict(fresh.state_dict())

    @classmethod
    def from_names(cls, anchor: str, augments: list[str], config: CALMConfig | None = None, dtype=None,
                   trust_remote_code: bool = False, device=None) -> "ComposedLM":
        """Load the anchor and augmenting models by hub id or local folder, then compose them."""
        load = lambda name: loading.load_causal_lm(name, dtype=dtype, trust_remote_code=trust_remote_code, device=device)
        return cls(load(anchor), [load(name) for name in augments], config)

    # ---- reading text -------------------------------------------------------------------------

    def encode(self, texts: list[str] | str, add_special_tokens: bool = True, max_length: int | None = None,
               augment_special_tokens: bool | None = None) -> ComposedBatch:
        """Both models' tokens for texts; augment_special_tokens (default: as the anchor's) lets a chat-templated
        prompt skip the anchor's special tokens while the augmenting models keep theirs, as generation does."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise CALMError("No texts given.")
        anchor = alignment.encode(self.anchor.tokenizer, texts, "anchor", add_special_tokens, max_length)
        augment_special = add_special_tokens if augment_special_tokens is None else augment_special_tokens
        augments = [
            alignment.positional(anchor) if shared
            else alignment.encode(m.tokenizer, texts, "augment", augment_special, max_length)
            for m, shared in zip(self.augments, self.shared)
        ]
        return ComposedBatch(texts, anchor, augments)

    def logits(self, texts: list[str] | str) -> torch.Tensor:
        """(batch, anchor tokens, anchor vocab) for right-padded texts; differentiable w.r.t. the bridge."""
        return self.forward(self.encode(texts))

    def forward(self, batch: ComposedBatch, augment_states: list[list[torch.Tensor]] | None = None,
                anchor_prefix: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                hidden_only: bool = False, share_opening: bool = False) -> torch.Tensor:
        """Logits for an encoded batch. augment_states, when given, replaces running the augmenting
        models (one list of per-composition-layer states per model, as augment_states() returns);
        anchor_prefix, the anchor's frozen layers below the bridge (anchor_prefix.prefix_states);
        positions: logits at these positions only: 1-D indices -> (B, len(positions), V)
        (batches.predicting_positions); a (B, T) bool mask -> (N, V) at its True (row, position) pairs, row by row
        (batches.predicting_mask), the output layer applied to nothing else; with hidden_only, (N, D): the
        final hidden states there, the output layer left to the caller (training/fused_loss.py); share_opening:
        tokens every row opens with run once, where that gives the same result (opening_forward.py)."""
        assert not hidden_only or (positions is not None and positions.dim() == 2), "hidden_only needs a (B, T) mask"
        device = loading.device_of(self.anchor.model)
        scales = self.block_scales()
        condition = []
        for k, (_member, enc) in enumerate(zip(self.augments, batch.augments)):
            if not any(scales[i] for i in self._block_range(k)):
                continue
            states = augment_states[k] if augment_states is not None else self.augment_states(k, enc.input_ids, enc.attention_mask)
            memory = [block.memory(s.to(device)) for block, s in zip(self.bridge.augments[k].blocks, states)]
            condition.append((k, memory, self.visibility(k, batch.anchor, enc).to(device)))
        if self._recorder is not None:
            self._recorder.anchor_tokens = batch.anchor.tokens[0]
            self._recorder.augment_tokens_by_model = [e.tokens[0] for e in batch.augments]
            self._recorder.augment_tokens = self._recorder.augment_tokens_by_model[0] if batch.augments else []
        if share_opening and self._recorder is None:
            from .opening_forward import forward_sharing_opening

            shared = forward_sharing_opening(self, batch, condition, anchor_prefix, positions, hidden_only, device)
            if shared is not None:
                return shared
        run = lambda: self.anchor_logits(batch.anchor.input_ids.to(device), batch.anchor.attention_mask.to(device),
                                         condition, positions=None if positions is None else positions.to(device),
                                         hidden_only=hidden_only)
        if anchor_prefix is None:
            return run()
        from .anchor_prefix import replaying

        with replaying(self, anchor_prefix.to(device)):
            return run()

    def visibility(self, k: int, anchor: Encoding, augment: Encoding) -> torch.Tensor:
        if self.shared[k]:
            anchor = alignment.positional(anchor)
        return alignment.visibility(anchor.keys, anchor.attention_mask, augment.keys, augment.attention_mask)

    # ---- running the frozen models -----------------------------------------------------------

    def augment_states(self, k: int, input_ids, attention_mask=None, cache=None, position_ids=None) -> list[torch.Tensor]:
        """Hidden states (B, T, D_A) of augmenting model k after each of its composition layers.
        Runs without grad and stops after the deepest layer needed. position_ids: only for
        batched decoding, where rows are padded on the left or between chunks."""
        member, wanted = self.augments[k], self.bridge.augments[k].augment_layers
        deepest, captured = max(wanted), {}

        def capture(index):
            def hook(module, args, output):
                captured[index] = output[0] if isinstance(output, tuple) else output
                if index == deepest:
                    raise _StopForward
            return hook

        device = loading.device_of(member.model)
        with loading.model_lock(member.model), torch.no_grad():
            handles = [(member.layers[i] if i < len(member.layers) else loading.final_norm(member.model)).register_forward_hook(
                capture(i), prepend=True) for i in sorted(set(wanted))]
            try:
                member.model(
                    input_ids=input_ids.to(device),
                    attention_mask=None if attention_mask is None else attention_mask.long().to(device),
                    cache=cache, use_cache=cache is not None,
                    **({} if position_ids is None else {"position_ids": position_ids.to(device)}),
                )
            except _StopForward:
                pass
            finally:
                for handle in handles:
                    handle.remove()
        return [captured[i] for i in wanted]

    def anchor_logits(self, input_ids, attention_mask, condition, cache=None, scales=None, position_ids=None,
                      last_only: bool = False, positions: torch.Tensor | None = None,
                      hidden_only: bool = False) -> torch.Tensor:
        """Run the anchor with the bridge added at its composition layers.

        condition: (augment index, memory per block, visibility (B, T, T_aug)) per active model.
        scales: per composition layer factors (default: this thread's gate_scale / layers_off).
        last_only: logits for the last position only, (B, 1, vocab): generation never needs more,
        and a 262k vocabulary makes full prompt logits cost gigabytes. positions: logits at those positions only
        (1-D indices -> (B, P, V); (B, T) bool mask -> (N, V), see forward)."""
        scales, blocks_by_layer = scales or self.block_scales(), {}
        recorded = None
        if self._recorder is not None:
            recorded = self._recorder.maps = [None] * len(scales)
        for k, memory, visible in condition:
            bridge, offset = self.bridge.augments[k], self._block_range(k).start
            for local, (block, mem, (anchor_layer, _)) in enumerate(zip(bridge.blocks, memory, bridge.pairs)):
                if scales[offset + local]:
                    blocks_by_layer.setdefault(anchor_layer, []).append((offset + local, block, mem, visible))

        def add_bridge(hidden, entries):
            for index, block, mem, visible in entries:
                sink = [] if recorded is not None else None
                hidden = hidden + block(hidden, mem, visible, scales[index], sink)
                if sink:
                    recorded[index] = sink[0]
            return hidden

        def after(entries):
            def hook(module, args, output):
                hidden = add_bridge(output[0] if isinstance(output, tuple) else output, entries)
                return (hidden,) + tuple(output[1:]) if isinstance(output, tuple) else hidden
            return hook

        def before(entries):
            def hook(module, args, kwargs):
                if args:
                    return (add_bridge(args[0], entries), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": add_bridge(kwargs["hidden_states"], entries)}
            return hook

        model = self._anchor_model()
        with loading.model_lock(model):
            if self.config.insert == "before":
                handles = [self.anchor.layers[layer].register_forward_pre_hook(before(entries), with_kwargs=True,
                                                                               prepend=True)
                           for layer, entries in blocks_by_layer.items()]
            else:
                handles = [self.anchor.layers[layer].register_forward_hook(after(entries), prepend=True)
                           for layer, entries in blocks_by_layer.items()]
            picked, kept = positions is not None and positions.dim() == 2, {}

            def pick(module, args):  # the output layer sees the masked (row, position) pairs only: (N, D)
                kept["hidden"] = args[0][positions]
                return (args[0][:, :0] if hidden_only else kept["hidden"],) + tuple(args[1:])
            if picked:
                handles.append(model.get_output_embeddings().register_forward_pre_hook(pick, prepend=True))
            try:
                extra = {} if position_ids is None else {"position_ids": position_ids.to(input_ids.device)}
                keep = 1 if last_only else None if picked else positions
                if keep is not None and _accepts(model, "logits_to_keep"):
                    extra["logits_to_keep"] = keep
                out = model(
                    input_ids=input_ids,
                    attention_mask=None if attention_mask is None else attention_mask.long(),
                    cache=cache, use_cache=cache is not None, **extra,
                )
            finally:
                for handle in handles:
                    handle.remove()
        if last_only:
            return out.logits[:, -1:]
        if picked and hidden_only:
            return kept["hidden"]  # (N, D)
        if picked:
            return out.logits  # (N, V)
        if positions is not None and "logits_to_keep" not in extra:  # a model without logits_to_keep
            return out.logits[:, positions]
        return out.logits

    def _anchor_model(self):
        """The model anchor_logits runs: the anchor (a baseline runs its untouched original at gate scale 0)."""
        return self.anchor.model

    # ---- generation ---------------------------------------------------------------------------

    def stream(self, prompt, max_new_tokens: int = 32, **sampling) -> Iterator[str]:
        """Generated text piece by piece (never splitting a character); joined equals generate()."""
        from .generation import stream

        # gate_scale / layers_off are read now, in the calling thread, and hold for the whole stream.
        return stream(self, prompt, max_new_tokens=max_new_tokens, scales=self.block_scales(decoding=True), **sampling)

    def generate(self, prompt, max_new_tokens: int = 32, return_dict: bool = False, **sampling):
        """The new text only (a GenerationResult with token ids and per-step logits if return_dict).
        prompt: a string, or chat messages [{"role": ..., "content": ...}, ...]; or a list of
        either, decoded together in one batch: a list of texts, each equal to decoding it alone."""
        from .batched_generation import generate_batch, is_batch
        from .generation import generate

        run = generate_batch if is_batch(prompt) else generate
        return run(self, prompt, max_new_tokens=max_new_tokens, return_dict=return_dict,
                   scales=self.block_scales(decoding=True), **sampling)

    # ---- parameters and persistence -----------------------------------------------------------

    def num_parameters(self) -> tuple[int, int]:
        """(trainable, all): the bridge against the bridge plus every base model."""
        trainable = sum(p.numel() for p in self.bridge.parameters() if p.requires_grad)
        total = self.bridge.num_parameters() + sum(m.info.num_parameters for m in [self.anchor] + self.augments)
        return trainable, total

    def print_trainable_parameters(self) -> None:
        trainable, total = self.num_parameters()
        print(f"trainable params: {trainable:,d} || all params: {total:,d} || trainable%: {100 * trainable / total:.4f}")

    def save_pretrained(self, directory) -> None:
        save_bridge(self, directory)

    @classmethod
    def from_pretrained(cls, directory, anchor=None, augments=None, dtype=None, trust_remote_code: bool = False) -> "ComposedLM":
        """Load a saved bridge onto (model, tokenizer) pairs, or onto the models named in its config."""
        return load_composed(cls, Member.wrap, directory, anchor, augments, dtype, trust_remote_code)
