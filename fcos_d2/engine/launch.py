"""``launch``: detectron2's ``launch``, plus torchrun and CPU-only machines.

How the workers start is chosen from the environment:

* under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set):
  torchrun already started one process per worker, so this process joins the job and runs
  ``main_func`` once;
* more than one worker and no CUDA: start CPU workers that talk over gloo (detectron2 v0.6
  can only spawn NCCL workers), forked from a fork server that imported everything once;
* otherwise: detectron2's own ``launch`` (one process, or one per GPU).

In every worker, the preemption signals (``--preemption-signals``, see ``preemption``) are
installed and, in jobs of several workers, the heartbeat that ends the job when a worker
stalls (``--stall-timeout``, see ``heartbeat``). A process that spawned its machine's
workers passes those signals on to them, and exits with the status of a worker that was
preempted (75) or that ended the job for a stalled worker (76).
"""
import argparse
import functools
import multiprocessing.connection
import os
import signal
import socket
from datetime import timedelta
from typing import Any, Callable, NamedTuple, Optional, Sequence
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from detectron2.engine import launch as d2_launch
from detectron2.utils import comm

from .. import compat
from .heartbeat import STALLED_EXIT_CODE, start_heartbeat
from .preemption import (PREEMPTED_EXIT_CODE, forward_signals_to_children,
                         install_preemption_handlers, parse_signals)

__all__ = ["DEFAULT_STALL_TIMEOUT", "DEFAULT_TIMEOUT", "WorkerLostError",
           "add_launcher_arguments", "launch", "launch_from_args"]

DEFAULT_TIMEOUT = timedelta(minutes=30)
DEFAULT_STALL_TIMEOUT = 120.0  # seconds

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

# What gloo says when the other end of a collective is gone or silent.
_LOST_WORKER_SIGNS = ("Connection reset by peer", "Connection closed by peer", "Timed out",
                      "Broken pipe", "Connection refused")


class WorkerLostError(RuntimeError):
    """Another worker of the job died or stopped answering during a collective."""


def add_launcher_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds what launchers pass to the script: ``--local-rank`` / ``--local_rank`` (from
    ``python -m torch.distributed.launch``, which also sets the environment variables that
    torchrun sets), ``--dist-timeout``, ``--preemption-signals`` and ``--stall-timeout``."""
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None,
                        action=_LocalRankAction, help="set by torch.distributed.launch; the "
                        "worker's rank on its machine (also read from $LOCAL_RANK)")
    parser.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT.total_seconds(),
                        metavar="SECONDS", help="how long a worker waits for the others in a "
                        "collective operation before it stops with an error")
    parser.add_argument("--preemption-signals", nargs="*", default=["SIGTERM"], metavar="SIG",
                        help="signals after which training saves a checkpoint of the current "
                        "iteration and exits with status 75 (resume with --resume); e.g. "
                        "SIGTERM SIGUSR1; the flag without a name: none")
    parser.add_argument("--stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT,
                        metavar="SECONDS", help="end the whole job (status 76) when a worker "
                        "sends no heartbeat for this long (a frozen process or machine); 0: "
                        "no heartbeat")
    return parser


class _LocalRankAction(argparse.Action):
    """Stores --local-rank and makes $LOCAL_RANK agree with it (torch < 1.9 set only the
    argument)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if os.environ.setdefault("LOCAL_RANK", str(value)) != str(value):
            parser.error(f"{option_string} {value} differs from the environment's "
                         f"LOCAL_RANK={os.environ['LOCAL_RANK']}")
        setattr(namespace, self.dest, value)


class _WorkerOptions(NamedTuple):
    """What every worker sets up around ``main_func``."""
    preemption_signals: tuple  # signal numbers
    stall_timeout: float  # seconds; 0: no heartbeat
    rank0_host: str  # where the other workers reach rank 0


