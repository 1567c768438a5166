"""``Predictor``: a trained FCOS from its config, one call from an image to detections.

detectron2's ``DefaultPredictor`` does the work (builds the model, loads
``MODEL.WEIGHTS``, resizes as the test loader does, maps boxes back to the original
size). It takes only BGR arrays, whatever ``INPUT.FORMAT`` says, and returns a dict;
``Predictor`` adds image paths, arrays in ``INPUT.FORMAT``, a check of the array, and
returns the ``Instances`` on the CPU.
"""
import os
from typing import Union

import numpy as np
from detectron2.data.detection_utils import read_image
from detectron2.structures import Instances


class Predictor:
    """``Predictor(cfg)(image)`` -> ``Instances`` with ``pred_boxes`` (XYXY pixels of the
    original image), ``scores`` and 0-based ``pred_classes``, best first, on the CPU.

    Args:
        cfg: a config with ``add_fcos_config`` and ``MODEL.WEIGHTS`` set to trained
            weights; ``MODEL.DEVICE`` is where the model runs.

    Call:
        image: a path to an image file, or an (H, W, 3) uint8 array in ``INPUT.FORMAT``
            ("BGR" or "RGB").
    """

    def __init__(self, cfg):
        # detectron2.engine is imported here, not at `import fcos_d2`: it is heavy.
        from detectron2.engine import DefaultPredictor

        if not cfg.MODEL.WEIGHTS:
            raise ValueError("Predictor: MODEL.WEIGHTS is empty; set it to trained weights "
                             "(e.g. output/quickstart/model_final.pth)")
        self.input_format = cfg.INPUT.FORMAT
        self.default_predictor = DefaultPredictor(cfg)
        self.model = self.default_predictor.model

    def __call__(self, image: Union[str, os.PathLike, np.ndarray]) -> Instances:
        if isinstance(image, (str, os.PathLike)):
            image = read_image(str(image), format=self.input_format)
        elif not (isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] == 3):
            shape = getattr(image, "shape", type(image).__name__)
            raise ValueError(f"Predictor: expected an image path or an (H, W, 3) array in "
                             f"INPUT.FORMAT {self.input_format}, got {shape}")
        bgr = image[:, :, ::-1] if self.input_format == "RGB" else image  # DefaultPredictor
        return self.default_predictor(bgr)["instances"].to("cpu")  # takes BGR
