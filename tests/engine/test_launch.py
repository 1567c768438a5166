"""fcos_d2.engine.launch: one process, workers started by torch.distributed.launch
(torchrun), and what CPU workers forked from the fork server inherit. Their gloo group and
gradients are checked in tests/engine/test_multiprocess.py."""
import argparse
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from detectron2.engine import defaults
from detectron2.utils import comm

from fcos_d2.engine.launch import add_launcher_arguments, launch

REPO = Path(__file__).resolve().parents[2]


def worker_report(ddp) -> dict:
    """What this worker sees of the job, and the type DefaultTrainer's wrapping gave `ddp`."""
    return {"rank": comm.get_rank(), "world_size": comm.get_world_size(),
            "local_rank": comm.get_local_rank(), "local_size": comm.get_local_size(),
            "backend": dist.get_backend(), "ddp": type(ddp).__name__}


def report_worker(folder: str, **extra) -> None:
    """Writes what this worker sees (and `extra`) to <folder>/<rank>.json; fails if called
    twice."""
    ddp = defaults.create_ddp_model(torch.nn.Linear(2, 2), broadcast_buffers=False)
    with open(Path(folder) / f"{comm.get_rank()}.json", "x") as f:
        json.dump({**worker_report(ddp), **{f"parsed_{k}": v for k, v in extra.items()}}, f)


def reports(folder: Path):
    return sorted((json.loads(p.read_text()) for p in folder.glob("*.json")),
                  key=lambda r: r["rank"])


def expected_reports(world_size: int):
    return [{"rank": r, "world_size": world_size, "local_rank": r, "local_size": world_size,
             "backend": "gloo", "ddp": "DistributedDataParallel"} for r in range(world_size)]


@pytest.fixture
def cpu_only():
    if torch.cuda.is_available():
        pytest.skip("CPU workers are spawned only where CUDA is not available")


def test_one_process_runs_main_here_without_a_process_group():
    calls = []
    launch(lambda x: calls.append((x, dist.is_initialized())), 1, args=("x",))
    assert calls == [("x", False)]


def test_auto_dist_url_is_refused_for_several_machines(cpu_only):
    with pytest.raises(ValueError, match="2 machines needs an explicit tcp://HOST:PORT"):
        launch(report_worker, 2, num_machines=2, dist_url="auto")


def environment_worker(folder: str) -> None:
    """Writes this worker's $FCOS_D2_LAUNCH_TEST, torch threads and parent process."""
    seen = {"rank": comm.get_rank(), "value": os.environ.get("FCOS_D2_LAUNCH_TEST"),
            "threads": torch.get_num_threads(), "parent": os.getppid()}
    (Path(folder) / f"{comm.get_rank()}.json").write_text(json.dumps(seen))


