"""A finished run proves it saved (issue 53): model_final.pth is verified at the end, a
run resumed between the last two saves still writes it, and the preemption checkpoint is
verified before status 75. Also the test pause of the atomic save (FCOS_D2_TEST_PAUSE_IN_SAVE).
"""
import importlib.util
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from detectron2.config import get_cfg
from torch import nn

from fcos_d2 import add_fcos_config, get_config_file
from fcos_d2.checkpoint import FCOSCheckpointer, atomic
from fcos_d2.engine import preemption
from fcos_d2.engine.final_checkpoint import (ProveFinalCheckpoint, UnverifiedCheckpointError,
                                             checkpoint_problem)
from fcos_d2.engine.trainer import Trainer
from tiny_training import REPO, register_two_images


def saver(folder: Path) -> FCOSCheckpointer:
    torch.manual_seed(0)
    return FCOSCheckpointer(nn.Linear(2, 1), str(folder), save_to_disk=True)


# -- checkpoint_problem ----------------------------------------------------------------
def test_a_checkpoint_of_the_right_iteration_has_no_problem_and_each_fault_is_named(tmp_path):
    checkpointer = saver(tmp_path)
    checkpointer.save("model_final", iteration=5)
    path = str(tmp_path / "model_final.pth")
    assert checkpoint_problem(path, 5) is None
    assert checkpoint_problem(path, 6) == f"{path} holds iteration 5, not the last one, 6"
    missing = str(tmp_path / "model_0000001.pth")
    assert checkpoint_problem(missing, 1) == f"{missing} does not exist"
    torch.save({"iteration": 5}, tmp_path / "no_model.pth")
    assert checkpoint_problem(str(tmp_path / "no_model.pth"), 5).endswith("holds no model weights")
    os.truncate(path, 100)
    assert checkpoint_problem(path, 5).startswith(f"{path} does not load (")


