"""benchmarks.epochs (AP against epochs of the small-data recipe): the schedule scaled to E
epochs, the trainer's command line of a run, the curve read from a run's folder, which runs
a results file already holds, and the command's dry run."""
import json
import shlex
from pathlib import Path

from benchmarks.epochs import cli, curve
from benchmarks.records import REQUIRED_KEYS

REGIME_SETTINGS = {"regime": "shapes", "eval_every": 4, "train_images": 400, "val_images": 100}


def test_the_schedule_keeps_the_recipes_proportions_at_any_number_of_epochs():
    # the recipe: 1200 iterations (12 epochs), step at 1000 (5/6), warm-up 100 (1/12)
    assert curve.schedule_overrides(12, 4) == [
        "SOLVER.EPOCHS", "12", "SOLVER.STEPS_EPOCHS", "(10.0,)", "SOLVER.WARMUP_EPOCHS", "1.0",
        "TEST.EVAL_PERIOD_EPOCHS", "4", "SOLVER.CHECKPOINT_PERIOD_EPOCHS", "12"]
    assert curve.schedule_overrides(2, 1)[1:6:2] == ["2", "(1.6667,)", "0.1667"]


def test_a_thin_run_gets_the_regimes_data_and_overrides_before_the_commands():
    folders = {"train": Path("/d/train_8"), "val": Path("/d/val_4")}
    argv = curve.trainer_argv("thin", folders, 3, 24, 4, Path("/out"), ["SOLVER.BASE_LR", "0.02"])
    assert argv[:10] == [
        "--config-file", "configs/FCOS-R18-small-data.yaml",
        "--register-coco", "epochs_thin_train", "/d/train_8/annotations.json", "/d/train_8/images",
        "--register-coco", "epochs_thin_val", "/d/val_4/annotations.json", "/d/val_4/images"]
    opts = argv[10:]
    pairs = dict(zip(opts[0::2], opts[1::2]))
    assert pairs["MODEL.FCOS.NUM_CLASSES"] == "10" and pairs["INPUT.MAX_SIZE_TEST"] == "352"
    assert pairs["DATASETS.TRAIN"] == "('epochs_thin_train',)"
    assert pairs["DATASETS.TEST"] == "('epochs_thin_val',)"
    assert pairs["SEED"] == "3" and pairs["SOLVER.EPOCHS"] == "24"
    assert opts[-4:] == ["SOLVER.BASE_LR", "0.02", "OUTPUT_DIR", "/out/e24_s3"]


def test_the_curve_gives_the_epochs_each_evaluation_followed(tmp_path):
    # 300 iterations for 12 epochs: 25 a epoch; evaluations after iterations 100, 200, 300
    (tmp_path / "config.yaml").write_text("SOLVER:\n  MAX_ITER: 300\n  EPOCHS: 12\n")
    lines = [{"iteration": 99, "bbox/AP": 5.0, "bbox/AP50": 9.0},
             {"iteration": 149, "total_loss": 1.5},
             {"iteration": 199, "bbox/AP": 7.5, "bbox/AP50": 12.0},
             {"iteration": 299, "bbox/AP": 7.0, "bbox/AP50": 13.0}]
    (tmp_path / "metrics.json").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert curve.read_curve(tmp_path) == [{"epochs": 4.0, "AP": 5.0, "AP50": 9.0},
                                          {"epochs": 8.0, "AP": 7.5, "AP50": 12.0},
                                          {"epochs": 12.0, "AP": 7.0, "AP50": 13.0}]


def _record(epochs, seed, overrides=(), **settings):
    record = {key: None for key in REQUIRED_KEYS}
    return {**record, "benchmark": "epochs", "seed": seed, "overrides": list(overrides),
            "metrics": {"AP": 1.0, "curve": [[epochs, 1.0]]}, "times": {},
            "run": {**REGIME_SETTINGS, "epochs": epochs, **settings}}


def test_only_runs_with_the_same_settings_and_overrides_count_as_done(tmp_path):
    results = tmp_path / "results.jsonl"
    stored = [_record(12, 0), _record(12, 1, overrides=["SOLVER.BASE_LR", "0.02"]),
              _record(24, 0, eval_every=2), _record(24, 1, train_images=200), _record(36, 0)]
    results.write_text("".join(json.dumps(r) + "\n" for r in stored))
    args = cli.parse_args(["--epochs", "12", "24", "--seeds", "0", "1"])
    assert (args.train_images, args.val_images) == (400, 100)  # the regime's
    assert cli.missing_runs(results, args) == [(12, 1), (24, 0), (24, 1)]
    # the table shows every E of the same settings and overrides
    assert [line for line, _ in cli.stored_runs(results, args)] == [1, 5]


def test_the_dry_run_prints_the_trainer_command_of_each_run_not_done(scripts, tmp_path):
    base = ["--epochs", "3", "6", "--seeds", "0", "--train-images", "8", "--val-images", "4",
            "--output", str(tmp_path)]
    done = _record(3, 0, train_images=8, val_images=4)
    (tmp_path / "results.jsonl").write_text(json.dumps(done) + "\n")
    result = scripts.run_module("benchmarks.epochs", *base, "--dry-run", "SOLVER.BASE_LR", "0.02")
    assert result.returncode == 0, result.stderr
    # the record stored was made without the override: both runs are to do
    commands = [shlex.split(line) for line in result.stdout.splitlines() if "train_net.py" in line]
    assert [c[c.index("SOLVER.EPOCHS") + 1] for c in commands] == ["3", "6"]
    assert commands[1][1:3] == ["train_net.py", "--config-file"]
    assert commands[1][-4:] == ["SOLVER.BASE_LR", "0.02", "OUTPUT_DIR", str(tmp_path / "e6_s0")]
    plain = scripts.run_module("benchmarks.epochs", *base, "--dry-run")
    assert [line.split("OUTPUT_DIR ")[1] for line in plain.stdout.splitlines()
            if "train_net.py" in line] == [str(tmp_path / "e6_s0")]
