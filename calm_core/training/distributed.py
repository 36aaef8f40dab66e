"""Data parallelism under `accelerate launch`: each process takes its share of every global batch
and the bridge's gradients are summed across processes; a no-op for one process."""
from __future__ import annotations

import os

import torch


class Distributed:
    """The process group when run under `accelerate launch`; a no-op for one process."""

    def __init__(self):
        self.world, self.rank, self.accelerator = 1, 0, None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self.world, self.rank = self.accelerator.num_processes, self.accelerator.process_index

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    def broadcast_parameters(self, module) -> None:
        """Every process starts from rank 0's bridge."""
        if self.world > 1:
            for p in module.parameters():
                torch.distributed.broadcast(p.data, src=0)

    def barrier(self):
        if self.world > 1:
            self.accelerator.wait_for_everyone()
