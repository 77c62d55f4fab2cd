"""Process-group set-up from torchrun's environment (torch.distributed, nothing home-made).

`torchrun --nproc_per_node N ...` (and on several machines, the same command with its rendezvous
flags) sets RANK, WORLD_SIZE and LOCAL_RANK; a plain `python`/`longdoc` run has none and trains in
one process. Backends: nccl on GPUs, gloo on CPU.
"""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ProcessInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets WORLD_SIZE, to 1 as well for one process)."""
    return "WORLD_SIZE" in os.environ


def start_processes() -> ProcessInfo:
    """Join torchrun's process group when there is one; the device this process trains on."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return ProcessInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def stop_processes(info: ProcessInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: ProcessInfo) -> None:
    if info.distributed:
        dist.barrier()


def gather_objects(info: ProcessInfo, value) -> list:
    """`value` from every process, in rank order (one-element list in a single process)."""
    if not info.distributed:
        return [value]
    gathered = [None] * info.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def gather_to_main(info: ProcessInfo, value) -> list | None:
    """`value` from every process, in rank order, in the main process (None in the others)."""
    if not info.distributed:
        return [value]
    gathered = [None] * info.world_size if info.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


class SharedCounters:
    """Counters that every process adds to and any process reads without waiting for the others:
    keys in the store of torchrun's rendezvous, under `name` (a collective would make each process
    wait for the slowest one at every count)."""

    def __init__(self, info: ProcessInfo, name: str):
        self._local: dict[str, int] = {}
        self._store = None
        if info.distributed:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  wait_for_workers=False)
            self._store = dist.PrefixStore(name, store)

    def add(self, key: str, amount: int) -> int:
        """Add `amount` to the counter `key`; its value after."""
        if self._store is not None:
            return self._store.add(key, amount)
        self._local[key] = self._local.get(key, 0) + amount
        return self._local[key]

    def read(self, key: str) -> int:
        return self.add(key, 0)
