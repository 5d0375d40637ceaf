"""Several training processes on PyTorch's own engine: torch.distributed, DDP and FSDP2.

One process per GPU (per CPU process in tests), started by torchrun or by Slurm (one task per
GPU, as ``diffsweep launch`` requests). Where the rank, world size and rendezvous come from:

- torchrun (or anything that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``);
- a submitit Slurm job with several tasks: submitit's ``TorchDistributedEnvironment`` exports
  the same variables from the job (first host of the node list, a port from the job id).

NCCL on GPUs, gloo on CPU. ``train.parallel`` picks DDP (a replica per process, gradients
all-reduced) or FSDP2 (``fully_shard`` per block, then the root: parameters, gradients and
optimizer state sharded). Each process reads its own slice of every global batch, so the global
token batch is the sweep's whatever the world size.

Checkpoints hold the model and optimizer state keyed by parameter name
(``torch.distributed.checkpoint.state_dict``), each process writing its own shards
(``diffsweep.train.checkpoint``): a run resumes with any number of processes, one included.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from diffsweep.config import Parallel
from diffsweep.model.transformer import LanguageModel


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def world_from_env() -> World:
    """The world torchrun or a multi-task submitit Slurm job describes (exporting the latter as
    torchrun's variables); a single process otherwise."""
    if "WORLD_SIZE" not in os.environ and os.environ.get("SUBMITIT_EXECUTOR") == "slurm" \
            and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    if "WORLD_SIZE" not in os.environ:
        return World()
    return World(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0")))


@contextmanager
def process_group(world: World, device: torch.device) -> Iterator[None]:
    """The default process group for the duration of training (nothing for a single process).

    Whatever holds the group from C++ (DDP's reducer) must be freed inside the block: a group
    whose last reference is dropped there is destroyed with the GIL held, and gloo's destructor
    joins worker threads that may be waiting for the GIL to free a finished collective's tensors
    (a deadlock at exit, seen about once in ten 2-process runs on a loaded 2-core machine).
    Dropped here, by ``destroy_process_group``, the group is destroyed without the GIL."""
    if not world.distributed or dist.is_initialized():
        yield
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=world.rank,
                            world_size=world.world_size, device_id=device if device.type == "cuda" else None)
    try:
        yield
    finally:
        gc.collect()  # a DDP model in a reference cycle goes now, while the group is still registered
        dist.destroy_process_group()


def wrap(model: LanguageModel, parallel: Parallel, world: World, device: torch.device,
         param_dtype: torch.dtype | None) -> nn.Module:
    """``model`` ready for data-parallel training: as is for one process, else DDP or FSDP2.

    FSDP2 shards each transformer block, then the root (embeddings, final norm, tied head); with
    bf16 training its parameters are gathered in bf16 and gradients reduced in fp32 (fp32 master
    weights stay sharded)."""
    if not world.distributed:
        return model
    if parallel is Parallel.DDP:
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else \
        MixedPrecisionPolicy()
    for block in model.layers:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself (DDP holds it as ``module``; FSDP2 shards it in place)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, list]:
    """What a checkpoint holds, as this process holds it: the tensors ``{"model": ..., "optimizer":
    ...}`` (weights and AdamW state by parameter name; DTensor shards under FSDP2, whole tensors
    otherwise) and the optimizer's hyperparameter groups (plain values, saved beside them). An
    optimizer that has not stepped yet gets its state allocated, so a checkpoint can fill it."""
    model_state, optim_state = get_state_dict(model, optimizer)
    groups = optim_state["param_groups"]
    # A list (one dict per group); torch types the values of the optimizer state as dict | list.
    assert isinstance(groups, list), "an optimizer state's param_groups are a list"
    return {"model": model_state, "optimizer": optim_state["state"]}, groups


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, tensors: dict, groups: list) -> None:
    """Put ``sharded_state``'s tensors (filled from a checkpoint) and groups back into the model
    and optimizer."""
    set_state_dict(model, optimizer, model_state_dict=tensors["model"],
                   optim_state_dict={"state": tensors["optimizer"], "param_groups": groups})


def non_finite(state: dict) -> list[str]:
    """Names of the floating-point tensors in ``state`` whose part on this process is not finite."""
    local = {name: t.to_local() if isinstance(t, DTensor) else t for name, t in state.items()}
    return [name for name, t in local.items() if t.is_floating_point() and not torch.isfinite(t).all()]


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optim_state: dict) -> None:
    """Load a whole (unsharded) model and optimizer state keyed by parameter name, as single-file
    checkpoints hold it, into a wrapped or plain model (every rank reads it)."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optim_state, options=options)


def sum_all(values: list[float], world: World) -> list[float]:
    """``values`` added up elementwise over all processes (in float64)."""
    if not world.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t)
    return t.tolist()


def mean(value: float, world: World) -> float:
    """The mean of ``value`` over all processes."""
    return sum_all([value], world)[0] / world.world_size


def any_rank(flag: bool, world: World) -> bool:
    """True on every process if it is true on any (e.g. a preemption signal reached one of them)."""
    if not world.distributed:
        return flag
    t = torch.tensor([int(flag)], device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
