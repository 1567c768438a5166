"""LabelEnc's two steps as contenders of the training-quality benchmark.

LabelEnc (``fcos_d2/modeling/labelenc``) on the recipe: step 1 trains the label encoding
function (LEF), step 2 trains the detector with the auxiliary loss against it, starting
from step 1. ``LabelEncContender`` runs both in one run; a ``Step2Variant`` runs step 2
alone from the step 1 of ``LABELENC``'s run with the same seed, so it waits for that run
(``waits_for``). The AP of both is that of step 2's weights loaded strictly into the plain
recipe FCOS. This module uses the protocol and the contenders, never the command.
"""
import os
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks.train_quality import protocol
from benchmarks.train_quality.contenders import PROTOCOL_BEFORE_ISSUE_60, RECIPE, FcosD2Contender
from benchmarks.train_quality.results import checked_results, other_overrides

# LabelEnc (fcos_d2/modeling/labelenc) on the recipe: step 1 with the distance-loss warm-up
# added to REGIME (a third of it, as the official 30000 of 90000), then step 2 with REGIME
# and the auxiliary loss for 8/9 of it (the official 80000 of 90000); one run does both,
# step 2 starting from that seed's step 1. LEF width 16: res3-res5 as ResNet-18's.
LABELENC = "fcos-d2 recipe+LabelEnc"
LABELENC_WARMUP, LABELENC_AUXILIARY = 200, 533
LABELENC_STEPS = {
    1: ["MODEL.META_ARCHITECTURE", "LabelEncStep1", "MODEL.LABELENC.STEP", 1,
        "MODEL.LABELENC.LEF_WIDTH", 16,
        "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", LABELENC_WARMUP],
    2: ["MODEL.META_ARCHITECTURE", "LabelEncStep2", "MODEL.LABELENC.STEP", 2,
        "MODEL.LABELENC.LEF_WIDTH", 16,
        "MODEL.LABELENC.AUXILIARY_LOSS_ITERS", LABELENC_AUXILIARY],
}
# Contenders that run both steps: name -> overrides of their step 1. The LEF-only step 1
# (MODEL.LABELENC.STEP1_DETECTOR False): the LEF and the head learn alone for REGIME's
# iterations, then the official step 2. Sharing its head with a detector from scratch,
# the LEF of the official step 1 ends up detecting poorly from the labels themselves
# (the records' "step1_lef_AP").
LABELENC_LEF_ONLY = "fcos-d2 recipe+LabelEnc, LEF-only step 1"
STEP1_VARIANTS: Dict[str, List] = OrderedDict([
    (LABELENC, []),
    (LABELENC_LEF_ONLY, ["MODEL.LABELENC.STEP1_DETECTOR", False,
                         "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", 0]),
])
# Step-2 variants, from the step 1 of LABELENC's run with the same seed: name -> overrides.
# Without the auxiliary loss, step 2 differs from the recipe only by its start (head and FPN
# from step 1): how much of LabelEnc's gain is that start? From scratch, the official step 2
# throws away the backbone step 1 trained (it would start from ImageNet weights): starting
# it from step 1's detector instead, with and without the auxiliary loss.
STEP2_FROM_DETECTOR = ["MODEL.LABELENC.STEP2_BACKBONE", "step1"]
STEP2_VARIANTS: Dict[str, List] = OrderedDict([
    ("fcos-d2 recipe+LabelEnc, step 2 without auxiliary loss",
     ["MODEL.LABELENC.AUXILIARY_LOSS_ITERS", 0]),
    ("fcos-d2 recipe+LabelEnc, step 2 from step 1's detector", STEP2_FROM_DETECTOR),
    ("fcos-d2 recipe+LabelEnc, step 2 from step 1's detector without auxiliary loss",
     [*STEP2_FROM_DETECTOR, "MODEL.LABELENC.AUXILIARY_LOSS_ITERS", 0]),
    # the auxiliary loss is worth +0.7 at weight 1: does more of it help more?
    ("fcos-d2 recipe+LabelEnc, step 2 with auxiliary loss weight 4",
     ["MODEL.LABELENC.AUXILIARY_LOSS_WEIGHT", 4.0]),
])


