"""Tiny models and tokenizers built offline: for tests, benchmarks, demos and the default app.

Nothing here downloads anything: tokenizers are made from an alphabet or trained on a corpus
in-process, models are built from configs with random (seeded) weights.
"""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from .loading import freeze

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"-+=*/()\n"


def as_fast_tokenizer(tokenizer: Tokenizer, add_bos: bool) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer over a `tokenizers` one, with our special tokens (and BOS first)."""
    bos = SPECIAL_TOKENS["bos_token"]
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET, add_bos: bool = True) -> PreTrainedTokenizerFast:
    """One token per character (unknown characters map to <unk>), as a fast tokenizer."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in dict.fromkeys(alphabet):
        vocab.setdefault(ch, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return as_fast_tokenizer(tokenizer, add_bos)


def bpe_tokenizer(corpus: list[str], vocab_size: int = 300, add_bos: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style) trained on corpus in-process."""
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return as_fast_tokenizer(tokenizer, add_bos)


ARCHITECTURES = ("gpt2", "llama", "qwen2", "gpt_neox", "opt", "gemma", "phi", "mistral", "gpt_neo")
SLIDING_WINDOW = 8  # of the tiny "gemma3": short, so that tests cross it with short texts


def tiny_config(arch: str, vocab_size: int, layers: int = 2, width: int = 32, heads: int = 4, max_positions: int = 512):
    """A transformers config for a small model of the given architecture family."""
    from transformers import (
        Gemma3TextConfig,
        GemmaConfig,
        GPT2Config,
        GPTNeoConfig,
        GPTNeoXConfig,
        LlamaConfig,
        MistralConfig,
        OPTConfig,
        PhiConfig,
        Qwen2Config,
    )

    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    llama_like = dict(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                      intermediate_size=2 * width, max_position_embeddings=max_positions, **common)
    builders = {
        "gpt2": lambda: GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=max_positions, **common),
        "llama": lambda: LlamaConfig(num_key_value_heads=max(1, heads // 2), **llama_like),
        "qwen2": lambda: Qwen2Config(num_key_value_heads=max(1, heads // 2), **llama_like),
        "mistral": lambda: MistralConfig(num_key_value_heads=max(1, heads // 2), **llama_like),
        "gemma": lambda: GemmaConfig(num_key_value_heads=1, head_dim=width // heads, **llama_like),
        # Gemma 3: sliding-window attention on all but every third layer, as the real one on 5 of 6
        "gemma3": lambda: Gemma3TextConfig(num_key_value_heads=1, head_dim=width // heads, sliding_window=SLIDING_WINDOW,
                                           layer_types=["full_attention" if (i + 1) % 3 == 0 else "sliding_attention"
                                                        for i in range(layers)], **llama_like),
        "phi": lambda: PhiConfig(**llama_like),
        "gpt_neox": lambda: GPTNeoXConfig(**llama_like),
        "gpt_neo": lambda: GPTNeoConfig(num_layers=layers, hidden_size=width, num_heads=heads,
                                        attention_types=[[["global"], layers]],
                                        max_position_embeddings=max_positions, **common),
        "opt": lambda: OPTConfig(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                                 ffn_dim=2 * width, word_embed_proj_dim=width,
                                 max_position_embeddings=max_positions, **common),
    }
    if arch not in builders:
        raise ValueError(f"Unknown tiny architecture {arch!r}; choose from {sorted(builders)}.")
    return builders[arch]()


def tiny_model(arch: str, vocab_size: int, layers: int = 2, width: int = 32, heads: int = 4, seed: int = 0, **kwargs):
    """A randomly initialised (seeded) frozen causal LM."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab_size, layers, width, heads, **kwargs))
    return freeze(model)
