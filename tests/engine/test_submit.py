"""``python -m fcos_d2.submit``: the submitit launcher.

A job runs through submitit's LocalExecutor with 2 CPU workers (two tasks, as two GPUs of
one node would be), on the tiny model and data of test_training_faults.py: it gets
submitit's signal (USR2, what SLURM sends before the time limit) during training, is
requeued by submitit's checkpoint hook with --resume, finishes and evaluates. Beside it,
the same training uninterrupted on 2 CPU workers of train_net.py (a fork of the `scripts`
server: a second job's two tasks would each import torch and detectron2 anew) gives the
weights that the requeued job must end with. The SLURM side is checked without a cluster:
the sbatch file submitit would write for a 2-node, 8-GPU request, and the rendezvous of
its tasks.
"""
import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

submitit = pytest.importorskip("submitit", reason="submitit is in requirements.txt; "
                               "install it to test fcos_d2.submit")

from fcos_d2.engine.submit import (SubmitOptions, TrainingJob, check_training_argv,  # noqa: E402
                                   executor_parameters, rendezvous_environment, submit,
                                   submit_argument_parser, training_entry_point)
from test_training_faults import TINY, max_weight_difference  # noqa: E402
from training_processes import REPO  # noqa: E402

# 12 iterations; periodic checkpoints after iterations 1, 3, ... (so the signal below lands
# while many iterations are left).
ITERATIONS = ["SOLVER.MAX_ITER", "12", "MODEL.FCOS.INFERENCE_TH_TEST", "0.0"]


def training_argv(dataset: Path, output: Path, *flags: str):
    return ["--config-file", "configs/quickstart.yaml", "--register-coco", "tiny",
            str(dataset / "annotations.json"), str(dataset / "images"), "--stall-timeout", "0",
            *flags, *TINY, *ITERATIONS, "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR",
            str(output)]


