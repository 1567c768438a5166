"""train_net.py end to end, as a user runs it: train with periodic evaluation, resume,
evaluate a checkpoint, check expected results, and refuse a wrong class count.

The runs share one tiny model (ResNet-18, narrow FPN and head, batch of 2) and a 4-image
COCO dataset of synthetic shapes that the test writes and registers with --register-coco.
Every candidate is kept at inference (MODEL.FCOS.INFERENCE_TH_TEST 0), so an untrained
model still has detections and COCOEvaluator reports per-category AP.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from fcos_d2.data import synthetic

TINY_MODEL = ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1",
              "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", "MODEL.FCOS.PRE_NMS_TOPK_TEST", "50",
              "SOLVER.IMS_PER_BATCH", "2", "SOLVER.WARMUP_ITERS", "1",
              "DATALOADER.NUM_WORKERS", "0", "DATASETS.TRAIN", "('tiny',)",
              "DATASETS.TEST", "('tiny',)"]


def train_net(scripts, dataset: Path, output: Path, *opts: str,
              flags=()) -> subprocess.CompletedProcess:
    """Runs train_net.py on the quickstart config made tiny, with the dataset as 'tiny'."""
    return scripts.run("train_net.py", "--config-file", "configs/quickstart.yaml",
                       "--register-coco", "tiny", str(dataset / "annotations.json"),
                       str(dataset / "images"), *flags, *TINY_MODEL, *opts,
                       "OUTPUT_DIR", str(output))


def succeeded(run: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return run


def metrics(output: Path):
    return [json.loads(line) for line in (output / "metrics.json").read_text().splitlines()]


def last_training_iteration(output: Path) -> int:
    return max(m["iteration"] for m in metrics(output) if "lr" in m)


def summary_iterations(output: Path):
    """The 'iterations trained' of each block of the tiny dataset's summary.txt, in order."""
    text = (output / "inference" / "tiny" / "summary.txt").read_text()
    return [int(line.split(" | ")[1].split(": ")[1]) for line in text.splitlines()
            if line.startswith("== tiny |")]


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("train_net_output")


@pytest.fixture(scope="module")
def first_run(scripts, dataset, output):
    """4 iterations, evaluation every 2, checkpoints every 2, 2 validation pictures."""
    return succeeded(train_net(scripts, dataset, output, "SOLVER.MAX_ITER", "4",
                               "TEST.EVAL_PERIOD", "2", "SOLVER.CHECKPOINT_PERIOD", "2",
                               flags=["--vis-val", "2"]))


@pytest.fixture(scope="module")
def resumed_run(scripts, first_run, dataset, output):
    """Resumes the first run up to 6 iterations, without the evaluation at the end."""
    return succeeded(train_net(scripts, dataset, output, "SOLVER.MAX_ITER", "6",
                               "TEST.EVAL_PERIOD", "2", flags=["--resume", "--skip-test"]))


@pytest.fixture(scope="module")
def evaluation_run(scripts, resumed_run, dataset, output):
    """Evaluates the resumed run's final checkpoint, expecting any AP in [0, 100]."""
    return succeeded(train_net(scripts, dataset, output,
                               "MODEL.WEIGHTS", str(output / "model_final.pth"),
                               "TEST.EXPECTED_RESULTS", "[['bbox', 'AP', 50.0, 50.0]]",
                               flags=["--eval-only"]))


def test_training_writes_checkpoints_metrics_and_a_summary_per_evaluation(first_run, output):
    assert (output / "model_0000001.pth").is_file()  # iteration 1 = 2nd, CHECKPOINT_PERIOD 2
    assert (output / "last_checkpoint").read_text().strip() == "model_final.pth"
    assert torch.load(output / "model_final.pth", weights_only=False)["iteration"] == 3
    assert any(p.name.startswith("events.out.tfevents") for p in output.iterdir())
    assert last_training_iteration(output) == 3
    evaluated_at = [m["iteration"] for m in metrics(output) if "bbox/AP" in m]
    assert sorted(evaluated_at) == [1, 4]  # detectron2 logs the final one at MAX_ITER
    assert summary_iterations(output) == [2, 4]  # periodic at 2, final at 4
    summary = (output / "inference" / "tiny" / "summary.txt").read_text()
    assert "AP   AP50   AP75    APs    APm    APl" in summary
    for name in synthetic.CLASS_NAMES:  # per-category AP of every class
        assert f"\n    {name} " in summary


def test_without_cuda_the_run_falls_back_to_the_cpu_with_a_warning(first_run, output):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: nothing to fall back from")
    assert "CUDA is not available: MODEL.DEVICE cuda -> cpu" in first_run.stdout
    assert yaml.safe_load((output / "config.yaml").read_text())["MODEL"]["DEVICE"] == "cpu"


def test_vis_val_saves_pictures_and_detections_of_validation_images(first_run, output):
    saved = sorted(p.name for p in (output / "inference" / "tiny" / "predictions").iterdir())
    assert saved == ["000000.json", "000000.png", "000001.json", "000001.png"]


def test_resume_continues_from_the_last_checkpoint_and_skip_test_skips_final_evaluation(
        resumed_run, output):
    assert "Starting training from iteration 4" in resumed_run.stdout + resumed_run.stderr
    assert torch.load(output / "model_final.pth", weights_only=False)["iteration"] == 5
    assert last_training_iteration(output) == 5
    assert summary_iterations(output) == [2, 4]  # --skip-test: no evaluation after 6


def test_eval_only_evaluates_the_checkpoint_and_reports_expected_results(evaluation_run, output):
    assert summary_iterations(output) == [2, 4, 6]  # model_final.pth is from iteration 5
    log = evaluation_run.stdout + evaluation_run.stderr
    assert "TEST.EXPECTED_RESULTS: PASS: bbox/AP = " in log


def test_eval_only_fails_with_exit_status_1_when_expected_results_are_not_met(
        scripts, evaluation_run, dataset, output):
    run = train_net(scripts, dataset, output, "MODEL.WEIGHTS", str(output / "model_final.pth"),
                    "TEST.EXPECTED_RESULTS", "[['bbox', 'AP', 1000.0, 1.0]]", flags=["--eval-only"])
    assert run.returncode == 1
    assert "TEST.EXPECTED_RESULTS: FAIL: bbox/AP = " in run.stdout + run.stderr


def test_num_classes_that_differs_from_the_dataset_is_refused_naming_both(scripts, dataset,
                                                                         tmp_path):
    run = train_net(scripts, dataset, tmp_path, "MODEL.FCOS.NUM_CLASSES", "3")
    assert run.returncode != 0
    assert ("dataset 'tiny' has 6 classes but MODEL.FCOS.NUM_CLASSES is 3"
            in run.stderr.strip().splitlines()[-1])
    assert not os.path.exists(tmp_path / "config.yaml")  # refused before anything is written


def test_two_cpu_workers_train_and_evaluate_together(scripts, dataset, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("--num-gpus 2 starts CPU workers only where CUDA is not available")
    run = succeeded(train_net(scripts, dataset, tmp_path, "SOLVER.MAX_ITER", "2",
                              "TEST.EVAL_PERIOD", "0",
                              flags=["--num-gpus", "2", "--dist-url", "auto"]))
    assert "Rank of current process: 0. World size: 2" in run.stdout
    assert summary_iterations(tmp_path) == [2]  # written once, by the main worker