@contextlib.contextmanager
def another_thread():
    """This process runs a second thread meanwhile (as pytest-xdist's workers do)."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_one_fork_server_starts_the_workers_of_each_launch_with_its_environment(
        tmp_path, cpu_only, monkeypatch):
    """A process of several threads must not fork: its workers come from the fork server."""
    parents = set()
    for value, threads in [("first", 1), ("second", 2)]:
        monkeypatch.setenv("FCOS_D2_LAUNCH_TEST", value)
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        (tmp_path / value).mkdir()
        with another_thread():
            launch(environment_worker, 2, dist_url="auto", args=(str(tmp_path / value),))
        seen = reports(tmp_path / value)
        assert [(s["rank"], s["value"], s["threads"]) for s in seen] == [
            (0, value, threads), (1, value, threads)]  # this launch's, not the server's
        parents |= {s["parent"] for s in seen}
    assert len(parents) == 1 and os.getpid() not in parents  # one fork server for both


def test_a_process_of_one_thread_forks_its_workers_itself(tmp_path, cpu_only, scripts):
    """train_net.py launches before it computes: with one thread (OMP_NUM_THREADS=1 here)
    its workers are its own forks, and no fork server imports torch and detectron2 again."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[2])  # this folder: test_launch's worker
        from fcos_d2.engine.launch import launch
        from test_launch import environment_worker

        if __name__ == "__main__":
            print("threads", len(os.listdir("/proc/self/task")), "pid", os.getpid())
            launch(environment_worker, 2, dist_url="auto", args=(sys.argv[1],))
    """))
    (tmp_path / "seen").mkdir()
    done = scripts.run(str(script), str(tmp_path / "seen"), str(Path(__file__).parent),
                       env={"FCOS_D2_LAUNCH_TEST": "forked", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    pid = int(done.stdout.split("pid")[1].split()[0])
    assert "threads 1 " in done.stdout
    assert reports(tmp_path / "seen") == [{"rank": rank, "parent": pid, "value": "forked",
                                           "threads": 1} for rank in (0, 1)]


def test_a_started_worker_ends_on_a_preemption_signal_until_it_handles_it(monkeypatch):
    """A fork of the launching process inherits its handlers, which pass the preemption
    signals on to the workers: a worker resets them first, so that until main_func installs
    its own, SIGTERM ends it as it ends a spawned worker."""
    from fcos_d2.engine.preemption import forward_signals_to_children

    launch_module = importlib.import_module("fcos_d2.engine.launch")  # not the function

    seen = {}

    def joining(**kwargs):  # the first thing after the reset: stop there
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        raise RuntimeError("stop")

    monkeypatch.setattr(launch_module.dist, "init_process_group", joining)
    options = launch_module._WorkerOptions((signal.SIGTERM,), 0.0, "127.0.0.1")
    restore = forward_signals_to_children([signal.SIGTERM])
    try:
        with pytest.raises(RuntimeError, match="stop"):
            launch_module._cpu_worker(0, dict(os.environ), print, 2, 1, 0, "tcp://x:1", (),
                                      None, options)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        restore()
    assert seen["handler"] is signal.SIG_DFL


def report_main(args) -> None:
    """``report_worker`` as train_net's main: also the --local-rank its parser read."""
    report_worker(args.opts[0], local_rank=args.local_rank)


def test_under_torch_distributed_launch_each_process_joins_the_job_and_runs_main_once(
        tmp_path, cpu_only):
    """torch.distributed.launch, the official FCOS's entry point, is torchrun (its
    environment: the job's size, ranks, rendezvous) plus --local-rank=N in each process's
    argv. The job is train_net.py's but for main: its parser, launch_from_args, and
    --num-gpus 8, which torchrun's environment overrides."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import fcos_d2
        from fcos_d2.engine.launch import launch_from_args
        from fcos_d2.engine.trainer import argument_parser
        from test_launch import report_main

        if __name__ == "__main__":
            launch_from_args(report_main, argument_parser().parse_args())
    """))
    (tmp_path / "reports").mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.launch", "--standalone", "--nproc_per_node",
         "2", str(script), "--num-gpus", "8", str(tmp_path / "reports")],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(  # test_launch, imported by the job
            filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))})
    assert run.returncode == 0, run.stderr[-5000:]
    assert reports(tmp_path / "reports") == [  # each parsed the --local-rank it was given
        {**report, "parsed_local_rank": report["rank"]} for report in expected_reports(2)]


def test_local_rank_from_torch_distributed_launch_is_accepted_in_both_spellings(monkeypatch,
                                                                                capsys):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    parser = add_launcher_arguments(argparse.ArgumentParser())
    assert parser.parse_args(["--local_rank", "1"]).local_rank == 1
    assert os.environ["LOCAL_RANK"] == "1"  # torch < 1.9 set only the argument
    assert parser.parse_args(["--local-rank=1"]).local_rank == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["--local-rank=0"])
    assert "--local-rank 0 differs from the environment's LOCAL_RANK=1" in capsys.readouterr().err
