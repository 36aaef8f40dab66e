"""Compose two tiny models built offline and generate: the smallest end-to-end use of calm_core.

Run: python -m demos.compose_tiny
"""
import torch

from calm_core import CALMConfig, ComposedLM
from calm_core.models.tiny import bpe_tokenizer, char_tokenizer, tiny_model


def main():
    anchor_tok = char_tokenizer()
    augment_tok = bpe_tokenizer(["the quick brown fox jumps over the lazy dog"] * 8, vocab_size=300)
    anchor = tiny_model("gpt2", len(anchor_tok), layers=4, width=64, heads=4, seed=0)
    augment = tiny_model("llama", len(augment_tok), layers=4, width=48, heads=4, seed=1)
    calm = ComposedLM(anchor=(anchor, anchor_tok), augments=[(augment, augment_tok)], config=CALMConfig(every=2))
    calm.print_trainable_parameters()
    print("composition layers (augment, anchor layer, augmenting layer):", calm.layer_pairs())
    with torch.no_grad():
        print("closed gates, composed == anchor:",
              torch.equal(calm.logits(["the quick"]), anchor(**anchor_tok(["the quick"], return_tensors="pt")).logits))
    print("generated:", repr(calm.generate("the quick", max_new_tokens=16)))


if __name__ == "__main__":
    main()
