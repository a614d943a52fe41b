"""The ranks > 0 of a tensor-parallel fast engine: join the process groups, build the model runner
over this rank's shard, then replay every step rank 0 sends until it says stop.

Two ways to get here:

* started by the engine (fast.tp_launch, one host): the process runs `python -m fast.tp_worker_process`,
  which receives this spec from rank 0 over a socket pair, reports to rank 0 on it (started, or the
  traceback of a failure) and exits when rank 0's process exits, whatever happens to it;
* started by torchrun (several hosts): every rank runs the user's script; on ranks > 0 the fast
  engine's constructor calls `serve_rank` and then ends the process (SystemExit(0)) once rank 0
  shuts down, so the script's code after the constructor runs on rank 0 only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from fast.model_runner import ModelRunner
from fast.parallel import init_process_groups
from fast.sharded_loading import WeightSource
from spec.engine_config import EngineConfig
from spec.model_config import ModelConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank builds its runner from (picklable: sent to the worker processes)."""

    model_config: ModelConfig
    weights: WeightSource
    engine_config: EngineConfig  # tensor_parallel_size set
    dtype: torch.dtype
    base_device: str  # rank r runs on cuda:(index + r) of this device, or on the CPU
    init_method: str  # torch.distributed rendezvous: tcp://host:port, or env:// under torchrun
    num_threads: int  # torch intra-op threads, as in rank 0's process
    allow_one_shot: bool = True

    @property
    def world_size(self) -> int:
        return self.engine_config.tensor_parallel_size

    def device_for(self, rank: int) -> torch.device:
        base = torch.device(self.base_device)
        if base.type != "cuda":
            return base
        return torch.device("cuda", (base.index or 0) + rank)


def serve_rank(rank: int, device: torch.device, spec: WorkerSpec) -> None:
    """Join the groups, build this rank's runner (the start-up collectives meet rank 0's), serve until stop."""
    torch.set_num_threads(spec.num_threads)
    groups = init_process_groups(rank, spec.world_size, device, spec.init_method)
    runner = ModelRunner(
        spec.model_config, spec.weights, spec.engine_config, spec.dtype, device, groups, spec.allow_one_shot
    )
    spec.weights.release()
    logger.info("tensor-parallel rank %d of %d ready on %s", rank, spec.world_size, device)
    runner.serve()
    logger.info("tensor-parallel rank %d: stop received", rank)
    runner.release_graphs()  # before the groups: captured NCCL collectives pin the communicator
    groups.destroy()
    logger.info("tensor-parallel rank %d: process groups destroyed", rank)
