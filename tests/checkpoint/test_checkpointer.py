"""FCOSCheckpointer: atomic saves, resume fallback, data-only loading, shape checks."""
import argparse
import logging
import os
import pickle

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from torch import nn

from fcos_d2 import add_fcos_config
from fcos_d2.checkpoint import (CheckpointReadError, FCOSCheckpointer, UnsafeCheckpointError,
                                WeightsMismatchError, atomic)


class Counter:
    """A checkpointable with state, as detectron2's trainer is one."""

    def __init__(self, iteration: int = 0):
        self.iteration = iteration

    def state_dict(self):
        return {"iteration": self.iteration, "history": [1.5, 2.5]}

    def load_state_dict(self, state):
        self.iteration = state["iteration"]


def tiny_model(width: int = 4, classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, width, 3), nn.GroupNorm(2, width),
                         nn.Conv2d(width, classes, 1))


def checkpointer(folder, model=None, **kwargs) -> FCOSCheckpointer:
    return FCOSCheckpointer(model or tiny_model(), str(folder), save_to_disk=True,
                            trainer=Counter(), **kwargs)


def saved_run(folder, iterations=(0, 1, 2)) -> FCOSCheckpointer:
    """Saves model_<i>.pth for each i, with the weights filled with i, as training does."""
    saver = checkpointer(folder)
    for i in iterations:
        with torch.no_grad():
            for parameter in saver.model.parameters():
                parameter.fill_(float(i))
        saver.checkpointables["trainer"].iteration = i
        saver.save(f"model_{i:07d}", iteration=i)
    return saver


def first_weight(checkpointer_: FCOSCheckpointer) -> float:
    return checkpointer_.model[0].weight.flatten()[0].item()


# -- atomic saves ------------------------------------------------------------------------
def test_a_save_interrupted_before_the_rename_leaves_the_previous_checkpoint_intact(
        tmp_path, monkeypatch):
    saver = saved_run(tmp_path, iterations=[0])
    before = (tmp_path / "model_0000000.pth").read_bytes()

    def killed(source, target):
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(atomic.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        saver.save("model_0000000", iteration=1)
    assert (tmp_path / "model_0000000.pth").read_bytes() == before
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000000.pth"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last_checkpoint", "model_0000000.pth"]


def test_last_checkpoint_is_written_only_after_the_checkpoint_is_in_place(tmp_path, monkeypatch):
    saver = saved_run(tmp_path, iterations=[0])
    renamed = []
    monkeypatch.setattr(atomic.os, "replace",
                        lambda source, target: renamed.append(os.path.basename(target)))
    saver.save("model_0000001", iteration=1)
    assert renamed == ["model_0000001.pth", "last_checkpoint"]


# -- resume: the file last_checkpoint names is damaged ----------------------------------
def test_resume_from_a_truncated_last_checkpoint_falls_back_to_the_newest_readable_one(
        tmp_path, caplog):
    saved_run(tmp_path)
    os.truncate(tmp_path / "model_0000002.pth", 300)
    # copies do not keep modification times: the oldest by time must not win
    os.utime(tmp_path / "model_0000000.pth", (2e9, 2e9))
    resumer = checkpointer(tmp_path)
    with caplog.at_level(logging.WARNING):
        extra = resumer.resume_or_load("", resume=True)
    assert extra["iteration"] == 1 and resumer.checkpointables["trainer"].iteration == 1
    assert first_weight(resumer) == 1.0
    warning = next(r.getMessage() for r in caplog.records if "damaged" in r.getMessage())
    assert str(tmp_path / "model_0000002.pth") in warning
    assert str(tmp_path / "model_0000001.pth") in warning


def test_resume_with_no_readable_checkpoint_stops_naming_the_damaged_file(tmp_path):
    saved_run(tmp_path, iterations=[0, 1])
    for name in ("model_0000000.pth", "model_0000001.pth"):
        os.truncate(tmp_path / name, 300)
    with pytest.raises(CheckpointReadError,
                       match=r"cannot resume: .* names .*model_0000001\.pth.*\(300 bytes"):
        checkpointer(tmp_path).resume_or_load("", resume=True)


# -- data-only loading -------------------------------------------------------------------
def test_a_checkpoint_that_needs_pickle_is_refused_with_how_to_opt_in(tmp_path):
    path = tmp_path / "old.pth"
    torch.save({"model": tiny_model().state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    with pytest.raises(UnsafeCheckpointError,
                       match=r"old\.pth: .*argparse\.Namespace.*MODEL\.WEIGHTS_ALLOW_PICKLE True"):
        checkpointer(tmp_path / "out").load(str(path))


def test_with_the_opt_in_a_pickle_checkpoint_loads_with_a_warning(tmp_path, caplog):
    path = tmp_path / "old.pth"
    torch.save({"model": tiny_model(classes=3).state_dict(), "args": argparse.Namespace()}, path)
    with caplog.at_level(logging.WARNING):
        extra = checkpointer(tmp_path / "out", allow_pickle=True).load(str(path))
    assert isinstance(extra["args"], argparse.Namespace)
    assert any("a pickle can run code" in r.getMessage() for r in caplog.records)


class _Payload:
    def __reduce__(self):
        return (open, ("never_created.txt", "w"))


def test_a_pkl_that_would_run_code_is_refused_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"model": {"w": _Payload()}}))
    with pytest.raises(UnsafeCheckpointError, match=r"evil\.pkl: .*io\.open"):
        checkpointer(tmp_path / "out").load(str(tmp_path / "evil.pkl"))
    assert not (tmp_path / "never_created.txt").exists()


