"""The FCOS meta-architecture: preprocess -> backbone -> head -> targets and losses in
training, or per-image post-processing in inference. Glue only; the work is done by
``head``, ``assignment``, ``losses`` and ``postprocess``.

``FCOSBase`` is FCOS without a backbone: the head on given features, the training losses
and the detections. The meta-architecture ``FCOS`` adds the backbone and the input
preprocessing; the proposal generator (``proposal_generator.py``) adds class-agnostic
proposals for two-stage models. Both share every option of ``MODEL.FCOS``.

Symbols: N images, L levels, Hi x Wi level sizes, R = sum(Hi * Wi), K classes.
"""
import contextlib
import functools
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from detectron2.modeling import META_ARCH_REGISTRY, build_backbone
from detectron2.modeling.postprocessing import detector_postprocess
from detectron2.structures import ImageList, Instances
from torch import Tensor, nn

from ..precision import CPU_BF16_POLICIES, cpu_autocast_dtype
from .assignment import assign_targets_with_matches, compute_locations, level_size_ranges
from .atss import assign_targets_atss
from .fast_inference import InferenceCopy
from .head import FCOSHead
from .backend_choice import (NO_AMX_COMPILE_MIN_PIXELS, BackendChoice, check_inference_backend,
                             choose_backend)
from .compile_cache import cache_root, is_warm, model_key
from .inference_backends import BackendRunner
from .losses import (CLS_LOSSES, LOC_LOSS_TYPES, LOC_LOSS_WEIGHTINGS, LOSS_NORMALIZERS,
                     EMANormalizer, fcos_losses)
from .postprocess import THRESHOLD_ON, detections_of_candidates, select_candidates_batched

logger = logging.getLogger(__name__)
# MODEL.FCOS.ASSIGNER: who picks the positives (assignment.py or atss.py).
ASSIGNERS = ("fcos", "atss")
# MODEL.FCOS.INFERENCE_DTYPE: the autocast precision of backbone and head at inference.
INFERENCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                    "float16": torch.float16}


@functools.lru_cache(maxsize=None)
def _log_once(message: str, level: int = logging.WARNING) -> None:
    logger.log(level, message)


def flatten_levels(outputs: List[Tensor]) -> Tensor:
    """Per level (N, C, Hi, Wi) -> (N, R, C), locations in the order of compute_locations."""
    return torch.cat([x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, x.shape[1])  # (N, HiWi, C)
                      for x in outputs], dim=1)


