"""Writing the exported detector (ONNX graph, TorchScript file) and checking a runtime's
detections against PyTorch's.

Symbols: N images, D detections.
"""
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..modeling.layers import DeformConv2d
from ..modeling.meta_arch import FCOS
from . import matching
from .onnx_graph import (INPUT_NAMES, ITERATION_KEY, OUTPUT_NAMES, FCOSDetectorGraph,
                         split_by_image)

INPUT_DTYPES = {"float32": torch.float32, "uint8": torch.uint8}
# Tolerances of the agreement check (and of the tests): scores, box coordinates in pixels.
SCORE_TOLERANCE, BOX_TOLERANCE = 1e-4, 0.01

Detections = matching.Detections  # boxes (D, 4), scores (D,), classes (D,)


def pad_batch(images: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """(3, h_i, w_i) images -> the graph's inputs: images (N, 3, H, W), each at the
    top-left of a zero batch as large as the largest image, and image_sizes (N, 2) int64."""
    height = max(x.shape[1] for x in images)
    width = max(x.shape[2] for x in images)
    batch = images[0].new_zeros((len(images), 3, height, width))
    for i, image in enumerate(images):
        batch[i, :, :image.shape[1], :image.shape[2]] = image
    return batch, torch.tensor([list(x.shape[1:]) for x in images], dtype=torch.int64)


def sample_inputs(dtype: torch.dtype = torch.float32, size: Tuple[int, int] = (192, 256),
                  seed: int = 0) -> Tuple[Tensor, Tensor]:
    """Two random images of different sizes, padded: the example inputs to trace with
    (two, so that no size-1 batch is baked into the graph)."""
    generator = torch.Generator().manual_seed(seed)
    height, width = size
    images = [torch.randint(0, 256, (3, h, w), generator=generator).to(dtype)
              for h, w in ((height, width), (height - 31, width - 45))]
    return pad_batch(images)


class UnsupportedOperationError(ValueError):
    """The model holds an operation ONNX cannot express."""


def check_onnx_exportable(model: torch.nn.Module) -> None:
    """Raises UnsupportedOperationError naming the deformable convs of ``model``: ONNX has
    no operator for ``torchvision::deform_conv2d`` (DCNv2) in any opset torch exports."""
    deformable = [name for name, m in model.named_modules() if isinstance(m, DeformConv2d)]
    if deformable:
        shown = ", ".join(deformable[:3]) + (" ..." if len(deformable) > 3 else "")
        raise UnsupportedOperationError(
            f"ONNX export: the model has {len(deformable)} deformable convs "
            f"(torchvision::deform_conv2d, DCNv2: {shown}), an operation ONNX cannot express; "
            f"export a model without them (e.g. MODEL.FCOS.USE_DEFORMABLE False, or genotypes "
            f"without def_conv_3x3) or run it with PyTorch (fcos_d2.Predictor)")


def export_onnx(model: FCOS, path: str, *, opset: int = 17, input_dtype: str = "float32",
                iterations: Optional[int] = None) -> None:
    """Writes the whole detector (``FCOSDetectorGraph``) as one ONNX graph with dynamic
    N, H, W and D; ``iterations`` (of training, if known) goes into its metadata, for
    ``tools/test_onnx.py``'s summary."""
    if input_dtype not in INPUT_DTYPES:
        raise ValueError(f"input dtype '{input_dtype}': expected one of {sorted(INPUT_DTYPES)}")
    check_onnx_exportable(model)
    graph = FCOSDetectorGraph(model.eval()).eval()
    dynamic_axes = {"images": {0: "N", 2: "H", 3: "W"}, "image_sizes": {0: "N"},
                    **{name: {0: "D"} for name in OUTPUT_NAMES}}
    with torch.no_grad(), warnings.catch_warnings():
        # detectron2's Conv2d and the shape arithmetic warn that tracing may bake values
        # in; the agreement check at other sizes is what shows it did not.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(graph, sample_inputs(INPUT_DTYPES[input_dtype]), path,
                          input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                          opset_version=opset, dynamic_axes=dynamic_axes, dynamo=False)
    if iterations is not None:
        import onnx

        graph_file = onnx.load(path)
        onnx.helper.set_model_props(graph_file, {ITERATION_KEY: str(iterations)})
        onnx.save(graph_file, path)


def trace_torchscript(model: FCOS, path: str, input_dtype: str = "float32") -> None:
    """Writes the same whole-detector module as a traced TorchScript file; loading it
    needs torch and torchvision (for ``torchvision::nms``), not fcos_d2 or detectron2."""
    graph = FCOSDetectorGraph(model.eval()).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # as in export_onnx
        traced = torch.jit.trace(graph, sample_inputs(INPUT_DTYPES[input_dtype]),
                                 check_trace=False)
    traced.save(path)


