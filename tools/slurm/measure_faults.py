#!/usr/bin/env python
"""Measures the cluster fault handling of train_net.py on this machine's CPUs:

1. preemption: SIGTERM to a training of ``configs/quickstart.yaml`` (one worker in the
   launching process; then two workers spawned by it, the signal going to the parent only)
   -> seconds until the checkpoint file is complete, and until the process exits (75);
2. a stalled worker: SIGSTOP on one of two spawned workers -> seconds until the job
   exits (76), with ``--stall-timeout`` STALL;
3. the cost of agreeing on a stop every iteration: one all-reduce of one number over gloo
   between two CPU workers, against the time of an iteration.

    python tools/slurm/measure_faults.py [--stall-timeout 10] [--small]

``--small``: the quickstart model made tiny (FPN width 64, one tower conv, 2 images a
batch), for a loaded machine.
"""
import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


SMALL = []  # config overrides, from --small


def start(output: str, workers: int, *flags: str) -> subprocess.Popen:
    log = open(os.path.join(output, "console.log"), "w")
    return subprocess.Popen(
        [sys.executable, "train_net.py", "--config-file", "configs/quickstart.yaml",
         "--num-gpus", str(workers), "--skip-test", *flags, "SOLVER.MAX_ITER", "100000",
         "SOLVER.CHECKPOINT_PERIOD", "100000", "TEST.EVAL_PERIOD", "0", *SMALL,
         "OUTPUT_DIR", output],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})


def wait_for_iteration(output: str, iteration: int = 19) -> float:
    """Waits until detectron2 logs ``iter: <iteration>``; returns the last 'time:' value."""
    while True:
        text = Path(output, "console.log").read_text()
        found = re.findall(rf"iter: {iteration} .*? time: ([0-9.]+)", text)
        if found:
            return float(found[-1])
        time.sleep(0.2)


def preemption(workers: int) -> None:
    with tempfile.TemporaryDirectory() as output:
        process = start(output, workers)
        seconds_per_iteration = wait_for_iteration(output)
        signalled = time.time()
        process.send_signal(signal.SIGTERM)
        status = process.wait()
        exited = time.time()
        files = glob.glob(os.path.join(output, "model_*.pth"))
        written = max(os.stat(f).st_mtime for f in files) if files else float("nan")
        print(f"SIGTERM, {workers} worker(s), {seconds_per_iteration:.3f} s/iteration: "
              f"checkpoint complete after {written - signalled:.2f} s, exit status {status} "
              f"after {exited - signalled:.2f} s ({[os.path.basename(f) for f in files]})")


def children(pid: int) -> list:
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return sorted(found)


def stall(stall_timeout: float) -> None:
    with tempfile.TemporaryDirectory() as output:
        process = start(output, 2, "--stall-timeout", str(stall_timeout))
        wait_for_iteration(output)
        workers = [pid for pid in children(process.pid)
                   if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        os.kill(workers[-1], signal.SIGSTOP)
        stopped = time.time()
        status = process.wait()
        ended = time.time()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        verdict = [line for line in Path(output, "console.log").read_text().splitlines()
                   if "stalled (" in line][:1]
        print(f"SIGSTOP on one of 2 workers, --stall-timeout {stall_timeout:g}: the job exited "
              f"(status {status}) {ended - stopped:.2f} s later. {verdict}")


def _all_reduce_worker(repetitions: int) -> None:
    import torch
    import torch.distributed as dist
    from detectron2.utils import comm

    group = dist.new_group(backend="gloo")
    flag = torch.zeros(1)
    for _ in range(50):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    started = time.perf_counter()
    for _ in range(repetitions):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if comm.is_main_process():
        seconds = (time.perf_counter() - started) / repetitions
        print(f"one all-reduce of the stop flag (gloo, 2 CPU workers): {seconds * 1e6:.0f} us")


def all_reduce_cost(repetitions: int = 2000) -> None:
    from fcos_d2.engine.launch import launch

    launch(_all_reduce_worker, 2, dist_url="auto", args=(repetitions,), stall_timeout=0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stall-timeout", type=float, default=10.0)
    parser.add_argument("--small", action="store_true")
    options = parser.parse_args()
    if options.small:
        SMALL += ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1",
                  "SOLVER.IMS_PER_BATCH", "2"]
    all_reduce_cost()
    preemption(workers=1)
    preemption(workers=2)
    stall(options.stall_timeout)
