"""Every contender of the training-quality benchmark by name: the main ones first, then
the one-at-a-time variants (``contender_names``); ``contender(name)`` gives its
``Contender``. The only module that knows both the one-step contenders and LabelEnc's."""
import functools
import importlib.util
from collections import OrderedDict
from typing import Dict, List, Sequence

from benchmarks.train_quality import family, family_designed, labelenc
from benchmarks.train_quality.contenders import (
    DETECTRON2, DETECTRON2_VARIANTS, EVAL_VARIANTS, FASTER_RCNN, OFFICIAL,
    PROTOCOL_BEFORE_ISSUE_60, RECIPE, RECIPE_VARIANTS, SAME_ITERATIONS, SCHEDULES, TORCHVISION,
    VARIANTS, Contender, FasterRCNN, FcosD2Contender, InferenceVariant, OtherFCOS)

# Contenders added with regime 2 or later (Faster R-CNN): in "all" of --regime thin only, so
# that "all" of --regime shapes (make train-quality) stays the measured table; by name in both.
ADDED_WITH_THIN = [f"fcos-d2 {v}" for v in ("ema-momentum-0.99", "prior-0.1", "warmup-200",
                                             "clip-gradients", "atss", "quality-focal")] \
    + [f"{RECIPE}+{v}" for v in RECIPE_VARIANTS] \
    + [f"{DETECTRON2}+{v}" for v in DETECTRON2_VARIANTS] + [FASTER_RCNN]
# --positives without --contenders
POSITIVES_CONTENDERS = ["fcos-d2 official", RECIPE, f"{RECIPE}+center-sampling-1.5",
                        "fcos-d2 atss", f"{RECIPE}+atss-anchors-4"]


@functools.lru_cache(maxsize=None)
def _catalog() -> Dict[str, Contender]:
    """name -> contender, in ``contender_names``'s order."""
    fcos = OrderedDict((f"fcos-d2 {v}", FcosD2Contender(f"fcos-d2 {v}", OFFICIAL + overrides))
                       for v, overrides in VARIANTS.items())
    main = [fcos["fcos-d2 official"], FcosD2Contender(RECIPE), OtherFCOS(DETECTRON2, DETECTRON2),
            OtherFCOS(TORCHVISION, TORCHVISION), FasterRCNN(FASTER_RCNN),
            *(labelenc.LabelEncContender(n, o) for n, o in labelenc.STEP1_VARIANTS.items()
              if n == labelenc.LABELENC),
            FcosD2Contender(SAME_ITERATIONS, PROTOCOL_BEFORE_ISSUE_60,  # LabelEnc's protocol
                            schedule=SCHEDULES[SAME_ITERATIONS]),
            *(labelenc.Step2Variant(n, o) for n, o in labelenc.STEP2_VARIANTS.items()),
            *(labelenc.LabelEncContender(n, o) for n, o in labelenc.STEP1_VARIANTS.items()
              if n != labelenc.LABELENC)]
    variants = [c for n, c in fcos.items() if n != "fcos-d2 official"]
    variants += [InferenceVariant(n, fcos[base], o) for n, (base, o) in EVAL_VARIANTS.items()]
    variants += [FcosD2Contender(f"{RECIPE}+{v}", o) for v, o in RECIPE_VARIANTS.items()]
    variants += [OtherFCOS(f"{DETECTRON2}+{v}", DETECTRON2, o)
                 for v, o in DETECTRON2_VARIANTS.items()]
    variants += family.family_contenders() + family_designed.designed_contenders()
    return OrderedDict((c.name, c) for c in [*main, *variants])


def contender_names() -> List[str]:
    """The main contenders first, then the one-at-a-time variants."""
    return list(_catalog())


def contender(name: str) -> Contender:
    """The contender called `name` (``contender_names``)."""
    if name not in _catalog():
        raise KeyError(f"unknown contender {name!r}; python -m benchmarks.train_quality "
                       "--list prints the names")
    return _catalog()[name]


def contender_overrides(name: str) -> List:
    """The config overrides that make contender `name` from the recipe config."""
    return contender(name).overrides


def contender_cfg(name: str, seed: int, output_dir: str, opts: Sequence = (),
                  labelenc_step: int = 0, regime: str = "shapes"):
    """The config of contender `name` (of LabelEnc's step `labelenc_step` if not 0)."""
    step = labelenc.LABELENC_STEPS.get(labelenc_step, [])
    return contender(name).config(seed, output_dir, opts, regime, step=step)


def build_contender(name: str, cfg):
    """The detector of contender `name` on fcos-d2's backbone for `cfg`."""
    return contender(name).build(cfg)


def inference_variants_of(name: str) -> List[Contender]:
    """The inference-only contenders scored on the weights of `name`'s runs."""
    return [c for c in _catalog().values() if c.trained_by == name]


def family_names() -> List[str]:
    """The contenders of issue 50's and 51's tables (``--contenders family``): FCOS's head,
    detectron2's Faster R-CNN and RetinaNet, NAS-FCOS's and FAD's rows; the NAS-FCOS
    published genotype with its deformable convs only by name (hours on a CPU)."""
    return [family.FCOS_HEAD, FASTER_RCNN, *(c.name for c in family.family_contenders()
                                             if c.name != family.NAS_HEAD_DCN)]


def designed_names() -> List[str]:
    """The rows of the members as designed (``--contenders designed``, issue 62): the
    references first (FCOS on the recipe's levels and on NAS-FCOS's), then
    ``family_designed.MAIN_ROWS`` (the searched and random rows are trained by
    ``search_check compare``'s command)."""
    return [*family_designed.REFERENCES, *family_designed.MAIN_ROWS]


def default_contenders(names: List[str], regime: str) -> List[str]:
    """The contenders of ``--contenders all`` in `regime` among `names` (the family's by
    ``--contenders family`` or ``designed`` only)."""
    members = {c.name for c in family.family_contenders() + family_designed.designed_contenders()}
    return [n for n in names
            if n not in members and (regime != "shapes" or n not in ADDED_WITH_THIN)]


def has_detectron2_fcos() -> bool:
    """Whether the installed detectron2 has the built-in FCOS (v0.6 and main have)."""
    import fcos_d2  # noqa: F401  (before detectron2)

    return importlib.util.find_spec("detectron2.modeling.meta_arch.fcos") is not None
