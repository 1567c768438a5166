"""``Predictor``: a trained FCOS from its config, one call from an image to detections.

It does what detectron2's ``DefaultPredictor`` does (build the model, load
``MODEL.WEIGHTS``, resize as the test loader does, map boxes back to the original size),
with three differences: weights load through ``FCOSCheckpointer`` (data-only loading,
URL cache with sha256, an error for weights that do not fit the model, where
``DefaultPredictor`` would silently keep random layers); it takes image paths (read by
fcos-d2's reader: EXIF, 16-bit, errors naming the file) or arrays in ``INPUT.FORMAT``
(``DefaultPredictor`` wants BGR whatever the format); it returns ``Instances`` on the CPU.
"""
import os
from typing import Optional, Union

import numpy as np
import torch
from detectron2.data import transforms as T
from detectron2.modeling import build_model
from detectron2.structures import Instances

from ..checkpoint import FCOSCheckpointer
from ..data.images import read_image
from ..modeling.fast_inference import fast_inference_enabled, inference_model


class Predictor:
    """``Predictor(cfg)(image)`` -> ``Instances`` with ``pred_boxes`` (XYXY pixels of the
    original image), ``scores`` and 0-based ``pred_classes``, best first, on the CPU; a mask
    model's ``pred_masks`` too, (R, H, W) bool in the original image's pixels.

    Args:
        cfg: a config with ``add_fcos_config`` and ``MODEL.WEIGHTS`` set to trained
            weights; ``MODEL.DEVICE`` is where the model runs.
        expected_images: how many images it will be called on, which
            ``MODEL.FCOS.INFERENCE_BACKEND "auto"`` weighs against a compile; None: unknown
            (a predictor kept to serve: compiled where that pays).

    Call:
        image: a path to an image file, or an (H, W, 3) uint8 array in ``INPUT.FORMAT``
            ("BGR" or "RGB").
    """

    def __init__(self, cfg, expected_images: Optional[int] = None):
        if not cfg.MODEL.WEIGHTS:
            raise ValueError("Predictor: MODEL.WEIGHTS is empty; set it to trained weights "
                             "(e.g. output/quickstart/model_final.pth)")
        self.input_format = cfg.INPUT.FORMAT
        model = build_model(cfg).eval()
        FCOSCheckpointer.from_config(cfg, model).load(cfg.MODEL.WEIGHTS)
        # MODEL.FCOS.FAST_INFERENCE: folded BN, channels_last (fcos_d2.modeling.fast_inference)
        self.model = inference_model(model, fast_inference_enabled(cfg)).eval()
        if hasattr(self.model, "expected_images"):
            self.model.expected_images = expected_images or 0  # 0: unknown
        self.resize = T.ResizeShortestEdge([cfg.INPUT.MIN_SIZE_TEST] * 2, cfg.INPUT.MAX_SIZE_TEST)

    def __call__(self, image: Union[str, os.PathLike, np.ndarray]) -> Instances:
        if isinstance(image, (str, os.PathLike)):
            image = read_image(str(image), format=self.input_format)
        elif not (isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] == 3):
            shape = getattr(image, "shape", type(image).__name__)
            raise ValueError(f"Predictor: expected an image path or an (H, W, 3) array in "
                             f"INPUT.FORMAT {self.input_format}, got {shape}")
        height, width = image.shape[:2]
        resized = self.resize.get_transform(image).apply_image(image)
        tensor = torch.as_tensor(resized.astype("float32").transpose(2, 0, 1))  # (3, h, w)
        with torch.no_grad():
            outputs = self.model([{"image": tensor, "height": height, "width": width}])[0]
        return outputs["instances"].to("cpu")
