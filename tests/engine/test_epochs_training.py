"""train_net.py with a schedule in epochs and early stopping, end to end: a tiny model on a
4-image dataset, batch 2, so one epoch is 2 iterations; then --eval-only on model_best.pth
and --resume with the same and with another derived schedule; two workers; and
tools/lazyconfig_train_net.py with train.epochs."""
import importlib.util
import json
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from fcos_d2 import get_config_file
from fcos_d2.data import register_coco_dataset

REPO = Path(__file__).resolve().parents[2]

TINY = ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1",
        "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", "MODEL.FCOS.PRE_NMS_TOPK_TEST", "50",
        "SOLVER.WARMUP_ITERS", "1", "DATALOADER.NUM_WORKERS", "0",
        "DATASETS.TRAIN", "('tiny',)", "DATASETS.TEST", "('tiny',)"]
# 5 epochs = 10 iterations, LR step after epoch 1, evaluation and checkpoint every epoch;
# no evaluation can beat another by 100 AP, so the first one that counts (the second: the
# first is not after the LR step) stops the training.
EPOCHS = ["SOLVER.EPOCHS", "5", "SOLVER.STEPS_EPOCHS", "(1,)", "TEST.EVAL_PERIOD_EPOCHS", "1",
          "SOLVER.CHECKPOINT_PERIOD_EPOCHS", "1", "SOLVER.EARLY_STOP.PATIENCE", "1",
          "SOLVER.EARLY_STOP.MIN_DELTA", "100.0"]


def train_net(scripts, dataset: Path, output: Path, *opts: str, batch: int = 2,
              flags=()) -> subprocess.CompletedProcess:
    """train_net.py on configs/quickstart.yaml made tiny, the dataset registered as 'tiny'."""
    return scripts.run("train_net.py", "--config-file", "configs/quickstart.yaml",
                       "--register-coco", "tiny", str(dataset / "annotations.json"),
                       str(dataset / "images"), *flags, *TINY, "SOLVER.IMS_PER_BATCH",
                       str(batch), *opts, "OUTPUT_DIR", str(output))


def log(run: subprocess.CompletedProcess) -> str:
    return run.stdout + run.stderr


