"""train_net.py under faults: killed and resumed, a NaN loss, two machines, a dead worker.

Trainings are forks of one server process (tests/training_processes.py) that imported
train_net.py once; each runs train_net.py's command line as ``__main__``. The model is
the quickstart's made tiny (ResNet-18, FPN width 64, one tower conv), trained from a
fixed seed on 4 synthetic 128x128 images, 2 a batch, with random flips, on the CPU
(exactness on a GPU would also need deterministic kernels).
"""
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch


# 6 iterations; checkpoints after iterations 1, 3 and 5 (model_final).
TINY = ["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1", "SEED", "7",
        "SOLVER.IMS_PER_BATCH", "2", "SOLVER.WARMUP_ITERS", "2", "SOLVER.MAX_ITER", "6",
        "SOLVER.CHECKPOINT_PERIOD", "2", "TEST.EVAL_PERIOD", "0",
        "DATASETS.TRAIN", "('tiny',)", "DATASETS.TEST", "('tiny',)"]
# the small-data recipe's loss normalizer: a moving average, a state of its own to resume
EMA_NORMALIZER = ["MODEL.FCOS.LOSS_NORMALIZER", "ema", "MODEL.FCOS.LOSS_NORMALIZER_EMA_MOMENTUM",
                  "0.99"]


@pytest.fixture(scope="module")
def server(scripts):
    yield scripts
    scripts.stop_running()


def argv(dataset: Path, output: Path, *opts: str, flags=("--skip-test",)):
    return ["--config-file", "configs/quickstart.yaml", "--register-coco", "tiny",
            str(dataset / "annotations.json"), str(dataset / "images"), *flags, *TINY, *opts,
            "OUTPUT_DIR", str(output)]


def log_of(output: Path) -> str:
    return "".join(p.read_text() for p in sorted(output.parent.glob(output.name + "*.log")))


def finished(server, pid: int, output: Path) -> None:
    status, _ = server.wait(pid)
    assert status == 0, log_of(output)[-5000:]


def images_seen(record: Path):
    """{iteration: image ids}; a later record of an iteration (after resume) wins."""
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return {r["iteration"]: r["image_ids"] for r in lines}


def max_weight_difference(a: Path, b: Path) -> float:
    first = torch.load(a, weights_only=True)["model"]
    second = torch.load(b, weights_only=True)["model"]
    assert first.keys() == second.keys()
    return max((first[k].double() - second[k].double()).abs().max().item() for k in first)


@pytest.fixture(scope="module")
def runs(server, dataset, tmp_path_factory):
    """Three trainings at once, with the EMA loss normalizer: uninterrupted (NUM_WORKERS
    0); killed by SIGKILL when iteration 3 starts (NUM_WORKERS 1); a NaN loss at iteration
    4 (NUM_WORKERS 0). Then the last two resumed with --resume, without the fault."""
    root = tmp_path_factory.mktemp("faults")
    out = {name: root / name for name in ("whole", "killed", "nan")}
    workers = {"whole": "0", "killed": "1", "nan": "0"}
    faults = {"whole": {}, "killed": {"kill_at": 3}, "nan": {"nan_at": 4}}
    pids = {name: server.start(argv(dataset, out[name], *EMA_NORMALIZER, "DATALOADER.NUM_WORKERS",
                                    workers[name]),
                               log=root / f"{name}.log", record=root / f"{name}.jsonl",
                               **faults[name]) for name in out}
    status = {name: server.wait(pid)[0] for name, pid in pids.items()}
    assert status["whole"] == 0, log_of(out["whole"])[-5000:]
    first_logs = {name: log_of(out[name]) for name in out}
    after_nan = {"files": sorted(p.name for p in out["nan"].glob("model_*.pth")),
                 "last": (out["nan"] / "last_checkpoint").read_text().strip()}
    resumed = {name: server.start(argv(dataset, out[name], *EMA_NORMALIZER,
                                       "DATALOADER.NUM_WORKERS", workers[name],
                                       flags=["--skip-test", "--resume"]),
                                  log=root / f"{name}.resumed.log", record=root / f"{name}.jsonl")
               for name in ("killed", "nan")}
    for name, pid in resumed.items():
        finished(server, pid, out[name])
    return {"out": out, "status": status, "first_logs": first_logs, "root": root,
            "after_nan": after_nan}


def test_a_run_killed_by_sigkill_and_resumed_ends_as_an_uninterrupted_run(runs):
    out, root = runs["out"], runs["root"]
    assert runs["status"]["killed"] == -signal.SIGKILL
    assert (out["killed"] / "last_checkpoint").exists()
    assert "Starting training from iteration 2" in log_of(out["killed"])  # after model_0000001
    assert images_seen(root / "killed.jsonl") == images_seen(root / "whole.jsonl")
    assert len(images_seen(root / "whole.jsonl")) == 6
    difference = max_weight_difference(out["whole"] / "model_final.pth",
                                       out["killed"] / "model_final.pth")
    assert difference <= 1e-6, difference


def test_a_nan_loss_stops_training_naming_the_iteration_and_each_loss(runs):
    assert runs["status"]["nan"] != 0
    log = runs["first_logs"]["nan"]
    assert "FloatingPointError: training stopped at iteration 4: the loss is not finite (" in log
    message = log[log.index("FloatingPointError: training stopped"):].splitlines()[0]
    assert "loss_fcos_cls=nan" in message
    assert "loss_fcos_loc=" in message and "loss_fcos_ctr=" in message
    assert "the last checkpoint, " in message and "model_0000003.pth, is intact" in message