def launch_from_args(main_func: Callable[..., Any], args: argparse.Namespace) -> None:
    """``launch(main_func, ...)`` with the flags of detectron2's ``default_argument_parser``
    and ``add_launcher_arguments``, and ``args`` as main_func's argument."""
    launch(main_func, args.num_gpus, num_machines=args.num_machines,
           machine_rank=args.machine_rank, dist_url=args.dist_url, args=(args,),
           timeout=timedelta(seconds=args.dist_timeout),
           preemption_signals=args.preemption_signals, stall_timeout=args.stall_timeout)


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: Optional[str] = None,
    args: Sequence[Any] = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
    preemption_signals: Sequence[str] = ("SIGTERM",),
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
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
        preemption_signals: signal names that make the training save and exit with
            status 75 (see ``preemption``).
        stall_timeout: seconds without a heartbeat after which a worker counts as stalled
            and the job ends with status 76 (see ``heartbeat``); 0: no heartbeat.
    """
    world_size = num_machines * num_gpus_per_machine
    signals = tuple(parse_signals(preemption_signals))
    options = _WorkerOptions(signals, stall_timeout, _host_of(dist_url))
    if all(name in os.environ for name in _TORCHRUN_VARIABLES):
        _join_torchrun_job(timeout)
        _run_in_job(main_func, args, options._replace(
            rank0_host=os.environ.get("MASTER_ADDR", "127.0.0.1")))
        dist.destroy_process_group()
    elif world_size > 1 and not torch.cuda.is_available():
        if dist_url in (None, "auto"):
            if num_machines != 1:
                raise ValueError(f"dist_url={dist_url!r} picks a port on this machine; a job on "
                                 f"{num_machines} machines needs an explicit tcp://HOST:PORT")
            dist_url = f"tcp://127.0.0.1:{_free_port()}"
            options = options._replace(rank0_host="127.0.0.1")
        worker_args = (main_func, num_gpus_per_machine, num_machines, machine_rank, dist_url,
                       tuple(args), timeout, options)
        if num_gpus_per_machine == 1:  # one worker on this machine: this process is it, so
            _cpu_worker(0, None, *worker_args)  # that stopping this process stops the worker
        else:
            with _SpawnedWorkers(signals):
                _join_workers(_start_cpu_workers(main_func, num_gpus_per_machine, worker_args))
    else:
        with _SpawnedWorkers(signals if world_size > 1 else ()):
            d2_launch(functools.partial(_d2_worker, main_func, options), num_gpus_per_machine,
                      num_machines, machine_rank, dist_url, args=tuple(args), timeout=timeout)


class _SpawnedWorkers:
    """Around spawning workers: passes the preemption signals on to them, and exits with
    status 75 or 76 when a worker does (torch would raise ProcessExitedException)."""

    def __init__(self, signals: Sequence[int]):
        self._signals = signals

    def __enter__(self):
        self._restore = forward_signals_to_children(self._signals)

    def __exit__(self, kind, error, traceback):
        self._restore()
        code = getattr(error, "exit_code", None)
        if isinstance(error, mp.ProcessExitedException) and code in (PREEMPTED_EXIT_CODE,
                                                                     STALLED_EXIT_CODE):
            raise SystemExit(code) from None


def _join_workers(context: mp.ProcessContext) -> None:
    """Waits for the spawned workers. When one ended the job for a stalled worker (76), the
    others are killed at once (torch's join would send SIGTERM and wait 30 s before
    SIGKILL, and a stopped process does not act on SIGTERM) and this process exits with 76;
    when they all exit with 0 or 75 (preempted), with 75. Otherwise torch's join reports
    the error of a worker and ends the others."""
    processes = context.processes
    while any(p.exitcode is None for p in processes):
        codes = {p.exitcode for p in processes}
        if STALLED_EXIT_CODE in codes:
            for process in processes:
                if process.exitcode is None:
                    process.kill()
        elif codes - {None, 0, PREEMPTED_EXIT_CODE}:
            break
        multiprocessing.connection.wait([p.sentinel for p in processes if p.exitcode is None],
                                        timeout=1.0)
    codes = {p.exitcode for p in processes}
    if STALLED_EXIT_CODE in codes:
        raise SystemExit(STALLED_EXIT_CODE)
    if PREEMPTED_EXIT_CODE in codes and codes <= {0, PREEMPTED_EXIT_CODE}:
        raise SystemExit(PREEMPTED_EXIT_CODE)
    while not context.join():
        pass


def _host_of(dist_url: Optional[str]) -> str:
    """The host of ``tcp://HOST:PORT``, where machine 0 (and so rank 0) runs."""
    host = urlparse(dist_url).hostname if dist_url and "://" in dist_url else None
    return host or "127.0.0.1"


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


