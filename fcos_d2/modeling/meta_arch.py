"""The FCOS meta-architecture: preprocess -> backbone -> head -> targets and losses in
training, or per-image post-processing in inference. Glue only: the head, targets, losses
and detections are ``FCOSBase``'s (``fcos_base.py``, FCOS without a backbone, shared with
the proposal generator); this module adds the backbone, the input preprocessing and the
inference paths (fast copy, ``INFERENCE_BACKEND``). Both share every option of
``MODEL.FCOS``.

Symbols: N images, L levels, Hi x Wi level sizes, R = sum(Hi * Wi), K classes.
"""
import contextlib
import functools
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from detectron2.config import configurable
from detectron2.modeling import META_ARCH_REGISTRY, build_backbone
from detectron2.modeling.postprocessing import detector_postprocess
from detectron2.structures import ImageList
from torch import Tensor, nn

from ..precision import cpu_autocast_dtype
from .assignment import compute_locations
from .backend_choice import (BackendChoice, check_inference_backend, choose_backend,
                             no_amx_images_needed)
from .compile_cache import cache_root, is_warm, model_key
from .fast_inference import InferenceCopy
from .fcos_base import ASSIGNERS, INFERENCE_DTYPES, FCOSBase, flatten_levels  # noqa: F401
from .inference_backends import BackendRunner

__all__ = ["ASSIGNERS", "FCOS", "FCOSBase", "INFERENCE_DTYPES", "flatten_levels"]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _log_once(message: str, level: int = logging.WARNING) -> None:
    logger.log(level, message)


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
        # only the input's size class counts (CPUs without AMX), not each size
        asked = (self.inference_backend, self.device.type, self.expected_images,
                 no_amx_images_needed(pixels))
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
