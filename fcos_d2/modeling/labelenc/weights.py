"""LabelEnc's weight files: step 1's weights into step 2, the official step-1 layout, and
the plain FCOS weights of a LabelEnc checkpoint.

The official step 1 saves ``label_encoding_function.pth``: {"label_encoding_function": the
LEF's state dict (``body.*`` the encoder, ``fpn.*`` its FPN), "rpn": the FCOS head's
(``head.*``), "roi_heads": two-stage models only}. Mapping to fcos-d2 (LabelEnc's
``label_encoder.`` prefix; FPN and head as ``fcos_d2.checkpoint.official``):

| official (label_encoding_function / rpn) | fcos-d2                                      |
| ---------------------------------------- | -------------------------------------------- |
| body.stage1.*                            | label_encoder.bottom_up.stem.*               |
| body.stage{s}.con{j}.*  (a single block) | label_encoder.bottom_up.res{s}.0.conv{j}.*   |
| body.stage{s}.{i}.con{j}.*               | label_encoder.bottom_up.res{s}.{i}.conv{j}.* |
| body.stage{s}[.{i}].downsample.0.weight  | label_encoder.bottom_up.res{s}.{i}.shortcut.weight |
| fpn.fpn_inner{n}.*                       | label_encoder.fpn_lateral{n+1}.*             |
| fpn.fpn_layer{n}.*                       | label_encoder.fpn_output{n+1}.*              |
| fpn.top_blocks.p6/p7.*                   | label_encoder.top_block.p6/p7.*              |
| head.* (rpn)                             | head.*                                       |
"""
from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from ...checkpoint.official import CheckpointMismatchError, convert_official_key, rename_by_rules

LEF_PREFIX, ADAPTER_PREFIX, HEAD_PREFIX = "label_encoder.", "adapter.", "head."
BOTTOM_UP_PREFIX = "backbone.bottom_up."
OFFICIAL_KEYS = ("label_encoding_function", "rpn", "roi_heads")

_BODY_RULES: List[Tuple[str, Any]] = [
    (r"^body\.stage1\.(weight|bias)$", r"bottom_up.stem.\1"),
    (r"^body\.stage([2-5])\.(?:(\d+)\.)?con([1-3])\.(weight|bias)$",
     lambda m: f"bottom_up.res{m[1]}.{m[2] or 0}.conv{m[3]}.{m[4]}"),
    (r"^body\.stage([2-5])\.(?:(\d+)\.)?downsample\.0\.weight$",
     lambda m: f"bottom_up.res{m[1]}.{m[2] or 0}.shortcut.weight"),
]


def convert_official_lef_key(key: str) -> str:
    """The fcos-d2 name (``label_encoder.*``) of a key of the official
    "label_encoding_function" state dict, or raises KeyError."""
    if key.startswith("fpn."):  # as the detector's FPN in official checkpoints
        return LEF_PREFIX + convert_official_key("backbone." + key)[len("backbone."):]
    return LEF_PREFIX + rename_by_rules(key, _BODY_RULES)


def convert_official_labelenc(data: Dict[str, Any]) -> Dict[str, Tensor]:
    """The fcos-d2 weights (``label_encoder.*``, ``head.*``) of an official
    ``label_encoding_function.pth`` (loaded).

    Raises:
        CheckpointMismatchError: a top-level key is missing or unknown, "roi_heads" holds
            weights (a two-stage model's file; FCOS has no ROI heads), or keys have no
            fcos-d2 name (all listed).
    """
    missing = [k for k in OFFICIAL_KEYS[:2] if k not in data]
    unexpected = [k for k in data if k not in OFFICIAL_KEYS]
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"not an official LabelEnc step-1 file: top-level keys missing {missing}, "
            f"unexpected {unexpected} (expected {list(OFFICIAL_KEYS)}, roi_heads optional)")
    if data.get("roi_heads"):
        raise CheckpointMismatchError(
            f"'roi_heads' holds {len(data['roi_heads'])} tensors: a step-1 file of a two-stage "
            "model (Faster R-CNN); FCOS needs the file of an fcos_* config")
    converted, unknown = {}, []
    for source, convert in (("label_encoding_function", convert_official_lef_key),
                            ("rpn", lambda k: convert_official_key("rpn." + k))):
        for key, value in data[source].items():
            try:
                converted[convert(key)] = value.float() if value.is_floating_point() else value
            except KeyError:
                unknown.append(f"{source}/{key}")
    if unknown:
        raise CheckpointMismatchError(f"{len(unknown)} keys of the official LabelEnc file have "
                                      f"no fcos-d2 name: {', '.join(unknown)}")
    return converted


