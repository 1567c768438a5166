"""The best checkpoint and early stopping (fcos_d2/engine/best.py) on scripted sequences of
evaluation results: no training, a fake trainer whose storage gets the metrics."""
import math
from types import SimpleNamespace

import pytest
import torch
from detectron2.utils.events import EventStorage

from fcos_d2.checkpoint import FCOSCheckpointer
from fcos_d2.engine.best import (EarlyStop, ImprovementTracker, KeepBestCheckpoint,
                                 best_metric_name)

NAN = float("nan")


def test_the_tracker_follows_the_best_and_stops_after_patience_evaluations_without_gain():
    tracker = ImprovementTracker("max", patience=3, min_delta=0.5)
    verdicts = [tracker.update(value, 100 * (i + 1))
                for i, value in enumerate([10, 12, 11.5, 12.3, 12.6, 12.6, NAN, 12.7])]
    # 10, 12: references; 11.5: stale 1; 12.3: best but < 12 + 0.5, stale 2; 12.6: beats 12
    # by > 0.5, new reference; 12.6: stale 1; NaN: stale 2; 12.7: best, stale 3 -> stop.
    assert [v.is_best for v in verdicts] == [True, True, False, True, True, False, False, True]
    assert [v.stop for v in verdicts] == [False] * 7 + [True]
    assert (tracker.best, tracker.best_iterations, tracker.reference) == (12.7, 800, 12.6)


def test_min_mode_and_evaluations_that_do_not_count():
    tracker = ImprovementTracker("min", patience=1)
    assert tracker.update(3.0, 10).is_best and tracker.update(2.0, 20).is_best
    assert tracker.update(2.5, 30, counts=False) == (False, False)  # before the last LR step
    assert tracker.update(2.5, 40) == (False, True)
    assert ImprovementTracker(patience=0).update(NAN, 1) == (False, False)  # never stops
    with pytest.raises(ValueError, match="TEST.BEST_CHECKPOINT.MODE 'best': use 'max' or"):
        ImprovementTracker("best")


def test_the_default_metric_is_box_ap_or_mask_ap_of_the_first_test_set():
    assert best_metric_name("", mask_on=False, test_datasets=("val",)) == "bbox/AP"
    assert best_metric_name("", mask_on=True, test_datasets=("val",)) == "segm/AP"
    assert best_metric_name("", mask_on=False, test_datasets=("a", "b")) == "a/bbox/AP"
    assert best_metric_name("bbox/AP50", mask_on=True, test_datasets=("val",)) == "bbox/AP50"


class _Run:
    """A hook on a fake trainer of ``max_iter`` iterations, evaluated every 10, with a
    periodic checkpoint every 20 as detectron2's PeriodicCheckpointer would write it."""

    def __init__(self, folder, *, max_iter=100, patience=0, min_delta=0.0, last_step=0):
        self.model = torch.nn.Linear(2, 1)
        self.checkpointer = FCOSCheckpointer(self.model, str(folder))
        self.trainer = SimpleNamespace(iter=0, max_iter=max_iter, storage=None)
        self.hook = KeepBestCheckpoint(
            self.checkpointer, eval_period=10, metric="bbox/AP", last_step=last_step,
            tracker=ImprovementTracker("max", patience, min_delta),
            output_dir=str(folder), dataset_name="val")
        self.hook.trainer = self.trainer

    def evaluate(self, iterations: int, ap: float) -> None:
        """The periodic evaluation after ``iterations``: the weights get ``ap`` as their
        bias (to tell them apart), the checkpoint of the iteration is written, the metric
        stored, then the hook's after_step."""
        self.trainer.iter = self.trainer.storage.iter = iterations - 1
        with torch.no_grad():
            self.model.bias.fill_(ap)
        if iterations % 20 == 0:
            self.checkpointer.save(f"model_{iterations - 1:07d}", iteration=iterations - 1)
        self.trainer.storage.put_scalar("bbox/AP", ap, smoothing_hint=False)
        self.hook.after_step()


def _best(folder):
    saved = torch.load(folder / "model_best.pth", weights_only=False)
    return saved["iteration"], saved["model"]["bias"].item()


