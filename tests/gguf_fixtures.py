"""A tiny Llama written as a GGUF file (float32 tensors, a byte-level BPE tokenizer), offline, in milliseconds."""
import json

import numpy as np
import torch


def write_tiny_llama_gguf(path, tokenizer, layers=2, width=32, heads=4, kv_heads=2, ff=64, seed=0):
    """Write a random Llama with `tokenizer`'s BPE vocabulary and merges into a .gguf file."""
    import gguf

    state = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(state["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: (torch.randn(*shape, generator=generator) * 0.2).numpy().astype(np.float32)
    ones = lambda n: np.ones(n, np.float32)
    head_dim = width // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128), w.add_embedding_length(width), w.add_block_count(layers)
    w.add_feed_forward_length(ff), w.add_head_count(heads), w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5), w.add_rope_dimension_count(head_dim), w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2"), w.add_token_list(tokens), w.add_token_merges(merges)
    w.add_token_types([1] * len(tokens)), w.add_bos_token_id(1), w.add_eos_token_id(2)
    w.add_tensor("token_embd.weight", rand(len(tokens), width))
    for i in range(layers):
        for name, shape in [("attn_q", (width, width)), ("attn_k", (kv_heads * head_dim, width)),
                            ("attn_v", (kv_heads * head_dim, width)), ("attn_output", (width, width)),
                            ("ffn_gate", (ff, width)), ("ffn_up", (ff, width)), ("ffn_down", (width, ff))]:
            w.add_tensor(f"blk.{i}.{name}.weight", rand(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(width)), w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(width))
    w.add_tensor("output_norm.weight", ones(width)), w.add_tensor("output.weight", rand(len(tokens), width))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def write_unknown_architecture_gguf(path):
    import gguf

    w = gguf.GGUFWriter(str(path), "notamodel")
    w.add_block_count(1), w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path
