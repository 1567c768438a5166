"""LabelEnc through train_net.py (its META_ARCHs and trainer extension): both steps resume exactly from the middle, step 1 trains
with two CPU workers, a LEF-only step 1 is scored by its LEF, and step 2 leaves a plain
FCOS.

Trainings are forks of one server process (tests/training_processes.py), on the quickstart
config made tiny (ResNet-18, FPN width 64 on P3-P4, one tower conv, LEF width 16 so that
its res3-res4 match ResNet-18's), 2 images a batch of a 4-image synthetic dataset. Step 1:
4 + 2 warm-up iterations (the distance loss starts at iteration 2); step 2: 6 iterations,
the auxiliary loss during the first 3. Checkpoints after iterations 1, 3 and 5; a killed run
dies when iteration 3 starts and resumes from iteration 2, across both switches.
"""
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.checkpoint import FCOSCheckpointer
from fcos_d2.modeling.labelenc import LabelEncStep2
from training_processes import REPO

TINY = ["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1",
        "SEED", "7", "SOLVER.IMS_PER_BATCH", "2", "SOLVER.WARMUP_ITERS", "2",
        "SOLVER.CHECKPOINT_PERIOD", "2", "TEST.EVAL_PERIOD", "0", "MODEL.LABELENC.LEF_WIDTH", "16",
        "DATASETS.TRAIN", "('tiny',)", "DATASETS.TEST", "('tiny',)",
        "DATALOADER.NUM_WORKERS", "0"]
STEP1 = ["MODEL.META_ARCHITECTURE", "LabelEncStep1", "MODEL.LABELENC.STEP", "1",
         "SOLVER.MAX_ITER", "4",
         "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", "2"]

# the LEF and head alone; every detection kept, so that the untrained LEF is scored
STEP1_LEF_ONLY = [*STEP1, "MODEL.LABELENC.STEP1_DETECTOR", "False",
                  "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", "0",
                  "MODEL.FCOS.INFERENCE_TH_TEST", "0.0"]


def step2(step1_output: Path):
    return ["MODEL.META_ARCHITECTURE", "LabelEncStep2", "MODEL.LABELENC.STEP", "2",
            "SOLVER.MAX_ITER", "6",
            "MODEL.LABELENC.AUXILIARY_LOSS_ITERS", "3",
            "MODEL.LABELENC.WEIGHTS", str(step1_output / "model_final.pth")]


def argv(dataset: Path, output: Path, *opts: str, flags=("--skip-test",)):
    return ["--config-file", "configs/quickstart.yaml", "--register-coco", "tiny",
            str(dataset / "annotations.json"), str(dataset / "images"), *flags, *TINY, *opts,
            "OUTPUT_DIR", str(output)]


def log_of(output: Path) -> str:
    return "".join(p.read_text() for p in sorted(output.parent.glob(output.name + "*.log")))


def max_weight_difference(a: Path, b: Path) -> float:
    first = torch.load(a, weights_only=True)["model"]
    second = torch.load(b, weights_only=True)["model"]
    assert first.keys() == second.keys()
    return max((first[k].double() - second[k].double()).abs().max().item() for k in first)


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory, scripts):
    """Step 1 uninterrupted, killed and resumed, and with two CPU workers; then step 2
    (from the uninterrupted step 1) uninterrupted, and killed and resumed."""
    server = scripts
    root = tmp_path_factory.mktemp("labelenc")
    out = {name: root / name for name in ("s1", "s1_killed", "s1_two", "s1_lef", "s2",
                                          "s2_killed")}
    try:
        def start(name, opts, flags=("--skip-test",), **faults):
            return server.start(argv(dataset, out[name], *opts, flags=flags),
                                log=root / f"{name}.log", **faults)

        def finish(*pids):
            for name, pid in pids:
                status, _ = server.wait(pid)
                assert status == 0, log_of(out[name])[-5000:]

        first = {"s1": start("s1", STEP1), "s1_killed": start("s1_killed", STEP1, kill_at=3),
                 "s1_two": start("s1_two", [*STEP1, "SOLVER.MAX_ITER", "1"], flags=[
                     "--skip-test", "--num-gpus", "2", "--dist-url", "auto"]),
                 "s1_lef": start("s1_lef", STEP1_LEF_ONLY, flags=())}  # evaluated at the end
        finish(("s1", first["s1"]), ("s1_two", first["s1_two"]), ("s1_lef", first["s1_lef"]))
        assert server.wait(first["s1_killed"])[0] < 0
        second = [("s1_killed", start("s1_killed", STEP1, flags=["--skip-test", "--resume"])),
                  ("s2", start("s2", step2(out["s1"]), flags=())),  # with the final evaluation
                  ("s2_killed", start("s2_killed", step2(out["s1"]), kill_at=3))]
        finish(*second[:2])
        assert server.wait(second[2][1])[0] < 0
        finish(("s2_killed", start("s2_killed", step2(out["s1"]),
                                   flags=["--skip-test", "--resume"])))
    finally:
        server.stop_running()
    return out