def _cpu_start_method() -> str:
    """fork where this process runs one thread, else forkserver where the platform has it,
    else spawn. A spawned worker imports torch, detectron2 and fcos_d2 anew (12 s of CPU
    each on a busy 2-core AVX2 EPYC); a fork inherits them. Forking is safe with one thread
    (no lock held by another, no OpenMP pool to inherit): ``train_net.py`` launches before
    it computes, and has one thread where ``OMP_NUM_THREADS=1``. Otherwise the fork server
    imports them once and forks every worker from that; it never computes, and starts no
    CUDA (forkserver is CUDA-safe)."""
    if _single_threaded():
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _single_threaded() -> bool:
    """Whether this process runs one thread (Linux's /proc/self/task; False elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _start_cpu_workers(main_func: Callable[..., Any], nprocs: int,
                       worker_args: tuple) -> mp.ProcessContext:
    """Starts this machine's `nprocs` CPU workers (``_cpu_worker``) without waiting: forks
    of this process where it runs one thread, else of the fork server (``_cpu_start_method``).

    The fork server preloads fcos_d2, the module of `main_func` and
    the main script, as each spawned worker would import them. It lives as long as this
    process and serves later launches too, so each worker is handed this process's
    environment of now, as spawn would give it (its stdout and stderr stay the server's:
    this process's when it first launched workers)."""
    method = _cpu_start_method()
    if method == "forkserver":
        module = getattr(main_func, "__module__", None) or "__main__"
        multiprocessing.get_context(method).set_forkserver_preload(
            sorted({"__main__", "fcos_d2", module}))
    return mp.start_processes(_cpu_worker, nprocs=nprocs, args=(dict(os.environ), *worker_args),
                              start_method=method, join=False)


def _threads_per_worker(workers_per_machine: int) -> int:
    """Intra-op threads of a CPU worker: ``OMP_NUM_THREADS`` where it is a positive
    integer, else this machine's cores shared among its workers. Each worker would
    otherwise start one thread per core: N workers on N cores then run N^2 threads and
    crawl; torchrun makes the same choice."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, (os.cpu_count() or 1) // workers_per_machine)


def _cpu_worker(local_rank: int, environ: Optional[dict], main_func: Callable[..., Any],
                workers_per_machine: int, num_machines: int, machine_rank: int, dist_url: str,
                args: tuple, timeout: timedelta, options: _WorkerOptions) -> None:
    """The body of one CPU worker: take the launching process's `environ` (None: this is
    that process), join the gloo group, then run ``main_func``."""
    if environ is not None:  # a fork of the fork server holds the server's environment
        os.environ.clear()
        os.environ.update(environ)
        for number in options.preemption_signals:  # a fork of the launching process holds
            signal.signal(number, signal.SIG_DFL)  # its forwarding handlers: as spawned
    dist.init_process_group(backend="gloo", init_method=dist_url,
                            world_size=num_machines * workers_per_machine,
                            rank=machine_rank * workers_per_machine + local_rank, timeout=timeout)
    # torch read OMP_NUM_THREADS when the fork server imported it: set from this
    # worker's environment, as a spawned worker's torch would read it
    torch.set_num_threads(_threads_per_worker(workers_per_machine))
    _use_cpu_ddp_in_default_trainer()
    compat.create_local_process_group(workers_per_machine)
    comm.synchronize()
    _run_in_job(main_func, args, options)
    dist.destroy_process_group()


def _d2_worker(main_func: Callable[..., Any], options: _WorkerOptions, *args: Any) -> None:
    """What detectron2's ``launch`` runs in each worker (or in this process alone)."""
    if dist.is_available() and dist.is_initialized():
        _run_in_job(main_func, args, options)
    else:
        _run_with_options(main_func, args, options)


def _run_with_options(main_func: Callable[..., Any], args: Sequence[Any],
                      options: _WorkerOptions) -> None:
    """Runs ``main_func(*args)`` with the preemption handlers and, in a process group of
    several workers, the heartbeat."""
    install_preemption_handlers(options.preemption_signals)
    grouped = dist.is_available() and dist.is_initialized()
    heartbeat = start_heartbeat(options.stall_timeout, options.rank0_host) if grouped else None
    try:
        main_func(*args)
    finally:
        if heartbeat is not None:
            heartbeat.stop()


def _run_in_job(main_func: Callable[..., Any], args: Sequence[Any],
                options: _WorkerOptions) -> None:
    """Runs ``main_func(*args)`` in a worker of a process group (``_run_with_options``); a
    collective that fails because another worker is gone raises ``WorkerLostError``, which
    says so."""
    try:
        _run_with_options(main_func, args, options)
    except RuntimeError as error:
        if not any(sign in str(error) for sign in _LOST_WORKER_SIGNS):
            raise
        raise WorkerLostError(
            f"worker {dist.get_rank()} of {dist.get_world_size()} lost contact with another "
            f"worker of the job: it died, or did not answer within the collective timeout "
            f"(--dist-timeout). This worker stops too; the first error is in the log of the "
            f"worker that stopped first. (gloo: {str(error).splitlines()[0][:300]})") from error


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
