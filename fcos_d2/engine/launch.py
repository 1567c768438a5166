"""``launch``: detectron2's ``launch``, plus torchrun and CPU-only machines.

How the workers start is chosen from the environment:

* under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set):
  torchrun already started one process per worker, so this process joins the job and runs
  ``main_func`` once;
* more than one worker and no CUDA: spawn CPU workers that talk over gloo (detectron2 v0.6
  can only spawn NCCL workers);
* otherwise: detectron2's own ``launch`` (one process, or one per GPU).
"""
import os
import socket
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from detectron2.engine import launch as d2_launch
from detectron2.utils import comm

from .. import compat

__all__ = ["DEFAULT_TIMEOUT", "launch"]

DEFAULT_TIMEOUT = timedelta(minutes=30)

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: Optional[str] = None,
    args: Sequence[Any] = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> None:
    """Runs ``main_func(*args)`` in every worker of a (possibly distributed) job.

    The signature is detectron2's ``launch``. Under torchrun, ``num_gpus_per_machine``,
    ``num_machines``, ``machine_rank`` and ``dist_url`` are ignored: torchrun's environment
    says how many workers there are and where to meet.

    Args:
        main_func: the function every worker runs.
        num_gpus_per_machine: workers per machine (GPUs, or CPU processes without CUDA).
        num_machines: machines in the job.
        machine_rank: the rank of this machine, 0-based.
        dist_url: where the workers meet, e.g. "tcp://10.0.0.1:8686"; "auto" (or None on
            one machine) picks a free port on localhost.
        args: positional arguments of ``main_func``.
        timeout: timeout of collective operations.
    """
    world_size = num_machines * num_gpus_per_machine
    if all(name in os.environ for name in _TORCHRUN_VARIABLES):
        _join_torchrun_job(timeout)
        main_func(*args)
        dist.destroy_process_group()
    elif world_size > 1 and not torch.cuda.is_available():
        if dist_url in (None, "auto"):
            if num_machines != 1:
                raise ValueError(f"dist_url={dist_url!r} picks a port on this machine; a job on "
                                 f"{num_machines} machines needs an explicit tcp://HOST:PORT")
            dist_url = f"tcp://127.0.0.1:{_free_port()}"
        mp.start_processes(
            _cpu_worker,
            nprocs=num_gpus_per_machine,
            args=(main_func, num_gpus_per_machine, num_machines, machine_rank, dist_url,
                  tuple(args), timeout),
            start_method="spawn",
        )
    else:
        d2_launch(main_func, num_gpus_per_machine, num_machines, machine_rank, dist_url,
                  args=tuple(args), timeout=timeout)


def _join_torchrun_job(timeout: timedelta) -> None:
    """Joins the process group that torchrun's environment describes (``env://``)."""
    has_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if has_cuda else "gloo", init_method="env://",
                            timeout=timeout)
    if has_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    else:
        _use_cpu_ddp_in_default_trainer()
    compat.create_local_process_group(int(os.environ["LOCAL_WORLD_SIZE"]))
    comm.synchronize()


def _cpu_worker(local_rank: int, main_func: Callable[..., Any], workers_per_machine: int,
                num_machines: int, machine_rank: int, dist_url: str, args: tuple,
                timeout: timedelta) -> None:
    """The body of one spawned CPU worker: join the gloo group, then run ``main_func``."""
    dist.init_process_group(backend="gloo", init_method=dist_url,
                            world_size=num_machines * workers_per_machine,
                            rank=machine_rank * workers_per_machine + local_rank, timeout=timeout)
    # Each worker would otherwise start one thread per core: N workers on N cores then run
    # N^2 threads and crawl. torchrun makes the same choice (OMP_NUM_THREADS).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers_per_machine))
    _use_cpu_ddp_in_default_trainer()
    compat.create_local_process_group(workers_per_machine)
    comm.synchronize()
    main_func(*args)
    dist.destroy_process_group()


def _use_cpu_ddp_in_default_trainer() -> None:
    """Makes ``DefaultTrainer`` able to wrap a CPU model in DistributedDataParallel.

    detectron2's ``create_ddp_model`` (v0.6 and main) passes ``device_ids=[local rank]``,
    which DistributedDataParallel rejects for a module on the CPU; a CPU module needs
    ``device_ids=None``. ``DefaultTrainer.__init__`` looks the function up in its module at
    call time, so replacing it there is enough. Only CPU workers call this.
    """
    from detectron2.engine import defaults

    create_ddp_model = defaults.create_ddp_model

    def create_cpu_ddp_model(model, **kwargs):
        kwargs.setdefault("device_ids", None)
        return create_ddp_model(model, **kwargs)

    defaults.create_ddp_model = create_cpu_ddp_model


def _free_port() -> int:
    """A TCP port that is free on localhost now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