def test_step1_adds_the_warmup_to_the_schedule_and_trains_the_lef_with_the_detector(runs):
    log = log_of(runs["s1"])
    assert "loss_labelenc_distance" in log and "loss_labelenc_cls" in log
    checkpoint = torch.load(runs["s1"] / "model_final.pth", weights_only=True)
    assert checkpoint["iteration"] == 5  # 4 + 2 warm-up iterations
    assert any(k.startswith("label_encoder.bottom_up.") for k in checkpoint["model"])


@pytest.mark.parametrize("step", ["s1", "s2"])
def test_a_step_killed_in_the_middle_and_resumed_ends_as_an_uninterrupted_run(runs, step):
    assert "Starting training from iteration 2" in log_of(runs[f"{step}_killed"])
    difference = max_weight_difference(runs[step] / "model_final.pth",
                                       runs[f"{step}_killed"] / "model_final.pth")
    assert difference <= 1e-6, difference


def test_a_lef_only_step1_trains_no_detector_and_is_scored_by_its_lef(runs):
    log = log_of(runs["s1_lef"])
    assert "loss_labelenc_cls" in log and "loss_fcos_cls" not in log
    assert "loss_labelenc_distance" not in log
    checkpoint = torch.load(runs["s1_lef"] / "model_final.pth", weights_only=True)
    assert checkpoint["iteration"] == 3  # 4 iterations, no warm-up added
    summary = (runs["s1_lef"] / "inference" / "tiny" / "summary.txt").read_text()
    assert summary.count("== tiny [LEF from labels] |") == 1


def test_step2_is_evaluated_as_the_detector_it_trains(runs):
    summary = (runs["s2"] / "inference" / "tiny" / "summary.txt").read_text()
    assert summary.count("== tiny |") == 1


def test_step1_trains_with_two_cpu_workers(runs):
    if torch.cuda.is_available():
        pytest.skip("--num-gpus 2 starts CPU workers only where CUDA is not available")
    log = log_of(runs["s1_two"])
    assert "Rank of current process: 0. World size: 2" in log
    assert (runs["s1_two"] / "model_final.pth").is_file()


def _config(output: Path, *opts: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list([*TINY, *opts, "MODEL.FCOS.INFERENCE_TH_TEST", "0.0"])
    return cfg


def test_step2_leaves_a_plain_fcos_that_loads_strictly_and_detects_the_same(runs, dataset):
    plain_weights = torch.load(runs["s2"] / "model_final_fcos.pth", weights_only=True)
    assert not [k for k in plain_weights["model"] if k.startswith(("label_encoder.", "adapter."))]
    plain = build_model(_config(runs["s2"])).eval()
    plain.load_state_dict(plain_weights["model"])  # strict
    trained = LabelEncStep2(_config(runs["s2"], *step2(runs["s1"]))).eval()
    FCOSCheckpointer(trained).load(str(runs["s2"] / "model_final.pth"))
    image = torch.randint(0, 256, (3, 128, 128), dtype=torch.uint8)
    with torch.no_grad():
        expected, got = trained([{"image": image}])[0], plain([{"image": image}])[0]
    assert len(got["instances"]) > 0
    assert torch.equal(expected["instances"].pred_boxes.tensor, got["instances"].pred_boxes.tensor)
    assert torch.equal(expected["instances"].scores, got["instances"].scores)