def test_a_detectron_pkl_of_numpy_arrays_loads_without_opt_in(tmp_path):
    model = tiny_model()
    blobs = {name.replace(".", "_"): np.full(tuple(p.shape), 7.0, dtype=np.float32)
             for name, p in model.state_dict().items()}
    (tmp_path / "R-0.pkl").write_bytes(pickle.dumps({"blobs": blobs}, protocol=2))
    loader = checkpointer(tmp_path / "out", model=model)
    loaded = loader._load_file(str(tmp_path / "R-0.pkl"))
    assert loaded["matching_heuristics"] and loaded["__author__"] == "Caffe2"
    assert sorted(loaded["model"]) == sorted(blobs)
    assert loaded["model"]["0_weight"].dtype == np.float32


# -- weights that do not fit the model ---------------------------------------------------
def test_evaluating_weights_of_another_shape_fails_listing_keys_and_shapes(tmp_path):
    path = tmp_path / "five_classes.pth"
    torch.save({"model": tiny_model(classes=5).state_dict()}, path)
    with pytest.raises(WeightsMismatchError, match=r"(?s)five_classes\.pth do not fit.*"
                       r"2 tensors have another shape.*2\.weight: \(5, 4, 1, 1\) -> \(3, 4, 1, 1\)"
                       r".*2\.bias: \(5,\) -> \(3,\)"):
        checkpointer(tmp_path / "out").resume_or_load(str(path), resume=False)


def test_evaluating_weights_with_missing_tensors_fails_listing_them(tmp_path):
    path = tmp_path / "backbone_only.pth"
    state = tiny_model().state_dict()
    torch.save({"model": {k: v for k, v in state.items() if not k.startswith("2.")}}, path)
    with pytest.raises(WeightsMismatchError, match=r"(?s)2 tensors of the model are not in the "
                                                   r"file:\n    2\.weight\n    2\.bias"):
        checkpointer(tmp_path / "out").resume_or_load(str(path), resume=False)


def test_fine_tuning_keeps_fresh_layers_where_shapes_differ_and_names_them(tmp_path, caplog):
    source = tiny_model(classes=5)
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.fill_(9.0)
    torch.save({"model": source.state_dict()}, tmp_path / "five_classes.pth")
    fresh = tiny_model(classes=3)
    fresh_last = fresh[2].weight.clone()
    tuner = checkpointer(tmp_path / "out", model=fresh, reinit_mismatched=True)
    with caplog.at_level(logging.WARNING):
        tuner.resume_or_load(str(tmp_path / "five_classes.pth"), resume=False)
    assert torch.equal(fresh[2].weight, fresh_last)  # kept its initialisation
    assert fresh[0].weight.eq(9.0).all() and fresh[1].weight.eq(9.0).all()  # loaded
    warning = next(r.getMessage() for r in caplog.records if "fresh" in r.getMessage())
    assert "1 layers keep their fresh initialisation (2)" in warning
    assert "2.weight (5, 4, 1, 1) in the weights, (3, 4, 1, 1) in the model" in warning


def test_resuming_is_strict_even_for_a_fine_tuning_trainer(tmp_path):
    saved_run(tmp_path, iterations=[0])
    other = checkpointer(tmp_path, model=tiny_model(classes=5), reinit_mismatched=True)
    with pytest.raises(WeightsMismatchError, match="another shape"):
        other.resume_or_load("", resume=True)


# -- config ------------------------------------------------------------------------------
def test_the_config_keys_reach_the_checkpointer_and_a_bad_sha256_is_refused_by_name():
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_list(["MODEL.WEIGHTS", "w.pth", "MODEL.WEIGHTS_SHA256", "ABCDEF12",
                         "MODEL.WEIGHTS_ALLOW_PICKLE", "True"])
    loader = FCOSCheckpointer.from_config(cfg, tiny_model())
    assert loader.sha256 == {"w.pth": "abcdef12"} and loader.allow_pickle
    cfg.MODEL.WEIGHTS_SHA256 = "not-a-hash"
    with pytest.raises(ValueError, match="MODEL.WEIGHTS_SHA256: 'not-a-hash' is not a sha256"):
        FCOSCheckpointer.from_config(cfg, tiny_model())