def _one_step_only(name: str, init_seed: Optional[int]) -> None:
    if init_seed is not None:
        raise ValueError(f"--init-seed is for one-step contenders; {name!r} trains in steps")


class LabelEncContender(FcosD2Contender):
    """LabelEnc's step 1 (with `step1_overrides`), then its step 2 from it, in one run."""

    def __init__(self, name: str, step1_overrides: Sequence):
        super().__init__(name, PROTOCOL_BEFORE_ISSUE_60)  # as LabelEnc was measured
        self.step1_overrides = list(step1_overrides)

    def step_config(self, step: int, seed: int, output_dir: str, opts: Sequence = (),
                    regime: str = "shapes"):
        """The config of its step `step` (1: with its step-1 overrides before `opts`)."""
        own = self.step1_overrides if step == 1 else []
        return self.config(seed, output_dir, [*own, *opts], regime, step=LABELENC_STEPS[step])

    def run(self, seed: int, output_dir: str, opts: Sequence, regime: str = "shapes", *,
            diagnostics: bool = False, init_seed: Optional[int] = None,
            step1_from: Optional[str] = None, also_evaluate: Sequence = ()) -> List[dict]:
        _one_step_only(self.name, init_seed)
        return [run_labelenc(self, seed, output_dir, opts, regime)]


class Step2Variant(FcosD2Contender):
    """Step 2 with `step2_overrides`, from the step 1 of ``LABELENC``'s run of its seed."""

    waits_for = LABELENC

    def __init__(self, name: str, step2_overrides: Sequence):
        super().__init__(name, PROTOCOL_BEFORE_ISSUE_60)  # as LabelEnc was measured
        self.step2_overrides = list(step2_overrides)

    def run(self, seed: int, output_dir: str, opts: Sequence, regime: str = "shapes", *,
            diagnostics: bool = False, init_seed: Optional[int] = None,
            step1_from: Optional[str] = None, also_evaluate: Sequence = ()) -> List[dict]:
        _one_step_only(self.name, init_seed)
        return [run_step2_variant(self, seed, output_dir, opts, regime, step1_from)]


def run_labelenc(contender: LabelEncContender, seed: int, output_dir: str, opts: Sequence,
                 regime: str = "shapes") -> dict:
    """Step 1 of `contender`, then step 2 from it; also reports the AP of step 1's detector
    (None if it trains none), that of its LEF (``evaluate_lef``) and each step's seconds."""
    import torch

    folder = os.path.join(output_dir, "step1")
    cfg1 = contender.step_config(1, seed, folder, opts, regime)
    step1, common1 = protocol.train(contender.build, cfg1, seed)
    if common1["status"] != "ok":
        return {"contender": contender.name, "AP": 0.0, "AP50": 0.0, **common1,
                "train_seconds_step1": common1["train_seconds"]}
    os.makedirs(folder, exist_ok=True)
    weights = os.path.join(folder, "model_final.pth")
    torch.save({"model": step1.state_dict()}, weights)
    step1_record = {"final_losses_step1": common1["final_losses"],
                    "step1_AP": (protocol.evaluate(step1, cfg1)["AP"]
                                 if cfg1.MODEL.LABELENC.STEP1_DETECTOR else None),
                    "step1_lef_AP": evaluate_lef(step1, cfg1)["AP"],
                    "train_seconds_step1": common1["train_seconds"],
                    "iterations_step1": common1["iterations"]}
    return run_step2(contender, [], seed, output_dir, opts, weights, step1_record, regime)


def evaluate_lef(step1, cfg) -> Dict[str, float]:
    """COCO box AP of step 1's head on its LEF's features of the validation images' ground
    truth (``detect_from_labels``): how well the LEF encodes the labels."""
    from fcos_d2.modeling.labelenc import DetectFromLabels, annotated_test_mapper

    return protocol.evaluate(DetectFromLabels(step1), cfg, mapper=annotated_test_mapper(cfg))