# -- the library trainer ---------------------------------------------------------------
def tiny_trainer(folder: Path, name: str, resume: bool = False) -> Trainer:
    """Four iterations of a tiny quickstart model; checkpoints after 1 and 3 (and final)."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", 32,
                         "MODEL.FCOS.NUM_CONVS", 1, "SOLVER.AMP.ENABLED", False,
                         "SOLVER.IMS_PER_BATCH", 2, "SOLVER.MAX_ITER", 4,
                         "SOLVER.CHECKPOINT_PERIOD", 2, "DATALOADER.NUM_WORKERS", 0,
                         "DATASETS.TRAIN", (name,), "DATASETS.TEST", (),
                         "OUTPUT_DIR", str(folder / "output"), "SEED", 3])
    trainer = Trainer(cfg, skip_final_eval=True)
    trainer.resume_or_load(resume=resume)
    return trainer


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("final_checkpoint_data")
    register_two_images(folder, "final_checkpoint_tiny")
    return "final_checkpoint_tiny"


def test_a_run_whose_final_save_vanishes_ends_with_an_error_naming_file_and_folder(
        tmp_path, data, monkeypatch):
    save = FCOSCheckpointer.save
    monkeypatch.setattr(FCOSCheckpointer, "save", lambda self, name, **kwargs: None
                        if name == "model_final" else save(self, name, **kwargs))
    with pytest.raises(UnverifiedCheckpointError) as error:
        tiny_trainer(tmp_path, data).train()
    output = tmp_path / "output"
    assert f"{output / 'model_final.pth'} does not exist" in str(error.value)
    assert f"Output folder: {output}." in str(error.value)


def test_a_run_whose_final_save_is_truncated_ends_with_an_error_naming_file_and_folder(
        tmp_path, data, monkeypatch):
    save = FCOSCheckpointer.save

    def truncated_final(self, name, **kwargs):
        save(self, name, **kwargs)
        if name == "model_final":
            os.truncate(os.path.join(self.save_dir, "model_final.pth"), 1000)

    monkeypatch.setattr(FCOSCheckpointer, "save", truncated_final)
    with pytest.raises(UnverifiedCheckpointError) as error:
        tiny_trainer(tmp_path, data).train()
    output = tmp_path / "output"
    assert f"{output / 'model_final.pth'} does not load (" in str(error.value)
    assert f"Output folder: {output}." in str(error.value)


def test_a_resume_at_max_iter_writes_the_final_checkpoint_from_the_last_periodic_one(
        tmp_path, data, caplog):
    tiny_trainer(tmp_path, data).train()
    output = tmp_path / "output"
    expected = (output / "model_final.pth").read_bytes()
    # what a kill between the periodic save of iteration 3 and model_final leaves
    (output / "model_final.pth").unlink()
    (output / "last_checkpoint").write_text("model_0000003.pth")
    resumed = tiny_trainer(tmp_path, data, resume=True)
    assert resumed.start_iter == resumed.max_iter == 4
    resumed.train()  # trains nothing; would raise if model_final.pth were not verified
    assert (output / "model_final.pth").read_bytes() == expected
    assert (output / "last_checkpoint").read_text() == "model_final.pth"
    assert "written from" in caplog.text and "model_0000003.pth" in caplog.text


def test_a_resume_at_max_iter_with_no_checkpoint_of_the_last_iteration_fails_by_name(tmp_path):
    checkpointer = saver(tmp_path)
    checkpointer.save("model_0000002", iteration=2)  # only an older checkpoint is left
    hook = ProveFinalCheckpoint(checkpointer)
    hook.trainer = SimpleNamespace(start_iter=4, max_iter=4, iter=4)  # resumed at MAX_ITER 4
    hook.before_train()  # nothing of iteration 3 to copy: nothing written
    assert not (tmp_path / "model_final.pth").exists()
    hook.trainer.iter = 5
    with pytest.raises(UnverifiedCheckpointError, match="model_final.pth does not exist"):
        hook.after_train()


def test_a_run_that_stopped_early_is_not_judged_by_its_final_checkpoint(tmp_path):
    hook = ProveFinalCheckpoint(saver(tmp_path))
    hook.trainer = SimpleNamespace(start_iter=0, max_iter=4, iter=2)  # an exception at 2
    hook.after_train()  # the exception propagating says what happened; nothing added
    assert not (tmp_path / "model_final.pth").exists()



def test_the_lazyconfig_tool_also_ends_with_an_error_when_its_final_save_vanishes(
        tmp_path, data, monkeypatch):
    spec = importlib.util.spec_from_file_location("lazy_tool",
                                                  REPO / "tools" / "lazyconfig_train_net.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    save = FCOSCheckpointer.save
    monkeypatch.setattr(FCOSCheckpointer, "save", lambda self, name, **kwargs: None
                        if name == "model_final" else save(self, name, **kwargs))
    output = tmp_path / "output"
    args = tool.default_argument_parser().parse_args([
        "--config-file", get_config_file("lazy/quickstart.py"),
        f"dataloader.train.dataset.names={data}", "dataloader.train.total_batch_size=2",
        "dataloader.train.num_workers=0", "train.max_iter=2",
        "train.eval_period=0", f"train.output_dir={output}"])
    with pytest.raises(UnverifiedCheckpointError) as error:
        tool.main(args)
    assert f"{output / 'model_final.pth'} does not exist" in str(error.value)
    assert f"Output folder: {output}." in str(error.value)

# -- the preemption save ---------------------------------------------------------------
def preempted_hook(folder: Path, damage=None) -> preemption.SaveOnPreemption:
    checkpointer = saver(folder)
    if damage is not None:
        save = checkpointer.save
        checkpointer.save = lambda name, **kwargs: (save(name, **kwargs), damage(folder, name))
    hook = preemption.SaveOnPreemption(checkpointer)
    hook.trainer = SimpleNamespace(iter=6, max_iter=10)
    return hook


@pytest.fixture
def preempted(monkeypatch):
    monkeypatch.setitem(preemption._state, "requested", "SIGTERM")


def test_a_preemption_exits_75_after_its_checkpoint_is_verified(tmp_path, preempted):
    with pytest.raises(preemption.Preempted) as exit_:
        preempted_hook(tmp_path).after_step()
    assert exit_.value.code == 75
    assert checkpoint_problem(str(tmp_path / "model_0000006.pth"), 6) is None


def test_a_preemption_checkpoint_that_does_not_read_back_is_an_error_not_status_75(
        tmp_path, preempted):
    def truncate(folder, name):
        os.truncate(folder / f"{name}.pth", 200)

    with pytest.raises(UnverifiedCheckpointError) as error:
        preempted_hook(tmp_path, damage=truncate).after_step()
    assert f"{tmp_path / 'model_0000006.pth'} does not load" in str(error.value)
    assert f"Output folder: {tmp_path}." in str(error.value)


# -- the test pause of the atomic save ---------------------------------------------------
def test_the_pause_stops_the_named_write_at_its_stage_and_leaves_a_marker(tmp_path,
                                                                          monkeypatch):
    marker = tmp_path / "paused"
    seen = []
    monkeypatch.setattr(atomic, "PAUSE_SECONDS", 0.0)
    monkeypatch.setattr(atomic, "_writes", {})
    monkeypatch.setattr(atomic.time, "sleep", lambda seconds: seen.append(
        (marker.read_text().split()[:2], (tmp_path / "x").read_bytes())))
    monkeypatch.setenv(atomic.PAUSE_VARIABLE, f"renamed:x:2:{marker}")
    for content in (b"1", b"2", b"3"):
        atomic.atomic_write(str(tmp_path / "x"), lambda f: f.write(content))
    assert seen == [(["renamed", "x"], b"2")]  # the second write, once it is in place


def test_a_malformed_pause_names_the_variable_and_the_form(tmp_path, monkeypatch):
    monkeypatch.setenv(atomic.PAUSE_VARIABLE, "renamed:x")
    with pytest.raises(ValueError, match="FCOS_D2_TEST_PAUSE_IN_SAVE='renamed:x': expected"):
        atomic.atomic_write(str(tmp_path / "x"), lambda f: f.write(b"1"))
    assert not list(tmp_path.iterdir())  # and nothing half-written is left


# -- the window of issue 53, with a real SIGKILL ------------------------------------------
def test_train_net_killed_between_the_last_periodic_save_and_model_final_resumes_to_it(
        scripts, dataset, tmp_path):
    """train_net.py stopped by the atomic save's test pause just before model_final.pth is
    renamed into place (last_checkpoint names model_0000003.pth, of the last iteration),
    killed there, then resumed: exit 0 with model_final.pth, equal to an uninterrupted run's."""
    def argv(output, *flags):
        return ["--config-file", "configs/quickstart.yaml", "--register-coco", "tiny",
                str(dataset / "annotations.json"), str(dataset / "images"), "--skip-test",
                *flags, "MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "32",
                "MODEL.FCOS.NUM_CONVS", "1", "SOLVER.AMP.ENABLED", "False", "SEED", "7",
                "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "4",
                "SOLVER.CHECKPOINT_PERIOD", "2", "DATASETS.TRAIN", "('tiny',)",
                "DATASETS.TEST", "('tiny',)", "OUTPUT_DIR", str(output)]

    marker = tmp_path / "paused"
    whole = scripts.start(argv(tmp_path / "whole"), log=tmp_path / "whole.log")
    killed = scripts.start(argv(tmp_path / "killed"), log=tmp_path / "killed.log", env={
        atomic.PAUSE_VARIABLE: f"written:model_final.pth:1:{marker}"})
    deadline = time.time() + 300
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    os.kill(killed, signal.SIGKILL)
    assert scripts.wait(killed)[0] == -signal.SIGKILL
    assert scripts.wait(whole)[0] == 0, (tmp_path / "whole.log").read_text()[-3000:]
    output = tmp_path / "killed"
    assert (output / "last_checkpoint").read_text() == "model_0000003.pth"
    assert not (output / "model_final.pth").exists()
    resumed = scripts.start(argv(output, "--resume"), log=tmp_path / "resumed.log")
    assert scripts.wait(resumed)[0] == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    assert "Starting training from iteration 4" in (tmp_path / "resumed.log").read_text()
    final = torch.load(output / "model_final.pth", weights_only=True)
    expected = torch.load(tmp_path / "whole" / "model_final.pth", weights_only=True)
    assert final["iteration"] == 3
    assert all(final["model"][k].equal(v) for k, v in expected["model"].items())