def test_model_best_follows_the_metric_and_last_checkpoint_stays_the_last(tmp_path):
    run = _Run(tmp_path)
    page = tmp_path / "inference" / "val" / "report.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html><body><h1>val: evaluation</h1><table></table></body></html>")
    with EventStorage(0) as run.trainer.storage:
        run.evaluate(10, 5.0)
        assert ("<h1>val: evaluation</h1>\n<p class='note'>best bbox/AP 5.00 after 10 "
                "iterations trained (model_best.pth)</p><table>" in page.read_text())
        assert _best(tmp_path) == (9, 5.0)  # iteration: 0-based, as every checkpoint's
        assert not (tmp_path / "last_checkpoint").exists()  # no checkpoint to resume yet
        run.evaluate(20, 7.0)
        run.evaluate(30, 6.0)
        assert _best(tmp_path) == (19, 7.0)
        run.evaluate(40, NAN)
        assert _best(tmp_path) == (19, 7.0)
        assert (tmp_path / "last_checkpoint").read_text() == "model_0000039.pth"
    summary = (tmp_path / "inference" / "val" / "summary.txt").read_text()
    assert summary.splitlines()[::2] == [
        "== best bbox/AP 5.00 after 10 iterations trained (model_best.pth) ==",
        "== best bbox/AP 7.00 after 20 iterations trained (model_best.pth) =="]


def test_early_stop_at_the_expected_evaluation_leaves_best_and_final_checkpoints(tmp_path):
    run = _Run(tmp_path, patience=3, min_delta=1.0)
    with EventStorage(0) as run.trainer.storage:
        for iterations, ap in [(10, 5.0), (20, 8.0), (30, 8.5), (40, 9.0)]:
            run.evaluate(iterations, ap)  # 8.5 and 9.0 do not beat 8.0 by more than 1.0
        with pytest.raises(EarlyStop, match="early stop after iteration 50: 3 evaluations"):
            run.evaluate(50, 7.0)
    assert _best(tmp_path) == (39, 9.0)
    summary = (tmp_path / "inference" / "val" / "summary.txt").read_text().splitlines()
    assert summary[-2].startswith("== early stop after iteration 50: 3 evaluations without an "
                                  "improvement of bbox/AP by more than 1.0")
    assert summary[-2].endswith("best 9.0 after 40 iterations (model_best.pth) ==")
    final = torch.load(tmp_path / "model_final.pth", weights_only=False)
    assert final["iteration"] == 49
    restored = torch.nn.Linear(2, 1)
    FCOSCheckpointer(restored).load(str(tmp_path / "model_best.pth"))  # loadable as any
    assert restored.bias.item() == 9.0


def test_evaluations_until_the_last_lr_step_do_not_count_towards_the_patience(tmp_path):
    run = _Run(tmp_path, patience=1, last_step=30)
    with EventStorage(0) as run.trainer.storage:
        for iterations in (10, 20, 30):  # no gain, but at or before the step at 30
            run.evaluate(iterations, 5.0)
        with pytest.raises(EarlyStop):
            run.evaluate(40, 5.0)


def test_a_resumed_hook_keeps_the_best_and_the_patience(tmp_path):
    first = _Run(tmp_path, patience=3)
    with EventStorage(0) as first.trainer.storage:
        first.evaluate(10, 9.0)
        first.evaluate(20, 4.0)
    state = first.hook.state_dict()
    assert state == {"metric": "bbox/AP", "best": 9.0, "best_iterations": 10,
                     "reference": 9.0, "stale": 1}
    resumed = _Run(tmp_path, patience=3)
    resumed.hook.load_state_dict(state)
    with EventStorage(20) as resumed.trainer.storage:
        resumed.evaluate(30, 6.0)  # worse than the best before the resume
        assert _best(tmp_path) == (9, 9.0)
        with pytest.raises(EarlyStop):
            resumed.evaluate(40, 6.0)  # the third in a row without gain
    assert math.isclose(resumed.hook.tracker.best, 9.0)


def test_a_run_resumed_after_its_early_stop_stops_at_once(tmp_path):
    run = _Run(tmp_path, patience=1)
    run.hook.tracker.load_state_dict({"best": 5.0, "best_iterations": 10, "reference": 5.0,
                                      "stale": 1})
    with pytest.raises(EarlyStop, match="already stopped"):
        run.hook.before_train()


def test_early_stopping_without_periodic_evaluation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="SOLVER.EARLY_STOP.PATIENCE 2 needs periodic "
                                         "evaluation: set TEST.EVAL_PERIOD"):
        KeepBestCheckpoint(None, eval_period=0, metric="bbox/AP",
                           tracker=ImprovementTracker(patience=2))
