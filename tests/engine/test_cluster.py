"""Running where COCO is trained: SLURM's environment, preemption, stalled workers, full
disks.

Trainings are forks of one server process (tests/training_processes.py), with the tiny
model and data of test_training_faults.py; two "machines" are two processes on this
one, each given the environment srun would give it.
"""
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from fcos_d2.checkpoint import FCOSCheckpointer
from fcos_d2.checkpoint.disk_space import CheckpointWriteError, low_space_warning
from fcos_d2.engine.heartbeat import STALLED_EXIT_CODE, Heartbeat
from fcos_d2.engine.preemption import PREEMPTED_EXIT_CODE, parse_signals
from fcos_d2.engine.slurm import (SlurmError, apply_slurm_environment, expand_nodelist,
                                  slurm_launch_settings)
from fcos_d2.engine.trainer import argument_parser
from test_training_faults import argv, free_port, log_of, max_weight_difference


@pytest.fixture(scope="module")
def server(scripts):
    yield scripts
    scripts.stop_running()


# -- SLURM's environment ------------------------------------------------------------------
def srun_environment(node: int, port: int = 29500, **extra: str):
    """What srun gives the task on node ``node`` of a 2-node step, one task per node."""
    return {"SLURM_JOB_ID": "4242", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_NODEID": str(node), "SLURM_PROCID": str(node),
            "SLURM_STEP_NODELIST": "127.0.0.[1-2]", "MASTER_PORT": str(port), **extra}


def test_node_lists_in_slurms_compressed_syntax_expand_in_order():
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07",
                                                        "login1"]
    assert expand_nodelist("r[1-2]-n[9-10]") == ["r1-n9", "r1-n10", "r2-n9", "r2-n10"]
    assert expand_nodelist("n[08-10]") == ["n08", "n09", "n10"]  # the low end's padding
    assert expand_nodelist("node7") == ["node7"]
    with pytest.raises(SlurmError, match=r"unbalanced brackets in 'gpu\[01-03'"):
        expand_nodelist("gpu[01-03")
    with pytest.raises(SlurmError, match="cannot read the range '3-1'"):
        expand_nodelist("gpu[3-1]")


def test_under_srun_the_launch_comes_from_slurms_environment():
    environ = srun_environment(1, SLURM_GPUS_ON_NODE="8")
    assert slurm_launch_settings(environ) == {
        "num_machines": 2, "machine_rank": 1, "num_gpus": 8, "dist_url": "tcp://127.0.0.1:29500"}
    del environ["MASTER_PORT"]  # the same port on every node of the job: from its id
    assert slurm_launch_settings(environ)["dist_url"] == "tcp://127.0.0.1:19242"
    assert slurm_launch_settings({"SLURM_JOB_ID": "1", "SLURM_NNODES": "2"}) is None  # sbatch


def test_flags_win_over_slurm_and_a_disagreement_names_both_values():
    parser = argument_parser()
    environ = srun_environment(1, SLURM_GPUS_ON_NODE="8")
    args = apply_slurm_environment(parser, ["--config-file", "x.yaml"], environ)
    assert (args.num_machines, args.machine_rank, args.num_gpus) == (2, 1, 8)
    args = apply_slurm_environment(parser, ["--num-gpus", "8", "--dist-url", "tcp://h:1"],
                                   environ)
    assert (args.num_gpus, args.dist_url, args.machine_rank) == (8, "tcp://h:1", 1)
    with pytest.raises(SlurmError, match=r"--num-machines 4 disagrees with SLURM's "
                                         r"environment \(SLURM_STEP_NUM_NODES=2 says 2\)"):
        apply_slurm_environment(parser, ["--num-machines", "4"], environ)
    assert apply_slurm_environment(parser, ["--num-gpus", "3"], {}).num_gpus == 3  # no srun


def test_several_tasks_per_node_are_refused_saying_how_to_start_the_job():
    with pytest.raises(SlurmError, match="expects one task per node.*--ntasks-per-node=1"):
        slurm_launch_settings(srun_environment(0, SLURM_STEP_NUM_TASKS="16"))


def slurm_argv(dataset, output, *opts, flags=()):
    return argv(dataset, output, "DATALOADER.NUM_WORKERS", "0", *opts,
                flags=["--dist-timeout", "300", *flags])


