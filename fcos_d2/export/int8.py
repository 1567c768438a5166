"""int8 ONNX: the whole-detector graph quantized statically by ONNX Runtime.

QDQ format (QuantizeLinear/DequantizeLinear pairs around each quantized op, which
runtimes fuse into int8 kernels), int8 weights per output channel, uint8 activations
per tensor, their ranges calibrated on real images that go through the project's own
test-time mapper (``FCOSDatasetMapper``, resizing as at test time).

Quantized: the backbone, the FPN and the head towers (their convolutions, residual
additions, ReLUs, max pooling and upsampling, so that activations stay int8 between
them; GroupNorm stays float32). The three prediction convolutions of the head (class
logits, box regression, centerness) stay in float32: their outputs are the scores and box
distances that the thresholds, top-k and NMS act on, where one 8-bit step of a box
distance at P7 (stride 128) is pixels wide and one of a logit moves scores across the
threshold; they are a few percent of the compute. Everything after them (scales,
decoding, top-k, NMS) is float32 as in the float graph.

Symbols: N images (1 during calibration), H x W an image.
"""
import itertools
import os
import tempfile
from typing import Dict, Iterable, Iterator, List, Sequence, Tuple

import numpy as np

# Node-name prefixes (torch.onnx names nodes by module path) of the parts quantized, the
# op types quantized there, and the prediction convolutions kept in float32.
INT8_PREFIXES = ("/backbone/", "/head/cls_tower", "/head/bbox_tower", "/head/share_tower")
INT8_OP_TYPES = ("Conv", "Add", "Relu", "MaxPool", "Resize")
FLOAT_PREFIXES = ("/head/cls_logits", "/head/bbox_pred", "/head/centerness")
# Tolerances of the int8 graph's agreement with PyTorch float32 (fcos_d2.export.files.compare):
# a score may move by 0.05, a box coordinate by 4 px; detections scoring below
# INT8_SCORE_FLOOR are left out of the comparison (the many weak ones near the threshold
# come and go with rounding).
INT8_SCORE_TOLERANCE, INT8_BOX_TOLERANCE, INT8_SCORE_FLOOR = 0.05, 4.0, 0.3


def calibration_inputs(dataset_dicts: Sequence[Dict], mapper, num_images: int) -> List[Dict]:
    """The graph's inputs for the first ``num_images`` images of a dataset, one image each.

    Args:
        dataset_dicts: detectron2 dataset dicts (``DatasetCatalog.get(name)``).
        mapper: the test-time mapper, e.g. ``FCOSDatasetMapper(cfg, is_train=False)``.
        num_images: how many; all the dataset has if it has fewer.

    Returns:
        [{"images": (1, 3, H, W) float32, "image_sizes": (1, 2) int64}], numpy arrays.
    """
    if num_images < 1:
        raise ValueError(f"--calibration-images: must be at least 1, got {num_images}")
    inputs = []
    for record in itertools.islice(dataset_dicts, num_images):
        image = mapper(dict(record))["image"]  # (3, H, W) in INPUT.FORMAT, resized
        inputs.append({"images": image.float().numpy()[None],
                       "image_sizes": np.array([image.shape[1:]], dtype=np.int64)})
    if not inputs:
        raise ValueError("calibration: the dataset has no images")
    return inputs


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of input feeds."""

    def __init__(self, feeds: Iterable[Dict[str, np.ndarray]]):
        self._feeds: Iterator = iter(list(feeds))

    def get_next(self):
        return next(self._feeds, None)


def split_nodes(path: str) -> Tuple[List[str], List[str]]:
    """Names of the graph's nodes to quantize, and of its prediction convolutions (kept in
    float32)."""
    import onnx

    graph = onnx.load(path).graph
    quantized = [node.name for node in graph.node
                 if node.op_type in INT8_OP_TYPES and node.name.startswith(INT8_PREFIXES)]
    kept = [node.name for node in graph.node
            if node.op_type == "Conv" and node.name.startswith(FLOAT_PREFIXES)]
    return quantized, kept


def quantize_int8(float_path: str, int8_path: str, feeds: Sequence[Dict[str, np.ndarray]]) -> Dict:
    """Writes the int8 (QDQ) graph of the float graph at ``float_path`` to ``int8_path``.

    Args:
        feeds: calibration inputs (:func:`calibration_inputs`).

    Returns:
        {"quantized_convs": n, "quantized_ops": n, "float_convs": [names kept in float32]}.
    """
    import onnx
    from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as folder:
        # onnxruntime's pre-processing: shapes and folded Identity nodes, so that every
        # conv bias is an initializer (quantized to int32 with its conv)
        prepared = os.path.join(folder, "prepared.onnx")
        quant_pre_process(float_path, prepared, skip_symbolic_shape=True)
        quantized, keep_float = split_nodes(prepared)
        types = {n.name: n.op_type for n in onnx.load(prepared).graph.node}
        quantize_static(prepared, int8_path, _Reader(feeds), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(INT8_OP_TYPES), nodes_to_quantize=quantized,
                        nodes_to_exclude=keep_float, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
    return {"quantized_convs": sum(types[name] == "Conv" for name in quantized),
            "quantized_ops": len(quantized), "float_convs": keep_float}
