"""Which device work runs on, and whether bf16 is fast there."""
from __future__ import annotations

import functools

import torch


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | None = None):
    """bf16 on a GPU that supports it (half the memory, tensor cores); float32 elsewhere."""
    if (device or default_device()) == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


@functools.lru_cache(maxsize=None)
def fast_bf16(device: str | None = None) -> bool:
    """Whether bf16 autocast speeds work up on this device: a GPU that supports it, or a CPU with AMX or
    AVX512-BF16. Elsewhere a CPU converts around every bf16 matrix product and runs slower than float32 (3.5-5x on
    AVX2 and AVX512 CPUs without either, 2 threads). A CPU question never touches CUDA."""
    if (device or default_device()) == "cuda":
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)() or
                getattr(cpu, "_is_amx_tile_supported", lambda: False)())
