"""``python -m fcos_d2.submit``: train_net.py, or the LazyConfig tool, as a submitit job.

    python -m fcos_d2.submit --nodes 2 --gpus-per-node 8 --partition learnlab --timeout 4320 \\
        --config-file configs/FCOS-R50.yaml
    python -m fcos_d2.submit --local 2 --config-file configs/quickstart.yaml SOLVER.MAX_ITER 20

The flags of this module size the job; every other argument is train_net.py's (or, for a
``.py`` config, ``tools/lazyconfig_train_net.py``'s) and goes to the training unchanged.

**One task per GPU.** SLURM starts ``nodes x gpus-per-node`` tasks; each is one worker of
the job, which joins the process group through ``launch``'s torchrun path (env://) with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set from submitit's ``JobEnvironment``. So no process spawns workers: SLURM
binds each task to its GPU and CPUs, submitit writes a log per task and sends its signal to
every worker directly, and only global rank 0 requeues.

**Preemption and time-out.** submitit asks SLURM to send ``USR2`` ``--signal-delay``
seconds before the time limit (and SLURM preemption sends it as well where configured).
The job makes USR2 a preemption signal of the training (``fcos_d2.engine.preemption``):
every worker finishes its iteration, rank 0 writes ``model_<iteration>.pth`` with the
data-stream and RNG states, and then rank 0 hands over to submitit's own handler, which
calls ``TrainingJob.checkpoint`` (the same job with ``--resume``) and requeues it. The
requeued job continues at the next iteration with the saved weights, as an uninterrupted
run would. SIGTERM alone (``scancel``, or SLURM's kill) saves and exits with status 75
without a requeue. Outside the training loop (setup, evaluation) USR2 goes to submitit's
handler at once: the job is requeued and resumes from its last checkpoint.
"""
import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

try:
    import submitit
except ImportError as error:  # a clear message instead of a bare ModuleNotFoundError
    raise ImportError("python -m fcos_d2.submit needs submitit (pinned in requirements.txt: "
                      "pip install -r requirements.txt); without it, submit with "
                      "tools/slurm/train.sbatch (docs/cluster.md)") from error

from .preemption import PREEMPTED_EXIT_CODE, handle_outside_training, received_signal
from .slurm import job_port

__all__ = ["SubmitOptions", "TrainingJob", "check_training_argv", "executor_parameters",
           "rendezvous_environment", "submit", "submit_argument_parser", "training_entry_point"]

# Flags of train_net.py that the job's size sets; given with fcos_d2.submit, they would
# contradict it.
_SIZED_BY_THE_JOB = ("--num-gpus", "--num-machines", "--machine-rank", "--dist-url")


class SubmitOptions(NamedTuple):
    """What ``python -m fcos_d2.submit`` was asked for, besides the training's arguments."""
    nodes: int = 1
    gpus_per_node: int = 8
    partition: Optional[str] = None
    timeout: int = 4320  # minutes
    comment: Optional[str] = None
    constraint: Optional[str] = None
    cpus_per_task: int = 8
    signal_delay: int = 120  # seconds
    local: int = 0  # CPU workers on this machine; 0: SLURM
    job_dir: str = "output/submitit"