def start_two_nodes(server, dataset, out: Path, tag: str, *opts, flags=(), faults=None,
                    port=None):
    """Starts the two srun tasks of a 2-node step; returns (pids, logs)."""
    port = port or free_port()
    logs = [out.parent / f"{out.name}.{tag}.node{n}.log" for n in (0, 1)]
    pids = [server.start(slurm_argv(dataset, out, *opts, flags=flags), log=logs[n],
                         env=srun_environment(n, port), **(faults or {}).get(n, {}))
            for n in (0, 1)]
    return pids, logs


def statuses(server, pids):
    return [server.wait(pid)[0] for pid in pids]


def temporary_files(folder: Path):
    return sorted(p.name for p in folder.glob(".*.tmp-*"))


@pytest.fixture(scope="module")
def two_nodes(server, dataset, tmp_path_factory):
    """On two srun "nodes" (4 iterations, a checkpoint after iteration 1 and 3):
    uninterrupted, with a final evaluation and node 1 busy for 6 s at iteration 1 (3x the
    --stall-timeout); then node 1 alone gets SIGTERM when iteration 2 starts; then that
    run resumed."""
    root = tmp_path_factory.mktemp("two_nodes")
    out = {name: root / name for name in ("whole", "preempted")}
    common = ("SOLVER.MAX_ITER", "4", "MODEL.FCOS.INFERENCE_TH_TEST", "0.0")
    stall = ("--stall-timeout", "2")
    whole = start_two_nodes(server, dataset, out["whole"], "first", *common,
                            flags=stall, faults={1: {"busy": {1: 6}}})
    preempted = start_two_nodes(server, dataset, out["preempted"], "first", *common,
                                flags=("--skip-test", *stall),
                                faults={1: {"signals": {2: "SIGTERM"}}})
    result = {"whole": statuses(server, whole[0]), "preempted": statuses(server, preempted[0]),
              "logs": [log.read_text() for log in whole[1] + preempted[1]],
              "rank1_logs": [(out[name] / "log.txt.rank1").read_text() for name in out],
              "files": sorted(p.name for p in out["preempted"].glob("model_*.pth"))}
    resumed = start_two_nodes(server, dataset, out["preempted"], "resumed", *common,
                              flags=("--skip-test", "--resume", *stall))
    result["resumed"] = statuses(server, resumed[0])
    return {"out": out, **result}


def test_two_srun_nodes_train_and_evaluate_with_the_launch_read_from_slurm(two_nodes):
    assert two_nodes["whole"] == [0, 0], log_of(two_nodes["out"]["whole"])[-4000:]
    whole_node0 = two_nodes["logs"][0]
    assert "num_machines=2" in whole_node0 and "dist_url='tcp://127.0.0.1:" in whole_node0
    assert "Rank of current process: 0. World size: 2" in whole_node0
    rank1 = (two_nodes["out"]["whole"] / "log.txt.rank1").read_text()
    assert "Rank of current process: 1. World size: 2" in rank1
    summary = (two_nodes["out"]["whole"] / "inference" / "tiny" / "summary.txt").read_text()
    assert summary.count("== tiny |") == 1


def test_a_busy_worker_does_not_trip_the_stall_detection(two_nodes):
    assert two_nodes["whole"] == [0, 0]
    logs = two_nodes["logs"][:2] + two_nodes["rank1_logs"][:1]
    assert not any("stalled (" in log for log in logs)


def test_sigterm_to_one_node_stops_both_after_that_iteration_with_a_checkpoint(two_nodes):
    assert two_nodes["preempted"] == [PREEMPTED_EXIT_CODE] * 2, two_nodes["logs"][2][-4000:]
    assert two_nodes["files"] == ["model_0000001.pth", "model_0000002.pth"]
    out = two_nodes["out"]["preempted"]
    node0, node1 = two_nodes["logs"][2], two_nodes["rank1_logs"][1]
    assert "SIGTERM received: finishing this iteration" in node1
    assert "Preempted (signal to another worker): stopped after iteration 2" in node0
    assert "Preempted (SIGTERM): stopped after iteration 2" in node1
    checkpoint = torch.load(out / "model_0000002.pth", weights_only=True)
    assert checkpoint["iteration"] == 2
    workers = checkpoint["trainer"]["hooks"]["ExactResume"]["workers"]
    assert [w["data"]["position"] for w in workers] == [3, 3]  # 3 iterations x 1 image


