"""The exported whole-detector graph run by onnxruntime behind FCOS's inference interface,
so that detectron2's test loader and evaluators (``inference_on_dataset``) run it as they
run the PyTorch model.
"""
from typing import Dict, List, Optional

import numpy as np
import torch
from detectron2.modeling.postprocessing import detector_postprocess
from detectron2.structures import Boxes, Instances

from .files import pad_batch
from .onnx_graph import ITERATION_KEY, split_by_image


class ONNXRuntimeDetector:
    """Callable like ``FCOS`` in eval mode: a list of detectron2 dicts, each with "image"
    (3, H, W) in ``INPUT.FORMAT`` (already resized by the test loader) and optionally the
    original "height" and "width" -> per image {"instances": Instances} with
    ``pred_boxes``, ``scores``, ``pred_classes`` in the original size, rescaled by
    detectron2's ``detector_postprocess`` as ``FCOS.forward`` does.

    Args:
        path: the ONNX file written by ``tools/export_onnx.py`` (whole detector).
        threads: onnxruntime's intra-op threads; 0 for its default.
    """

    def __init__(self, path: str, threads: int = 0):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(path, options,
                                                    providers=["CPUExecutionProvider"])
        names = [x.name for x in self.session.get_inputs()]
        if names != ["images", "image_sizes"]:
            raise ValueError(f"{path}: inputs {names} are not those of the whole-detector graph "
                             "(images, image_sizes); export it without --dense")
        uint8 = self.session.get_inputs()[0].type == "tensor(uint8)"
        self.input_dtype = np.uint8 if uint8 else np.float32

    @property
    def iterations_trained(self) -> Optional[int]:
        """The training iterations of the exported weights, if the export recorded them."""
        value = self.session.get_modelmeta().custom_metadata_map.get(ITERATION_KEY)
        return int(value) if value else None

    def __call__(self, batched_inputs: List[Dict]) -> List[Dict[str, Instances]]:
        images, sizes = pad_batch([x["image"] for x in batched_inputs])
        outputs = self.session.run(None, {"images": images.numpy().astype(self.input_dtype),
                                          "image_sizes": sizes.numpy()})
        results = []
        for (boxes, scores, classes), x, (height, width) in zip(
                split_by_image(outputs, len(batched_inputs)), batched_inputs, sizes.tolist()):
            instances = Instances((height, width), pred_boxes=Boxes(torch.from_numpy(boxes)),
                                  scores=torch.from_numpy(scores),
                                  pred_classes=torch.from_numpy(classes))
            results.append({"instances": detector_postprocess(
                instances, x.get("height", height), x.get("width", width))})
        return results