def submit_argument_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m fcos_d2.submit``; the rest of the command line is the
    training's (``parse_known_args``)."""
    defaults = SubmitOptions()
    parser = argparse.ArgumentParser(
        prog="python -m fcos_d2.submit", allow_abbrev=False,
        description="Submits train_net.py (a .yaml config) or tools/lazyconfig_train_net.py "
                    "(a .py config) to SLURM through submitit, or runs it locally. Arguments "
                    "not listed here go to the training.")
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="machines in the job")
    parser.add_argument("--gpus-per-node", type=int, default=defaults.gpus_per_node,
                        help="GPUs per machine, one task (worker) each")
    parser.add_argument("--partition", default=None, help="SLURM partition")
    parser.add_argument("--timeout", type=int, default=defaults.timeout, metavar="MINUTES",
                        help="time limit of one run of the job; it requeues itself after it")
    parser.add_argument("--comment", default=None, help="SLURM job comment")
    parser.add_argument("--constraint", default=None, help="SLURM constraint, e.g. volta32gb")
    parser.add_argument("--cpus-per-task", type=int, default=defaults.cpus_per_task,
                        help="CPUs per worker (its data loader's processes run on them)")
    parser.add_argument("--signal-delay", type=int, default=defaults.signal_delay,
                        metavar="SECONDS", help="USR2 this long before the time limit: give "
                        "it one iteration, one checkpoint save and a margin")
    parser.add_argument("--local", type=int, default=0, metavar="N",
                        help="run here with submitit's LocalExecutor, N CPU workers, and wait")
    parser.add_argument("--job-dir", default=defaults.job_dir,
                        help="submitit's folder: the job's pickles and a log per task")
    return parser


def _options(parsed: argparse.Namespace) -> SubmitOptions:
    return SubmitOptions(**{name: getattr(parsed, name) for name in SubmitOptions._fields})


def executor_parameters(options: SubmitOptions) -> Dict[str, Any]:
    """submitit's executor parameters for ``options``: sbatch's names for SLURM
    (``SlurmExecutor.update_parameters``), ``LocalExecutor``'s for ``--local N``."""
    if options.local:
        return {"tasks_per_node": options.local, "gpus_per_node": 0, "nodes": 1,
                "timeout_min": options.timeout, "signal_delay_s": options.signal_delay}
    parameters = {"job_name": "fcos-d2", "nodes": options.nodes,
                  "ntasks_per_node": options.gpus_per_node,
                  "gpus_per_node": options.gpus_per_node,
                  "cpus_per_task": options.cpus_per_task, "time": options.timeout,
                  "signal_delay_s": options.signal_delay}
    for key in ("partition", "comment", "constraint"):
        if getattr(options, key):
            parameters[key] = getattr(options, key)
    return parameters


def rendezvous_environment(env: Any, environ: Dict[str, str]) -> Dict[str, str]:
    """The variables of ``launch``'s torchrun path for the task that submitit's
    JobEnvironment ``env`` describes. MASTER_ADDR: the first host of the job (127.0.0.1 on
    one machine); MASTER_PORT: ``environ``'s if set, else one derived from the job id."""
    if env.num_tasks % env.num_nodes:
        raise ValueError(f"submitit job {env.job_id}: {env.num_tasks} tasks on {env.num_nodes} "
                         "nodes; fcos_d2.submit starts the same number of tasks on every node")
    host = "127.0.0.1" if env.num_nodes == 1 else env.hostnames[0]
    port = environ.get("MASTER_PORT") or str(job_port(env.raw_job_id))
    return {"RANK": str(env.global_rank), "WORLD_SIZE": str(env.num_tasks),
            "LOCAL_RANK": str(env.local_rank),
            "LOCAL_WORLD_SIZE": str(env.num_tasks // env.num_nodes),
            "MASTER_ADDR": host, "MASTER_PORT": port}


def with_resume(argv: Sequence[str]) -> List[str]:
    """``argv`` with ``--resume`` before the trailing overrides (once)."""
    return list(argv) if "--resume" in argv else ["--resume", *argv]


class TrainingJob:
    """What every submitit task runs: one worker of the training ``argv`` (train_net.py's
    arguments, or the LazyConfig tool's when the config file ends with ``.py``), in the
    folder ``cwd``. ``checkpoint`` is submitit's hook: the same job with ``--resume``."""

    def __init__(self, argv: Sequence[str], cwd: str):
        self.argv, self.cwd = list(argv), cwd

    def __call__(self) -> None:
        os.chdir(self.cwd)
        env = submitit.JobEnvironment()
        os.environ.update(rendezvous_environment(env, dict(os.environ)))
        if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
            local_workers = int(os.environ["LOCAL_WORLD_SIZE"])  # share the cores, as torchrun
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_workers))
        parser, main, launch_from_args = training_entry_point(self.argv)
        args = parser.parse_args(self.argv)
        # USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise; submitit's handler of it
        # calls checkpoint() and requeues
        requeue_signal = signal.Signals["SIG" + env.USR_SIG]
        requeue = signal.getsignal(requeue_signal)
        if not callable(requeue):
            raise RuntimeError(f"TrainingJob runs inside a submitit job: {requeue_signal.name} "
                               "has no submitit handler here")
        args.preemption_signals = [*args.preemption_signals, requeue_signal.name]
        handle_outside_training(requeue_signal, requeue)
        try:
            launch_from_args(main, args)
        except SystemExit as stop:
            mine = received_signal()  # rank 0 requeues unless its own signal was another
            if stop.code == PREEMPTED_EXIT_CODE and mine in (None, requeue_signal.name):
                requeue(requeue_signal, None)  # rank 0: exits; the others: returns
            raise

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's requeue hook: the same training, resumed from its last checkpoint."""
        return submitit.helpers.DelayedSubmission(TrainingJob(with_resume(self.argv), self.cwd))