class FCOSBase(nn.Module):
    """FCOS after the backbone, configured by ``MODEL.FCOS`` (see ``add_fcos_config``): the
    head on the features ``head_in_features``, training targets and losses, detections.

    Subclasses decide where the features come from and what to return.
    """

    @configurable
    def __init__(
        self,
        *,
        input_shape: Dict[str, ShapeSpec],
        head: FCOSHead,
        head_in_features: Sequence[str],
        num_classes: int,
        sizes_of_interest: Sequence[float] = (64, 128, 256, 512),
        center_sampling_radius: float = 1.5,
        focal_loss_alpha: float = 0.25,
        focal_loss_gamma: float = 2.0,
        loc_loss_type: str = "giou",
        norm_reg_targets: bool = True,
        loss_normalizer: str = "num_pos",
        loss_normalizer_ema: Tuple[float, float] = (300.0, 0.9),
        loc_loss_weighting: str = "centerness",
        iou_loss_smooth: float = 1.0,
        assigner: str = "fcos",
        atss_topk: int = 9,
        atss_anchor_scale: float = 8.0,
        cls_loss: str = "focal",
        score_thresh: float = 0.05,
        score_thresh_on: str = "probability",
        topk_candidates: int = 1000,
        nms_thresh: float = 0.6,
        max_detections_per_image: int = 100,
        inference_dtype: str = "float32",
        cpu_bf16: str = "auto",
        channels_last: bool = False,
        normalize_over_workers: bool = True,
    ):
        """``input_shape``: the features available (a backbone's ``output_shape()``);
        ``normalize_over_workers`` False: the loss normalizers are this worker's own, for a
        model that a worker of a job trains alone (NAS-FCOS's search proxies)."""
        super().__init__()
        missing = [f for f in head_in_features if f not in input_shape]
        if missing:
            raise ValueError(f"MODEL.FCOS.IN_FEATURES: {missing} not produced by the backbone, "
                             f"which gives {sorted(input_shape)}")
        if len(sizes_of_interest) != len(head_in_features) - 1:
            raise ValueError(f"MODEL.FCOS.SIZES_OF_INTEREST: {len(head_in_features)} levels need "
                             f"{len(head_in_features) - 1} boundaries, got {list(sizes_of_interest)}")
        for key, value, allowed in (("LOC_LOSS_TYPE", loc_loss_type, LOC_LOSS_TYPES),
                                    ("LOSS_NORMALIZER", loss_normalizer, LOSS_NORMALIZERS),
                                    ("LOC_LOSS_WEIGHTING", loc_loss_weighting, LOC_LOSS_WEIGHTINGS),
                                    ("ASSIGNER", assigner, ASSIGNERS),
                                    ("CLS_LOSS", cls_loss, CLS_LOSSES),
                                    ("INFERENCE_TH_ON", score_thresh_on, THRESHOLD_ON),
                                    ("INFERENCE_DTYPE", inference_dtype, tuple(INFERENCE_DTYPES)),
                                    ("CPU_BF16", cpu_bf16, CPU_BF16_POLICIES)):
            if value not in allowed:
                raise ValueError(f"MODEL.FCOS.{key}: unknown '{value}', expected one of "
                                 f"{allowed}")
        if iou_loss_smooth < 0:
            raise ValueError(f"MODEL.FCOS.IOU_LOSS_SMOOTH: must be >= 0, got {iou_loss_smooth}")
        if atss_topk < 1:
            raise ValueError(f"MODEL.FCOS.ATSS_TOPK: must be >= 1, got {atss_topk}")
        if atss_anchor_scale <= 0:
            raise ValueError(f"MODEL.FCOS.ATSS_ANCHOR_SCALE: must be > 0, got {atss_anchor_scale}")
        self.head = head
        self.head_in_features = list(head_in_features)
        self.strides = [input_shape[f].stride for f in head_in_features]
        self.num_classes = num_classes
        self.size_ranges = level_size_ranges(sizes_of_interest)
        self.center_sampling_radius = center_sampling_radius
        self.focal_loss_alpha, self.focal_loss_gamma = focal_loss_alpha, focal_loss_gamma
        self.loc_loss_type = loc_loss_type
        self.norm_reg_targets = norm_reg_targets
        self.loss_normalizer = EMANormalizer(*loss_normalizer_ema) if loss_normalizer == "ema" \
            else None
        self.normalize_over_workers = normalize_over_workers
        self.loc_loss_weighting, self.iou_loss_smooth = loc_loss_weighting, iou_loss_smooth
        self.assigner, self.atss_topk, self.cls_loss = assigner, atss_topk, cls_loss
        self.atss_anchor_scale = atss_anchor_scale
        self.score_thresh, self.topk_candidates = score_thresh, topk_candidates
        self.score_thresh_on = score_thresh_on
        self.nms_thresh, self.max_detections_per_image = nms_thresh, max_detections_per_image
        self.inference_dtype = INFERENCE_DTYPES[inference_dtype]
        self.cpu_bf16 = cpu_bf16
        self.channels_last = channels_last
        if channels_last:  # 4-D weights only; loading a checkpoint copies into this layout
            self.to(memory_format=torch.channels_last)

    @classmethod
    def from_config(cls, cfg, input_shape: Dict[str, ShapeSpec]):
        fcos = cfg.MODEL.FCOS
        return {
            "input_shape": input_shape,
            "head": cls.build_head(cfg, [input_shape[f] for f in fcos.IN_FEATURES
                                         if f in input_shape], input_shape),
            "head_in_features": fcos.IN_FEATURES,
            "num_classes": fcos.NUM_CLASSES,
            "sizes_of_interest": fcos.SIZES_OF_INTEREST,
            "center_sampling_radius": fcos.CENTER_SAMPLING_RADIUS,
            "focal_loss_alpha": fcos.FOCAL_LOSS_ALPHA,
            "focal_loss_gamma": fcos.FOCAL_LOSS_GAMMA,
            "loc_loss_type": fcos.LOC_LOSS_TYPE,
            "norm_reg_targets": fcos.NORM_REG_TARGETS,
            "loss_normalizer": fcos.LOSS_NORMALIZER,
            "loss_normalizer_ema": (fcos.LOSS_NORMALIZER_EMA_INIT,
                                    fcos.LOSS_NORMALIZER_EMA_MOMENTUM),
            "loc_loss_weighting": fcos.LOC_LOSS_WEIGHTING,
            "iou_loss_smooth": fcos.IOU_LOSS_SMOOTH,
            "assigner": fcos.ASSIGNER,
            "atss_topk": fcos.ATSS_TOPK,
            "atss_anchor_scale": fcos.ATSS_ANCHOR_SCALE,
            "cls_loss": fcos.CLS_LOSS,
            "score_thresh": fcos.INFERENCE_TH_TEST,
            "score_thresh_on": fcos.INFERENCE_TH_ON,
            "topk_candidates": fcos.PRE_NMS_TOPK_TEST,
            "nms_thresh": fcos.NMS_TH_TEST,
            "max_detections_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
            "inference_dtype": fcos.INFERENCE_DTYPE,
            "cpu_bf16": fcos.CPU_BF16,
            "channels_last": fcos.CHANNELS_LAST,
        }

    @classmethod
    def build_head(cls, cfg, input_shape: List[ShapeSpec],
                   features: Optional[Dict[str, ShapeSpec]] = None) -> nn.Module:
        """The head on the features ``input_shape`` (models built on FCOS return theirs);
        ``features``: all the backbone gives, for heads that read more than their levels."""
        return FCOSHead(cfg, input_shape)

    def regression_in_pixels(self, regression: List[Tensor]) -> List[Tensor]:
        """The head's per-level (l, t, r, b) in pixels (it predicts stride units when
        ``norm_reg_targets``)."""
        if not self.norm_reg_targets:
            return regression
        return [r * s for r, s in zip(regression, self.strides)]

    def losses(self, locations: List[Tensor], instances: List[Instances], logits: List[Tensor],
               regression: List[Tensor], centerness: List[Tensor]) -> Dict[str, Tensor]:
        """Training targets for the batch, then the three losses."""
        labels, reg_targets, _ = self.targets(locations, instances)
        return self.box_losses(labels, reg_targets, logits, regression, centerness)

    def targets(self, locations: List[Tensor],
                instances: List[Instances]) -> Tuple[Tensor, Tensor, Tensor]:
        """labels (N, R), regression targets (N, R, 4) and matched box indices (N, R) of
        the batch (``assign_targets_with_matches``, or ``assign_targets_atss`` with the
        "atss" assigner)."""
        boxes = [x.gt_boxes.tensor for x in instances]
        classes = [x.gt_classes for x in instances]
        if self.assigner == "atss":
            return assign_targets_atss(locations, boxes, classes, strides=self.strides,
                                       topk=self.atss_topk, num_classes=self.num_classes,
                                       norm_reg_targets=self.norm_reg_targets,
                                       anchor_scale=self.atss_anchor_scale)
        return assign_targets_with_matches(
            locations, boxes, classes,
            strides=self.strides, size_ranges=self.size_ranges,
            center_sampling_radius=self.center_sampling_radius, num_classes=self.num_classes,
            norm_reg_targets=self.norm_reg_targets)

    def box_losses(self, labels: Tensor, reg_targets: Tensor, logits: List[Tensor],
                   regression: List[Tensor], centerness: List[Tensor]) -> Dict[str, Tensor]:
        """The three FCOS losses for given targets (shapes as :meth:`targets` returns)."""
        return fcos_losses(
            logits=flatten_levels(logits), reg_pred=flatten_levels(regression),
            ctr_logits=flatten_levels(centerness)[..., 0], labels=labels,
            reg_targets=reg_targets, num_classes=self.num_classes,
            focal_alpha=self.focal_loss_alpha, focal_gamma=self.focal_loss_gamma,
            loc_loss_type=self.loc_loss_type, loc_weighting=self.loc_loss_weighting,
            iou_smooth=self.iou_loss_smooth, normalizer=self.loss_normalizer,
            cls_loss=self.cls_loss, over_workers=self.normalize_over_workers)

    def inference(self, locations: List[Tensor], image_sizes: List[Tuple[int, int]],
                  logits: List[Tensor], regression: List[Tensor],
                  centerness: List[Tensor]) -> List[Instances]:
        """Per image detections in the (unpadded) input size."""
        return self.select(locations, image_sizes, logits, regression, centerness,
                           score_thresh=self.score_thresh, topk_candidates=self.topk_candidates,
                           nms_thresh=self.nms_thresh, max_detections=self.max_detections_per_image)

    def select(self, locations: List[Tensor], image_sizes: List[Tuple[int, int]],
               logits: List[Tensor], regression: List[Tensor], centerness: List[Tensor], *,
               score_thresh: float, topk_candidates: int, nms_thresh: float,
               max_detections: int) -> List[Instances]:
        """``postprocess_image`` on every image with these thresholds; per level ``logits``
        (N, K', Hi, Wi) may have any K' (the proposal generator passes K' = 1). Computed in
        float32 whatever precision the head ran in."""
        return [result for result, _ in self.select_with_locations(
            locations, image_sizes, logits, regression, centerness, score_thresh=score_thresh,
            topk_candidates=topk_candidates, nms_thresh=nms_thresh,
            max_detections=max_detections)]

    def select_with_locations(
        self, locations: List[Tensor], image_sizes: List[Tuple[int, int]],
        logits: List[Tensor], regression: List[Tensor], centerness: List[Tensor], *,
        score_thresh: float, topk_candidates: int, nms_thresh: float, max_detections: int,
    ) -> List[Tuple[Instances, Tensor]]:
        """:meth:`select`, with each detection's location index (D,) among the R locations
        of all levels: ``postprocess_image_with_locations`` on every image, its candidate
        selection batched (``select_candidates_batched``: two host syncs per batch)."""
        logits, regression, centerness = ([x.float() for x in outputs]
                                          for outputs in (logits, regression, centerness))
        regression = self.regression_in_pixels(regression)
        per_level = lambda outputs: [x.flatten(2).transpose(1, 2) for x in outputs]  # (N, HiWi, C)
        logits, regression, centerness = map(per_level, (logits, regression, centerness))
        candidates = select_candidates_batched(
            logits, regression, [x[..., 0] for x in centerness], locations,
            score_thresh=score_thresh, topk=topk_candidates, threshold_on=self.score_thresh_on)
        return [detections_of_candidates(*image_candidates, image_size, nms_thresh=nms_thresh,
                                         max_detections=max_detections)
                for image_candidates, image_size in zip(candidates, image_sizes)]