def task_pids(controller: int):
    """The processes that submitit's local controller started (its tasks)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == controller:
            found.append(int(stat.parent.name))
    return found


def wait_for(path: Path, job, seconds: float = 900.0) -> None:
    """Waits for ``path``; a hang guard only (the jobs start slowly on a loaded machine)."""
    deadline = time.time() + seconds
    while not path.exists():
        assert job.state == "RUNNING", f"the job ended before {path.name} was written"
        assert time.time() < deadline, f"{path} not written within {seconds} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def jobs(dataset, tmp_path_factory, scripts):
    """The local job "requeued" (USR2 to its tasks once model_0000001.pth exists) and,
    beside it, the uninterrupted reference "whole" (--num-gpus 2, no evaluation)."""
    root = tmp_path_factory.mktemp("submit")
    previous = os.getcwd()
    os.chdir(REPO)  # the tasks import this checkout's fcos_d2 (python -m puts cwd first)
    environ = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    saved = {key: os.environ.get(key) for key in [*environ, "MASTER_PORT"]}
    os.environ.update(environ)
    os.environ.pop("MASTER_PORT", None)
    job, whole = None, None
    try:
        options = SubmitOptions(local=2, timeout=30, job_dir=str(root / "submitit"))
        job = submit(options, training_argv(dataset, root / "requeued"))
        whole = scripts.start(["--num-gpus", "2", *training_argv(dataset, root / "whole",
                                                                  "--skip-test")],
                              log=root / "whole.log")
        wait_for(root / "requeued" / "model_0000001.pth", job)
        for pid in task_pids(int(job.job_id)):  # as SLURM and submitit signal every task
            os.kill(pid, signal.SIGUSR2)
        job.results()  # raises with the failed task's traceback
        (status, _), whole = scripts.wait(whole, timeout=600), None  # waited for
        assert status == 0, (root / "whole.log").read_text()[-3000:]
    except BaseException:
        if job is not None:  # no job left running: its controller ends its tasks
            job.cancel(check=False)
        if whole is not None:
            scripts.wait(whole, timeout=0)  # kills it
        raise
    finally:
        os.chdir(previous)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    return SimpleNamespace(root=root, requeued=job)


def test_a_local_job_of_two_cpu_workers_trains_and_evaluates(jobs):
    out = jobs.root / "requeued"
    assert "World size: 2" in (out / "log.txt").read_text()
    assert (out / "log.txt.rank1").exists()  # the second task was a worker of the job
    assert (out / "model_final.pth").exists()
    summary = (out / "inference" / "tiny" / "summary.txt").read_text()
    assert summary.count("== tiny |") == 1
    logs = sorted(p.name for p in Path(jobs.requeued.paths.folder).glob("*_log.out"))
    assert len(logs) == 2  # submitit's log per task


def test_submitits_signal_requeues_the_job_which_resumes_exactly(jobs):
    out = jobs.root / "requeued"
    log = (out / "log.txt").read_text()
    stopped = re.search(r"stopped after iteration (\d+), checkpoint (\S+) \(verified\)", log)
    assert stopped, log[-3000:]
    iteration = int(stopped.group(1))
    assert Path(stopped.group(2)).name == f"model_{iteration:07d}.pth"
    assert 1 <= iteration < 11
    submitit_log = (Path(jobs.requeued.paths.folder) /
                    f"{jobs.requeued.job_id}_0_log.out").read_text()
    assert "Calling checkpoint method" in submitit_log  # TrainingJob.checkpoint
    assert "Requeued job" in submitit_log
    resumed = log[stopped.end():]
    assert f"Starting training from iteration {iteration + 1}" in resumed
    assert (out / "model_final.pth").exists()
    # the same 12 iterations as the uninterrupted training: the same weights
    assert max_weight_difference(out / "model_final.pth",
                                 jobs.root / "whole" / "model_final.pth") < 1e-6


def test_a_two_node_eight_gpu_request_becomes_this_sbatch_file(tmp_path):
    from submitit.slurm.slurm import _make_sbatch_string

    parsed, rest = submit_argument_parser().parse_known_args([
        "--nodes", "2", "--gpus-per-node", "8", "--partition", "gpu", "--timeout", "2880",
        "--comment", "fcos r50", "--config-file", "configs/FCOS-R50.yaml", "--resume",
        "SOLVER.IMS_PER_BATCH", "16"])
    assert rest == ["--config-file", "configs/FCOS-R50.yaml", "--resume",
                    "SOLVER.IMS_PER_BATCH", "16"]  # the training's, in order
    options = SubmitOptions(**{k: getattr(parsed, k) for k in SubmitOptions._fields})
    parameters = executor_parameters(options)
    assert parameters == {"job_name": "fcos-d2", "nodes": 2, "ntasks_per_node": 8,
                          "gpus_per_node": 8, "cpus_per_task": 8, "time": 2880,
                          "signal_delay_s": 120, "partition": "gpu", "comment": "fcos r50"}
    sbatch = _make_sbatch_string(command="python -u -m submitit.core._submit /jobs",
                                 folder=str(tmp_path), **parameters)
    for line in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=gpu",
                 "--time=2880", "--comment='fcos r50'", "--signal=USR2@120", "--cpus-per-task=8"):
        assert f"#SBATCH {line}" in sbatch, sbatch


def test_each_task_of_a_two_node_job_gets_its_rank_and_the_first_hosts_rendezvous():
    task = SimpleNamespace(num_tasks=16, num_nodes=2, global_rank=9, local_rank=1,
                           hostnames=["gpu01", "gpu02"], raw_job_id="4242", job_id="4242")
    assert rendezvous_environment(task, {}) == {
        "RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "gpu01", "MASTER_PORT": "19242"}  # the port: from the job id
    assert rendezvous_environment(task, {"MASTER_PORT": "29500"})["MASTER_PORT"] == "29500"
    uneven = SimpleNamespace(**{**vars(task), "num_tasks": 15})
    with pytest.raises(ValueError, match="15 tasks on 2 nodes"):
        rendezvous_environment(uneven, {})


def test_the_requeued_job_is_the_same_training_with_resume():
    job = TrainingJob(["--config-file", "c.yaml", "SOLVER.MAX_ITER", "9"], "/work")
    again = job.checkpoint().function
    assert (again.argv, again.cwd) == (["--resume", "--config-file", "c.yaml",
                                        "SOLVER.MAX_ITER", "9"], "/work")
    assert again.checkpoint().function.argv == again.argv  # --resume once


def test_flags_that_the_jobs_size_sets_are_refused_naming_them():
    with pytest.raises(SystemExit, match="--num-gpus is set by the job's size"):
        check_training_argv(["--config-file", "configs/quickstart.yaml", "--num-gpus", "4"])
    with pytest.raises(SystemExit, match="give the training's --config-file"):
        check_training_argv(["SOLVER.MAX_ITER", "2"])


def test_a_python_config_runs_the_lazyconfig_tool_and_a_yaml_one_train_net():
    lazy = ["--config-file", "configs/lazy/quickstart.py", "train.max_iter=2"]
    parser, main, _ = training_entry_point(lazy)
    assert main.__module__ == "lazyconfig_train_net"
    assert parser.parse_args(lazy).opts == ["train.max_iter=2"]
    parser, main, _ = training_entry_point(["--config-file=configs/quickstart.yaml"])
    assert main.__module__ == "fcos_d2.engine.trainer"