def run_step2(contender: FcosD2Contender, step2_overrides: Sequence, seed: int,
              output_dir: str, opts: Sequence, weights: str, step1_record: dict,
              regime: str = "shapes") -> dict:
    """LabelEnc's step 2 of `contender` (with `step2_overrides`) from the step-1 file
    `weights`; the AP is that of its weights loaded strictly into the plain recipe FCOS."""
    import torch

    from fcos_d2.modeling.labelenc import fcos_state_dict, init_step2_from_step1

    folder = os.path.join(output_dir, "step2")
    cfg2 = contender.config(seed, folder, [*step2_overrides, *opts,
                                           "MODEL.LABELENC.WEIGHTS", weights],
                            regime, step=LABELENC_STEPS[2])
    from_detector = cfg2.MODEL.LABELENC.STEP2_BACKBONE == "step1"
    step2, common2 = protocol.train(
        contender.build, cfg2, seed,
        init=lambda model: init_step2_from_step1(model, weights,
                                                 backbone_from_step1=from_detector))
    common = {**common2, **step1_record, "train_seconds_step2": common2["train_seconds"],
              "train_seconds": round(step1_record["train_seconds_step1"]
                                     + common2["train_seconds"], 1)}
    # both steps' iterations, as train_seconds sums both steps' seconds; none where the
    # step-1 record predates its count
    common.pop("iterations")
    if "iterations_step1" in step1_record:
        common["iterations"] = step1_record["iterations_step1"] + common2["iterations"]
    if common2["status"] != "ok":
        return {"contender": contender.name, "AP": 0.0, "AP50": 0.0, **common}
    recipe = FcosD2Contender(RECIPE, PROTOCOL_BEFORE_ISSUE_60)  # the detector LabelEnc trained
    plain_cfg = recipe.config(seed, folder, opts, regime)
    plain = recipe.build(plain_cfg)
    plain.load_state_dict(fcos_state_dict(step2.state_dict()))  # strict: a plain FCOS
    os.makedirs(folder, exist_ok=True)
    torch.save(plain.state_dict(), os.path.join(folder, "model_final_fcos.pth"))
    return {"contender": contender.name, **protocol.evaluate(plain, plain_cfg), **common}


def run_step2_variant(contender: Step2Variant, seed: int, output_dir: str, opts: Sequence,
                      regime: str = "shapes", step1_from: Optional[str] = None) -> dict:
    """Step 2 of `contender` from the step-1 weights of LABELENC's run with the same seed,
    which must have run first: in the same --output, or in the --output folder
    `step1_from` (an earlier benchmark's, of the same regime)."""
    root = Path(step1_from) if step1_from else Path(output_dir).parents[1]
    problem = missing_step1(root, seed, regime, opts)
    if problem:
        where = f"--step1-from {root}" if step1_from else "--output"
        raise FileNotFoundError(f"{contender.name} seed {seed}: {problem}; run the contender "
                                f"'{LABELENC}' with this seed (and {where}) first")
    record = labelenc_record(root, seed, regime)
    step1_record = {k: record[k] for k in ("final_losses_step1", "step1_AP", "step1_lef_AP",
                                           "train_seconds_step1", "iterations_step1")
                    if k in record}
    return run_step2(contender, contender.step2_overrides, seed, output_dir, opts,
                     str(step1_weights(root, seed)), step1_record, regime)


def step1_weights(root: Path, seed: int) -> Path:
    """Where a benchmark with --output `root` keeps the step-1 weights of LABELENC's run."""
    return root / "runs" / f"{LABELENC}-{seed}" / "step1" / "model_final.pth"


def missing_step1(root: Path, seed: int, regime: str,
                  opts: Optional[Sequence] = None) -> Optional[str]:
    """What the --output folder `root` lacks to start a step-2 variant of `seed` from its
    LABELENC run (its step-1 weights, its record in results.jsonl of `regime`, trained with
    the overrides `opts` if given); None if nothing."""
    weights = step1_weights(root, seed)
    if not weights.is_file():
        return f"no step-1 weights {weights}"
    record = labelenc_record(root, seed, regime)
    if record is None:
        return f"no record of '{LABELENC}' seed {seed} in {root / 'results.jsonl'}"
    return None if opts is None else other_overrides([record], opts)


def labelenc_record(root: Path, seed: int, regime: str) -> Optional[dict]:
    """The record of LABELENC's run of `seed` in `root`/results.jsonl (of `regime`), if any."""
    return next((r for r in checked_results(root / "results.jsonl", regime)
                 if r["contender"] == LABELENC and r["seed"] == seed), None)