def succeeded(run: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return run


def summary_lines(output: Path):
    return (output / "inference" / "tiny" / "summary.txt").read_text().splitlines()


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("epochs_output")


@pytest.fixture(scope="module")
def stopped_run(scripts, dataset, output):
    return succeeded(train_net(scripts, dataset, output, *EPOCHS))


def test_the_schedule_is_derived_from_the_filtered_images_and_logged(stopped_run, output):
    assert ("Schedule in epochs: 4 training images (after filtering), total batch 2 "
            "(2 per worker x 1): 2 iterations per epoch" in log(stopped_run))
    saved = torch.load(output / "model_final.pth", weights_only=False)
    schedule = saved["trainer"]["hooks"]["ScheduleOnResume"]
    assert (schedule["SOLVER.MAX_ITER"], schedule["SOLVER.STEPS"]) == (10, [2])
    assert (schedule["TEST.EVAL_PERIOD"], schedule["SOLVER.CHECKPOINT_PERIOD"]) == (2, 2)


def test_early_stop_ends_the_training_at_the_expected_evaluation(stopped_run, output):
    assert "early stop after iteration 4: 1 evaluations without an improvement" in log(stopped_run)
    trained = [json.loads(line)["iteration"] for line in
               (output / "metrics.json").read_text().splitlines() if "lr" in json.loads(line)]
    assert max(trained) == 3  # 0-based: 4 iterations of 10
    assert torch.load(output / "model_final.pth", weights_only=False)["iteration"] == 3
    assert (output / "last_checkpoint").read_text() == "model_final.pth"
    blocks = [line for line in summary_lines(output) if line.startswith("== tiny |")]
    assert [b.split(" | ")[1] for b in blocks] == ["iterations trained: 2",
                                                   "iterations trained: 4"]


def test_eval_only_accepts_model_best_and_reports_its_iteration(scripts, stopped_run, dataset,
                                                                output):
    best = torch.load(output / "model_best.pth", weights_only=False)["iteration"] + 1
    assert best in (2, 4)
    assert any(line.startswith("== best bbox/AP ") and
               line.endswith(f"after {best} iterations trained (model_best.pth) ==")
               for line in summary_lines(output))
    succeeded(train_net(scripts, dataset, output, "MODEL.WEIGHTS",
                        str(output / "model_best.pth"), flags=["--eval-only"]))
    blocks = [line for line in summary_lines(output) if line.startswith("== tiny |")]
    assert len(blocks) == 3 and blocks[-1].startswith(f"== tiny | iterations trained: {best} |")


def test_resume_after_an_early_stop_trains_no_further(scripts, stopped_run, dataset, output):
    run = succeeded(train_net(scripts, dataset, output, *EPOCHS, flags=["--resume"]))
    assert "early stop: already stopped (1 evaluations without an improvement" in log(run)
    assert torch.load(output / "model_final.pth", weights_only=False)["iteration"] == 3


def test_resume_with_another_derived_schedule_is_refused_naming_both(scripts, stopped_run,
                                                                     dataset, output):
    run = train_net(scripts, dataset, output, *EPOCHS, batch=1, flags=["--resume"])
    assert run.returncode != 0
    assert ("the checkpoint's schedule was derived from epochs as SOLVER.MAX_ITER 10, "
            "SOLVER.STEPS (2,), SOLVER.CHECKPOINT_PERIOD 2, TEST.EVAL_PERIOD 2, "
            "SOLVER.IMS_PER_BATCH 2, but this run derives SOLVER.MAX_ITER 20, SOLVER.STEPS "
            "(4,), SOLVER.CHECKPOINT_PERIOD 4, TEST.EVAL_PERIOD 4, SOLVER.IMS_PER_BATCH 1"
            in log(run)), log(run)[-1500:]


def test_a_setting_in_both_units_on_the_command_line_is_refused(scripts, dataset, tmp_path):
    run = train_net(scripts, dataset, tmp_path, "SOLVER.EPOCHS", "2", "SOLVER.MAX_ITER", "5")
    assert run.returncode != 0
    assert ("the command line sets both SOLVER.MAX_ITER and SOLVER.EPOCHS, the same setting "
            "in iterations and in epochs: remove one of them" in log(run))


def test_two_cpu_workers_derive_the_same_schedule_and_stop_together(scripts, dataset, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("--num-gpus 2 starts CPU workers only where CUDA is not available")
    run = succeeded(train_net(scripts, dataset, tmp_path, *EPOCHS,
                              flags=["--num-gpus", "2", "--dist-url", "auto"]))
    assert "total batch 2 (1 per worker x 2): 2 iterations per epoch" in log(run)
    assert "early stop after iteration 4" in log(run)  # rank 0's decision, taken by both
    assert torch.load(tmp_path / "model_final.pth", weights_only=False)["iteration"] == 3
    assert (tmp_path / "model_best.pth").is_file()


def test_the_lazy_config_trains_for_its_epochs_and_refuses_another_schedule_on_resume(
        dataset, tmp_path):
    name = f"lazy_epochs_{uuid.uuid4().hex[:8]}"
    register_coco_dataset(name, str(dataset / "annotations.json"), str(dataset / "images"))
    spec = importlib.util.spec_from_file_location("lazyconfig_train_net",
                                                  REPO / "tools" / "lazyconfig_train_net.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    tiny = ["--config-file", get_config_file("lazy/quickstart.py"),
            f"dataloader.train.dataset.names={name}", f"dataloader.test.dataset.names={name}",
            "dataloader.train.num_workers=0", "dataloader.test.num_workers=0",
            "model.score_thresh=0.0", f"train.output_dir={tmp_path}", "train.epochs=1"]
    parser = script.default_argument_parser()
    script.main(parser.parse_args([*tiny, "dataloader.train.total_batch_size=2"]))
    saved = torch.load(tmp_path / "model_final.pth", weights_only=False)
    assert saved["iteration"] == 1  # 4 images / 2 per iteration: 2 iterations
    schedule = saved["trainer"]["hooks"]["ScheduleOnResume"]
    assert (schedule["derived"], schedule["train.max_iter"], schedule["train.epochs"]) == \
        (True, 2, 1)
    with pytest.raises(ValueError, match="derived from epochs as train.max_iter 2, "
                                         "dataloader.train.total_batch_size 2, but this run "
                                         "derives train.max_iter 4"):
        script.main(parser.parse_args(["--resume", *tiny,
                                       "dataloader.train.total_batch_size=1"]))