def check_matches(own: Dict[str, Tensor], state: Dict[str, Tensor], what: str) -> None:
    """Raises CheckpointMismatchError naming ``what`` and listing every key of ``state``
    missing, unexpected or of another shape than in ``own``."""
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(own)
              if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise CheckpointMismatchError(
            f"{what} does not match the model:\n  missing ({len(missing)}): "
            f"{', '.join(missing) or '-'}\n  unexpected ({len(unexpected)}): "
            f"{', '.join(unexpected) or '-'}\n  shapes (file vs model; are "
            f"MODEL.LABELENC.LEF_WIDTH/LEF_DEPTH, MODEL.FPN, MODEL.FCOS as in step 1?): "
            f"{', '.join(shapes) or '-'}")


def _with_prefix(state: Dict[str, Tensor], prefix: str) -> Dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def init_step2_from_step1(model: nn.Module, path: str, *, backbone_from_step1: bool = False
                          ) -> None:
    """Step 2's start: the LEF and the head from the step-1 file ``path`` (fcos-d2's step-1
    checkpoint, or an official ``label_encoding_function.pth``), the detector's FPN (and
    P6/P7) from the LEF's; with ``backbone_from_step1`` (MODEL.LABELENC.STEP2_BACKBONE
    "step1") also the detector's bottom-up backbone from step 1's detector.

    Raises:
        ValueError: no path (MODEL.LABELENC.WEIGHTS).
        CheckpointMismatchError: naming ``path`` and every key that does not fit.
    """
    from ...checkpoint.safe_load import load_model_state_dict

    if not path:
        raise ValueError("MODEL.LABELENC.WEIGHTS: step 2 needs the step-1 weights (step 1's "
                         "model_final.pth or an official label_encoding_function.pth)")
    state = load_model_state_dict(path)
    official = "label_encoding_function" in state
    if official and backbone_from_step1:
        raise CheckpointMismatchError(
            f"{path}: MODEL.LABELENC.STEP2_BACKBONE 'step1' needs step 1's detector, which an "
            "official label_encoding_function.pth does not hold; use fcos-d2's step-1 "
            "model_final.pth, or STEP2_BACKBONE 'weights'")
    if official:
        state = convert_official_labelenc(state)
    parts = [(model.label_encoder, LEF_PREFIX, "the label encoder"),
             (model.head, HEAD_PREFIX, "the head")]
    if backbone_from_step1:
        parts.append((model.backbone.bottom_up, BOTTOM_UP_PREFIX, "the detector's backbone"))
    for module, prefix, part in parts:
        part_state = _with_prefix(state, prefix)
        check_matches(module.state_dict(), part_state,
                       f"{path} (MODEL.LABELENC.WEIGHTS): {part}")
        module.load_state_dict(part_state)
    is_fpn = lambda key: not key.startswith("bottom_up.")  # noqa: E731
    fpn = {k: v for k, v in model.label_encoder.state_dict().items() if is_fpn(k)}
    check_matches({k: v for k, v in model.backbone.state_dict().items() if is_fpn(k)}, fpn,
                   f"{path}: the LEF's FPN, copied into the detector's")
    model.backbone.load_state_dict(fpn, strict=False)


def fcos_state_dict(state: Dict[str, Tensor],
                    prefixes: Sequence[str] = (LEF_PREFIX, ADAPTER_PREFIX)) -> Dict[str, Tensor]:
    """A LabelEnc model's weights without the LEF and the adapter: a plain FCOS's."""
    return {k: v for k, v in state.items() if not k.startswith(tuple(prefixes))}