@META_ARCH_REGISTRY.register()
class FCOS(FCOSBase):
    """FCOS (Tian et al., 2019), configured by ``MODEL.FCOS`` (see ``add_fcos_config``).

    Input: detectron2's list of dicts, each with "image" (C, H, W) in ``input_format`` and,
    in training, "instances" with ``gt_boxes`` and 0-based ``gt_classes``.
    Output: in training, a dict of losses; in inference, per image {"instances": Instances}
    with ``pred_boxes``, ``scores`` and ``pred_classes``, in the original image size.

    In eval mode, with ``fast_inference``, it runs its folded channels_last copy
    (``fast_inference.InferenceCopy``), rebuilt when its weights change; ``state_dict()``
    and training see only the unfolded weights.
    """

    @configurable
    def __init__(
        self,
        *,
        backbone: nn.Module,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        input_format: str = "BGR",
        fast_inference: bool = True,
        inference_backend: str = "auto",
        compile_cache_dir: str = "",
        size_buckets: int = 8,
        compile_freeze: bool = True,
        **options,
    ):
        """``fast_inference``: run the folded channels_last copy in eval mode.
        ``inference_backend``: how backbone and head run in eval mode (``INFERENCE_BACKENDS``
        of ``backend_choice.py``); ``compile_cache_dir``, ``size_buckets``,
        ``compile_freeze``: the compiled backends' cache folder, size buckets per octave and
        frozen weights (``inference_backends.py``).
        ``options``: the keyword arguments of ``FCOSBase`` but ``input_shape``, which is the
        backbone's."""
        super().__init__(input_shape=backbone.output_shape(), **options)
        self.backbone = backbone
        # The backbone's parameters first, as before FCOSBase existed, so that parameter
        # order, and with it optimizer state saved in older checkpoints, stays the same.
        self._modules = {"backbone": self._modules.pop("backbone"), **self._modules}
        self.input_format = input_format
        self.fast_inference = fast_inference
        self.inference_copy = InferenceCopy()  # no submodule: not in state_dict
        self.inference_backend = check_inference_backend(inference_backend)
        self.backend_runner: Optional[BackendRunner] = None  # built on first use
        self.compile_cache_dir, self.size_buckets = compile_cache_dir, size_buckets
        self.compile_freeze = compile_freeze
        # Images the caller has ahead, which "auto" weighs against a compile; 0: unknown, a
        # model kept loaded to serve (Predictor, DefaultPredictor). Entry points set it.
        self.expected_images = 0
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(-1, 1, 1), False)
        if self.channels_last:  # FCOSBase converted the head; now the backbone too
            self.backbone.to(memory_format=torch.channels_last)

    @classmethod
    def from_config(cls, cfg):
        backbone = build_backbone(cfg)
        options = super().from_config(cfg, backbone.output_shape())
        del options["input_shape"]
        return {
            **options,
            "backbone": backbone,
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
            "input_format": cfg.INPUT.FORMAT,
            "fast_inference": cfg.MODEL.FCOS.FAST_INFERENCE,
            "inference_backend": cfg.MODEL.FCOS.INFERENCE_BACKEND,
            "compile_cache_dir": cfg.MODEL.FCOS.COMPILE_CACHE_DIR,
            "size_buckets": cfg.MODEL.FCOS.INFERENCE_SIZE_BUCKETS,
            "compile_freeze": cfg.MODEL.FCOS.COMPILE_FREEZE_WEIGHTS,
        }

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    def preprocess_image(self, batched_inputs: List[Dict]) -> ImageList:
        images = [(x["image"].to(self.device) - self.pixel_mean) / self.pixel_std
                  for x in batched_inputs]
        images = ImageList.from_tensors(images, self.backbone.size_divisibility)
        if self.channels_last:
            images.tensor = images.tensor.contiguous(memory_format=torch.channels_last)
        return images

    def forward_head(self, images: ImageList) -> Tuple[List[Tensor], List[Tensor], List[Tensor]]:
        """Backbone and head on a padded batch: per level logits, regression, centerness."""
        features = self.backbone(images.tensor)
        return self.head([features[f] for f in self.head_in_features])

    def train(self, mode: bool = True) -> "FCOS":
        if mode:  # training changes the weights: free the inference copy's memory
            self.inference_copy.clear()
        return super().train(mode)

    def forward(self, batched_inputs: List[Dict]):
        fast = None if self.training or not self.fast_inference else self.inference_copy.of(self)
        if fast is not None:
            return fast(batched_inputs)
        images = self.preprocess_image(batched_inputs)
        choice = None if self.training else self.backend_choice(images.tensor.shape[-2:])
        runner = None if choice is None else self.compiled_backend(choice)
        if runner is not None:  # MODEL.FCOS.INFERENCE_BACKEND
            logits, regression, centerness = runner(self, images)
        else:
            with self._inference_autocast(None if choice is None else choice.dtype):
                logits, regression, centerness = self.forward_head(images)
        if self.training:
            if "instances" not in batched_inputs[0]:
                raise ValueError("FCOS in training mode needs 'instances' in every input dict")
            locations = compute_locations([x.shape[-2:] for x in logits], self.strides,
                                          self.device)
            instances = [x["instances"].to(self.device) for x in batched_inputs]
            return self.losses(locations, instances, logits, regression, centerness)
        return self.detections(batched_inputs, images, logits, regression, centerness)

    def detections(self, batched_inputs: List[Dict], images: ImageList, logits: List[Tensor],
                   regression: List[Tensor], centerness: List[Tensor]) -> List[Dict]:
        """The head's per-level outputs on the padded ``images`` decoded, selected and
        resized to each input's "height" x "width" (detectron2's ``detector_postprocess``):
        one {"instances": Instances} per input."""
        locations = compute_locations([x.shape[-2:] for x in logits], self.strides, self.device)
        results = self.inference(locations, images.image_sizes, logits, regression, centerness)
        return [
            {"instances": detector_postprocess(r, x.get("height", size[0]), x.get("width", size[1]))}
            for r, x, size in zip(results, batched_inputs, images.image_sizes)
        ]

    def backend_choice(self, size: Optional[Sequence[int]] = None) -> BackendChoice:
        """What runs backbone and head in eval mode (``backend_choice.choose_backend``), for
        this device, the work ahead and the padded input ``size`` (H, W), said once per
        process and reason in the log."""
        pixels = None if size is None else int(size[0]) * int(size[1])
        # only whether the input is large counts (CPUs without AMX), not each size
        large = pixels is not None and pixels >= NO_AMX_COMPILE_MIN_PIXELS
        asked = (self.inference_backend, self.device.type, self.expected_images, large)
        if getattr(self, "_choice", (None,))[0] != asked:
            warm = self.inference_backend == "auto" and is_warm(
                cache_root(self.compile_cache_dir), model_key(self, "bf16_compiled"))
            self._choice = (asked, choose_backend(*asked[:2], self.expected_images or None,
                                                  warm=warm, pixels=pixels))
        choice = self._choice[1]
        if choice.reason:
            _log_once(choice.reason, logging.WARNING if choice.warning else logging.INFO)
        return choice

    def compiled_backend(self, choice: BackendChoice) -> Optional[BackendRunner]:
        """The runner of ``choice``'s compiled backend, kept while it stays the same."""
        if choice.backend == "eager":
            return None
        if self.backend_runner is None or self.backend_runner.backend != choice.backend:
            self.backend_runner = BackendRunner(choice.backend)
        return self.backend_runner

    def _inference_autocast(self, dtype: Optional[torch.dtype] = None):
        """Autocast to ``dtype`` ("auto"'s choice; default ``inference_dtype``) at inference;
        training precision is the trainer's (SOLVER.AMP.ENABLED)."""
        dtype = self.inference_dtype if dtype is None else dtype
        if self.device.type == "cpu":  # bf16 only where the CPU has it (MODEL.FCOS.CPU_BF16)
            dtype = cpu_autocast_dtype(dtype, self.cpu_bf16, what="inference",
                                       key="MODEL.FCOS.INFERENCE_DTYPE")
        if self.training or dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)