def training_entry_point(
        argv: Sequence[str]) -> Tuple[argparse.ArgumentParser, Callable, Callable]:
    """(parser, main, launch_from_args) of train_net.py, or of tools/lazyconfig_train_net.py
    for a ``.py`` config."""
    from .launch import add_launcher_arguments, launch_from_args

    if _config_file(argv).endswith(".py"):
        import importlib.util

        from detectron2.engine import default_argument_parser

        from ..project_files import project_dir
        path = project_dir() / "tools" / "lazyconfig_train_net.py"
        spec = importlib.util.spec_from_file_location("lazyconfig_train_net", path)
        tool = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tool)
        return add_launcher_arguments(default_argument_parser()), tool.main, launch_from_args
    from .trainer import argument_parser, main
    return argument_parser(), main, launch_from_args


def _config_file(argv: Sequence[str]) -> str:
    for index, item in enumerate(argv):
        if item.startswith("--config-file="):
            return item.split("=", 1)[1]
        if item == "--config-file" and index + 1 < len(argv):
            return argv[index + 1]
    return ""


def check_training_argv(argv: Sequence[str]) -> None:
    """Refuses what the job's size decides, and a training command line its script would
    not accept (before anything is queued)."""
    for flag in _SIZED_BY_THE_JOB:
        if any(item == flag or item.startswith(flag + "=") for item in argv):
            raise SystemExit(f"fcos_d2.submit: {flag} is set by the job's size (--nodes, "
                             "--gpus-per-node, --local); leave it out")
    if not _config_file(argv):
        raise SystemExit("fcos_d2.submit: give the training's --config-file")
    parser, _, _ = training_entry_point(argv)
    parser.prog = "python -m fcos_d2.submit: the training's arguments"
    parser.parse_args(argv)  # exits with argparse's message on a bad flag


def submit(options: SubmitOptions, argv: Sequence[str]) -> submitit.Job:
    """Queues the training ``argv`` (SLURM, or LocalExecutor with ``options.local``)."""
    folder = Path(options.job_dir) / "%j"
    if options.local:
        executor = submitit.LocalExecutor(folder=folder)
    else:
        executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(**executor_parameters(options))
    return executor.submit(TrainingJob(argv, os.getcwd()))


def main(command_line: Optional[Sequence[str]] = None) -> None:
    """``python -m fcos_d2.submit``: queues the job and prints where its logs go; with
    ``--local N``, waits for it and exits with an error if a task failed."""
    parsed, argv = submit_argument_parser().parse_known_args(
        sys.argv[1:] if command_line is None else command_line)
    check_training_argv(argv)
    options = _options(parsed)
    job = submit(options, argv)
    print(f"submitted job {job.job_id}: logs in {job.paths.folder} "
          f"({job.job_id}_<task>_log.out / .err)")
    if options.local:
        job.results()  # raises submitit's error (with the failed task's traceback)
        print(f"job {job.job_id} finished")