def test_after_a_nan_loss_the_last_good_checkpoint_resumes_as_if_nothing_happened(runs):
    out, root = runs["out"], runs["root"]
    # The failed run wrote nothing after its checkpoint of iteration 3 ...
    assert runs["after_nan"] == {"files": ["model_0000001.pth", "model_0000003.pth"],
                                 "last": "model_0000003.pth"}
    assert "Starting training from iteration 4" in log_of(out["nan"])
    # ... and the resumed run (no NaN this time) ends where the uninterrupted one does.
    assert images_seen(root / "nan.jsonl") == images_seen(root / "whole.jsonl")
    difference = max_weight_difference(out["whole"] / "model_final.pth",
                                       out["nan"] / "model_final.pth")
    assert difference <= 1e-6, difference


def test_checkpoints_hold_the_optimizer_and_each_workers_data_stream(runs):
    checkpoint = torch.load(runs["out"]["whole"] / "model_0000003.pth", weights_only=True)
    assert checkpoint["iteration"] == 3
    assert checkpoint["trainer"]["_trainer"]["optimizer"]["state"]  # momentum buffers
    workers = checkpoint["trainer"]["hooks"]["ExactResume"]["workers"]
    assert [w["data"]["position"] for w in workers] == [8]  # 4 iterations x 2 images


def machine_argv(dataset, output, rank, port, *opts):
    return argv(dataset, output, "DATALOADER.NUM_WORKERS", "0", *opts, flags=[
        "--num-gpus", "1", "--num-machines", "2", "--machine-rank", str(rank),
        "--dist-url", f"tcp://127.0.0.1:{port}", "--dist-timeout", "120"])


def free_port() -> int:
    from fcos_d2.engine.launch import _free_port

    return _free_port()


def test_two_machines_of_one_worker_each_train_and_evaluate_together(server, dataset, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the machines run CPU workers only where CUDA is not available")
    port, out = free_port(), tmp_path / "out"
    pids = [server.start(machine_argv(dataset, out, rank, port, "SOLVER.MAX_ITER", "2",
                                      "MODEL.FCOS.INFERENCE_TH_TEST", "0.0"),
                         log=tmp_path / f"out.machine{rank}.log") for rank in (0, 1)]
    for pid in pids:
        finished(server, pid, out)
    log = (tmp_path / "out.machine0.log").read_text()
    assert "Rank of current process: 0. World size: 2" in log
    assert "Rank of current process: 1. World size: 2" in (out / "log.txt.rank1").read_text()
    summary = (out / "inference" / "tiny" / "summary.txt").read_text()
    assert summary.count("== tiny |") == 1  # evaluated by both, written once, by rank 0


def test_when_one_machine_dies_the_other_stops_within_seconds_saying_so(server, dataset,
                                                                        tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the machines run CPU workers only where CUDA is not available")
    port, out = free_port(), tmp_path / "out"
    logs = [tmp_path / f"out.machine{rank}.log" for rank in (0, 1)]
    pids = [server.start(machine_argv(dataset, out, rank, port, "SOLVER.MAX_ITER", "100000",
                                      "SOLVER.CHECKPOINT_PERIOD", "100000"),
                         log=logs[rank]) for rank in (0, 1)]
    deadline = time.time() + 120
    while not (logs[0].exists() and "Starting training" in logs[0].read_text()):
        assert time.time() < deadline, "the two machines did not start training"
        time.sleep(0.2)
    time.sleep(1)  # a few iterations together (rank 0 logs only what both do)
    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.time()
    status, ended_at = server.wait(pids[0], timeout=120)
    server.wait(pids[1])
    assert status != 0
    assert ended_at - killed_at < 30
    assert "WorkerLostError: worker 0 of 2 lost contact with another worker" in logs[0].read_text()


def test_a_nan_loss_on_one_machine_stops_both_at_that_iteration_naming_the_worker(
        server, dataset, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the machines run CPU workers only where CUDA is not available")
    port, out = free_port(), tmp_path / "out"
    logs = [tmp_path / f"out.machine{rank}.log" for rank in (0, 1)]
    pids = [server.start(machine_argv(dataset, out, rank, port), log=logs[rank],
                         nan_at=1 if rank == 1 else None) for rank in (0, 1)]
    assert [server.wait(pid)[0] for pid in pids] == [1, 1]
    for log in logs:
        assert ("FloatingPointError: training stopped at iteration 1: the loss is not finite "
                "(worker 1: loss_fcos_cls=nan, ") in log.read_text()
    assert "no checkpoint had been written yet" in logs[0].read_text()
    assert not (out / "last_checkpoint").exists()  # the first one was due after iteration 1


HANGING_WORKER = """
import sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from fcos_d2.engine.launch import launch

def main():
    if dist.get_rank() == 1:
        time.sleep(600)  # alive, but never joins the collective below
    dist.all_reduce(torch.ones(1))

launch(main, 1, num_machines=2, machine_rank=int(sys.argv[1]), dist_url=sys.argv[2],
       timeout=timedelta(seconds=3))
"""


def test_a_worker_that_hangs_is_reported_after_the_collective_timeout(server, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANGING_WORKER)
    url = f"tcp://127.0.0.1:{free_port()}"
    logs = [tmp_path / f"machine{rank}.log" for rank in (0, 1)]
    started = time.time()
    pids = [server.start([str(rank), url], log=logs[rank], script=script) for rank in (0, 1)]
    status, ended_at = server.wait(pids[0], timeout=60)
    server.wait(pids[1], timeout=0)  # kills it
    assert status != 0
    assert ended_at - started < 30  # 3 s of timeout, and the start
    assert "WorkerLostError: worker 0 of 2 lost contact with another worker" in logs[0].read_text()