def test_two_nodes_resumed_after_preemption_end_as_an_uninterrupted_run(two_nodes):
    out = two_nodes["out"]
    assert two_nodes["resumed"] == [0, 0], log_of(out["preempted"])[-4000:]
    assert "Starting training from iteration 3" in log_of(out["preempted"])
    difference = max_weight_difference(out["whole"] / "model_final.pth",
                                       out["preempted"] / "model_final.pth")
    assert difference <= 1e-6, difference


def test_one_worker_saves_on_sigterm_ignores_a_second_one_and_resumes_exactly(
        server, dataset, tmp_path):
    """6 iterations, checkpoints after 1, 3 and 5; SIGTERM when iteration 0 starts (no
    checkpoint yet), and again while its checkpoint is written."""
    out = {name: tmp_path / name for name in ("whole", "preempted")}
    one = ("DATALOADER.NUM_WORKERS", "0")
    whole = server.start(argv(dataset, out["whole"], *one), log=tmp_path / "whole.log")
    pid = server.start(argv(dataset, out["preempted"], *one), log=tmp_path / "preempted.log",
                       signals={0: "SIGTERM"}, signal_during_save={"model_0000000": "SIGTERM"})
    assert server.wait(whole)[0] == 0
    status, _ = server.wait(pid)
    log = (tmp_path / "preempted.log").read_text()
    assert status == PREEMPTED_EXIT_CODE, log[-4000:]
    assert "SIGTERM received again: ignored, the checkpoint is being written" in log
    assert (out["preempted"] / "last_checkpoint").read_text() == "model_0000000.pth"
    assert temporary_files(out["preempted"]) == []
    resumed = server.start(argv(dataset, out["preempted"], *one, flags=["--skip-test",
                                                                       "--resume"]),
                           log=tmp_path / "resumed.log")
    assert server.wait(resumed)[0] == 0, (tmp_path / "resumed.log").read_text()[-4000:]
    difference = max_weight_difference(out["whole"] / "model_final.pth",
                                       out["preempted"] / "model_final.pth")
    assert difference <= 1e-6, difference


def test_preemption_signals_are_named_and_uncatchable_ones_refused():
    assert parse_signals(["SIGTERM", "usr1"]) == [signal.SIGTERM, signal.SIGUSR1]
    with pytest.raises(ValueError, match="'SIGKILL' is not a signal that can be caught"):
        parse_signals(["SIGKILL"])


# -- stalled workers ----------------------------------------------------------------------
def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_stopped_worker_ends_the_job_within_the_stall_timeout_naming_it(server, dataset,
                                                                         tmp_path):
    out = tmp_path / "out"
    pids, logs = start_two_nodes(server, dataset, out, "stall", "SOLVER.MAX_ITER", "100000",
                                 "SOLVER.CHECKPOINT_PERIOD", "100000",
                                 flags=("--skip-test", "--stall-timeout", "3"),
                                 faults={1: {"busy": {2: 0.5}, "signals": {2: "SIGSTOP"}}})
    deadline = time.time() + 120
    while process_state(pids[1]) != "T":
        assert time.time() < deadline, logs[1].read_text()[-3000:]
        time.sleep(0.05)
    stopped_at = time.time()
    status, ended_at = server.wait(pids[0], timeout=120)
    server.wait(pids[1], timeout=0)  # kills the stopped one
    log = logs[0].read_text()
    assert status == STALLED_EXIT_CODE, log[-4000:]
    assert "worker 1 of 2 stalled (host " in log
    assert "its last reported iteration: 2 (training)" in log
    assert ended_at - stopped_at < 60  # 3 s of --stall-timeout; --dist-timeout is 300 s
    print(f"the job ended {ended_at - stopped_at:.1f} s after worker 1 stopped")


def heartbeats(timeout: float, start=(0, 1)):
    """Rank 0 and rank 1 of a 2-worker heartbeat over localhost; each records verdicts."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    verdicts = {0: [], 1: []}
    beats = [Heartbeat(rank=rank, world_size=2, sock=sockets[rank], timeout=timeout,
                       rank0=None if rank == 0 else sockets[0].getsockname(),
                       on_stall=verdicts[rank].append) for rank in (0, 1)]
    for rank in start:
        beats[rank].start()
    return beats, verdicts


def test_heartbeats_continue_while_the_main_thread_is_busy():
    beats, verdicts = heartbeats(timeout=0.3)
    started = time.time()
    while time.time() - started < 1.5:  # 5x the timeout, holding the GIL as Python does
        pass
    for beat in beats:
        beat.stop()
    assert verdicts == {0: [], 1: []}


def freeze(heartbeat: Heartbeat) -> None:
    """Stops a heartbeat's thread without its "done": as SIGSTOP would."""
    heartbeat._stop.set()