def onnxruntime_runner(path: str, threads: int = 0) -> Callable:
    """A function (images (N, 3, H, W) array, image_sizes (N, 2) array) -> the graph's four
    outputs, running the ONNX file in onnxruntime on the CPU (``threads`` 0: its default)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return lambda images, sizes: session.run(None, {"images": images, "image_sizes": sizes})


def torchscript_runner(path: str) -> Callable:
    """As :func:`onnxruntime_runner`, for the TorchScript file of :func:`trace_torchscript`."""
    traced = torch.jit.load(path)

    def run(images: np.ndarray, sizes: np.ndarray) -> List[np.ndarray]:
        with torch.no_grad():
            return [x.numpy() for x in traced(torch.from_numpy(images), torch.from_numpy(sizes))]

    return run


def pytorch_detections(model: FCOS, images: Sequence[Tensor]) -> List[Detections]:
    """``FCOS`` in eval mode on (3, h, w) images at their own size, as numpy arrays."""
    with torch.no_grad():
        outputs = model.eval()([{"image": image} for image in images])
    return [(r.pred_boxes.tensor.numpy(), r.scores.numpy(), r.pred_classes.numpy())
            for r in (o["instances"].to("cpu") for o in outputs)]


def compare(expected: Sequence[Detections], got: Sequence[Detections],
            max_detections: Optional[int] = None, *, score_tolerance: float = SCORE_TOLERANCE,
            box_tolerance: float = BOX_TOLERANCE,
            score_floor: Optional[float] = None) -> Dict[str, object]:
    """How far two runs' detections of the same images are apart, compared as sets
    (``fcos_d2.export.matching``): matched by class, score and box, in any order, with
    candidates tied at the ``max_detections`` cap interchangeable.

    Returns:
        "same": every detection has a partner (or is such a tie); "counts": [(expected,
        got)] per image; "swapped_at_cap", "unmatched": per image; "score_diff",
        "box_diff": the largest differences between matched detections.
    """
    return matching.compare(expected, got, score_tolerance=score_tolerance,
                            box_tolerance=box_tolerance, max_detections=max_detections,
                            score_floor=score_floor)


def agreement_line(result: Dict[str, object], size: Tuple[int, int]) -> str:
    """One image's result of :func:`compare` in one line, starting "agree" or "DIFFER"."""
    (expected_count, got_count), = result["counts"]
    (swapped,), ((lost, extra),) = result["swapped_at_cap"], result["unmatched"]
    line = (f"{'agree' if result['same'] else 'DIFFER'} at {size[0]}x{size[1]}: "
            f"{expected_count} detections in PyTorch, {got_count} here")
    if swapped:
        line += f" ({swapped} tied at the {expected_count}-detection cap kept in another choice)"
    if lost or extra:
        line += f"; without a match: {lost} of PyTorch's, {extra} of these"
    return (line + f"; largest differences of matched ones: score {result['score_diff']:.1e}, "
            f"box {result['box_diff']:.1e} px")


def check_sizes(min_size: int) -> List[Tuple[int, int]]:
    """Two image sizes for the agreement check, none a multiple of 32: a landscape image
    with ``INPUT.MIN_SIZE_TEST`` rows and a smaller portrait one (512 if it is 0)."""
    short = min_size or 512
    return [(short | 1, short * 4 // 3 | 1), (short * 3 // 4 | 1, short | 1)]


def check_against_pytorch(model: FCOS, run: Callable, sizes: Sequence[Tuple[int, int]],
                          input_dtype: str = "float32", seed: int = 0,
                          **tolerances: float) -> List[str]:
    """Runs ``run`` (see :func:`onnxruntime_runner`) and PyTorch on one random image of each
    size; returns a line of agreement per size, each starting with "agree" or "DIFFER".
    ``tolerances``: ``score_tolerance``, ``box_tolerance``, ``score_floor`` of :func:`compare`."""
    generator = torch.Generator().manual_seed(seed)
    lines = []
    for height, width in sizes:
        image = torch.randint(0, 256, (3, height, width), generator=generator)
        image = image.to(INPUT_DTYPES[input_dtype])
        images, image_sizes = pad_batch([image])
        got = split_by_image(list(run(images.numpy(), image_sizes.numpy())), 1)
        result = compare(pytorch_detections(model, [image.float()]), got,
                         model.max_detections_per_image, **tolerances)
        lines.append(agreement_line(result, (height, width)))
    return lines