def test_a_frozen_worker_is_named_by_rank_0_and_a_frozen_rank_0_by_the_others():
    beats, verdicts = heartbeats(timeout=0.3)
    time.sleep(0.3)
    freeze(beats[1])
    time.sleep(1.2)
    assert len(verdicts[0]) == 1 and verdicts[1] == []
    assert verdicts[0][0].startswith(f"worker 1 of 2 stalled (host {socket.gethostname()}, "
                                     f"pid {os.getpid()}): no heartbeat for 0.3 s")
    beats, verdicts = heartbeats(timeout=0.3)
    time.sleep(0.3)
    freeze(beats[0])
    time.sleep(1.2)
    assert verdicts[0] == [] and len(verdicts[1]) == 1
    assert verdicts[1][0].startswith("worker 0 of 2 stalled")


def test_a_worker_never_heard_from_is_not_judged_but_warned_about(caplog):
    beats, verdicts = heartbeats(timeout=0.3, start=(0,))  # rank 1 never beats: UDP blocked?
    time.sleep(1.0)
    beats[0].stop()
    assert verdicts == {0: [], 1: []}
    assert "no heartbeat at all from worker(s) [1] in 0.3 s" in caplog.text


# -- full disks ---------------------------------------------------------------------------
def small_checkpointer(folder: Path) -> FCOSCheckpointer:
    return FCOSCheckpointer(torch.nn.Linear(200, 200), str(folder))  # 160 KiB of weights


def test_a_checkpoint_write_failing_with_enospc_is_one_clear_error(tmp_path, monkeypatch):
    checkpointer = small_checkpointer(tmp_path)
    checkpointer.save("model_0000001", iteration=1)
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)  # a partly written file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError) as caught:
        checkpointer.save("model_0000003", iteration=3)
    monkeypatch.setattr(torch, "save", real_save)
    message = str(caught.value)
    assert message.startswith(f"could not write the checkpoint {tmp_path}/model_0000003.pth: "
                              "No space left on device (errno 28). ")
    assert " free; this checkpoint needs about 157.0 KiB." in message
    assert (f"The last complete checkpoint, {tmp_path}/model_0000001.pth, is still there"
            in message and "--resume" in message)
    assert caught.value.__suppress_context__  # one error, not torch's after the OSError
    assert temporary_files(tmp_path) == []
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000001.pth"


def test_on_a_full_tmpfs_the_save_fails_clearly_and_leaves_no_temporary_file(tmp_path):
    folder = tmp_path / "small"
    folder.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip() or mount.returncode}")
    try:
        checkpointer = small_checkpointer(folder)
        checkpointer.save("model_0000001", iteration=1)  # 160 KiB fit, a second does not
        with pytest.raises(CheckpointWriteError, match=r"model_0000002.pth: No space left on "
                           r"device \(errno 28\)\. .* has .* free; .*The last complete "
                           r"checkpoint, .*model_0000001.pth, is still there"):
            checkpointer.save("model_0000002", iteration=2)
        assert temporary_files(folder) == []
        assert torch.load(folder / "model_0000001.pth", weights_only=True)["iteration"] == 1
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_before_training_a_folder_short_of_space_for_three_checkpoints_is_warned(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert low_space_warning(str(tmp_path), checkpoint_bytes=free // 10) == ""
    warning = low_space_warning(str(tmp_path), checkpoint_bytes=free // 2)
    assert warning.startswith(f"{tmp_path} has ") and "less than 3 checkpoints of" in warning


def test_the_trainer_hook_warns_with_the_models_checkpoint_size(tmp_path, caplog):
    from types import SimpleNamespace

    from fcos_d2.engine.hooks import WarnOnLowDiskSpace

    huge = torch.nn.Linear(2 ** 20, 2 ** 20, bias=False, device="meta")  # 4 TiB, no memory
    hook = WarnOnLowDiskSpace(SimpleNamespace(save_dir=str(tmp_path), model=huge))
    hook.before_train()
    assert "less than 3 checkpoints of about 8192.0 GiB each" in caplog.text
