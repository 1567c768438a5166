"""The whole detector exported as one graph (fcos_d2/export/onnx_graph.py) gives PyTorch's
detections: in onnxruntime, in a process that imports neither torch nor fcos_d2, and as a
TorchScript file loaded without fcos_d2 or detectron2.

Models: the quickstart config made tiny, random weights with the class bias lifted to
-1 (probability 0.27, above the 0.05 threshold) so that every image has detections; a
"quiet" model keeps the prior bias (probability 0.01), so it detects nothing; "other_keys"
thresholds the final score and changes top-k, NMS and detections per image.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.export.files import (export_onnx, onnxruntime_runner, pad_batch, pytorch_detections,
                                  trace_torchscript)
from fcos_d2.export.onnx_graph import split_by_image

REPO = Path(__file__).resolve().parents[2]
TINY = ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1", "MODEL.DEVICE", "cpu"]
# (model, [image sizes]) per case; a case of two sizes is a padded batch.
CASES = {
    "square": ("GN", [(128, 128)]),
    "odd": ("GN", [(97, 131)]),
    "wide": ("GN", [(72, 200)]),
    "batch": ("GN", [(100, 130), (128, 96)]),
    "black": ("GN", [(96, 96)]),
    "bn": ("BN", [(97, 131)]),
    "no_norm": ("", [(97, 131)]),
    "other_keys": ("other_keys", [(97, 131), (128, 128)]),
    "quiet": ("quiet", [(128, 128)]),
    "quiet_black": ("quiet", [(128, 128)]),
}

RUN_ONNX = """
import json, sys
import numpy as np, onnxruntime
for graph, inputs, outputs in json.loads(sys.argv[1]):
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    data = np.load(inputs)
    np.savez(outputs, *session.run(None, {"images": data["images"],
                                          "image_sizes": data["image_sizes"]}))
assert "torch" not in sys.modules, "running the graph imported torch"
"""

RUN_TORCHSCRIPT = """
import sys
import numpy as np, torch, torchvision  # torchvision registers torchvision::nms
traced = torch.jit.load(sys.argv[1])
data = np.load(sys.argv[2])
with torch.no_grad():
    outputs = traced(torch.from_numpy(data["images"]), torch.from_numpy(data["image_sizes"]))
np.savez(sys.argv[3], *[x.numpy() for x in outputs])
assert not any(m.split(".")[0] in ("fcos_d2", "detectron2") for m in sys.modules)
"""


# Config overrides per model; "other_keys" sets every inference key to a non-default value.
MODELS = {
    "GN": ["MODEL.FCOS.NORM", "GN"], "BN": ["MODEL.FCOS.NORM", "BN"], "": ["MODEL.FCOS.NORM", ""],
    "quiet": [],
    "other_keys": ["MODEL.FCOS.INFERENCE_TH_ON", "final_score", "MODEL.FCOS.INFERENCE_TH_TEST",
                   "0.3", "MODEL.FCOS.PRE_NMS_TOPK_TEST", "40", "MODEL.FCOS.NMS_TH_TEST", "0.3",
                   "TEST.DETECTIONS_PER_IMAGE", "12"],
}


def tiny_model(kind: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list(TINY + MODELS[kind])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    if kind != "quiet":
        model.head.cls_logits.bias.data.fill_(-1.0)
    return model


def images_of(case: str):
    generator = torch.Generator().manual_seed(len(case))
    return [torch.zeros(3, h, w) if "black" in case else
            torch.randint(0, 256, (3, h, w), generator=generator).float()
            for h, w in CASES[case][1]]


@pytest.fixture(scope="module")
def models():
    return {kind: tiny_model(kind) for kind in {kind for kind, _ in CASES.values()}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, models):
    """Per case: (PyTorch's detections per image, onnxruntime's per image)."""
    folder = tmp_path_factory.mktemp("onnx_graph")
    for kind, model in models.items():
        export_onnx(model, str(folder / f"{kind}.onnx"))
    jobs, expected = [], {}
    for case, (kind, _) in CASES.items():
        images = images_of(case)
        batch, sizes = pad_batch(images)
        np.savez(folder / f"{case}_in.npz", images=batch.numpy(), image_sizes=sizes.numpy())
        jobs.append([str(folder / f"{kind}.onnx"), str(folder / f"{case}_in.npz"),
                     str(folder / f"{case}_out.npz")])
        expected[case] = pytorch_detections(models[kind], images)
    run = subprocess.run([sys.executable, "-c", RUN_ONNX, json.dumps(jobs)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return {case: (expected[case], split_by_image(outputs(folder / f"{case}_out.npz"),
                                                  len(expected[case]))) for case in CASES}


def outputs(path: Path):
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(4)]


def assert_same_detections(expected, got):
    """Same count, classes and order; scores within 1e-4; boxes within 0.01 px."""
    for (e_boxes, e_scores, e_classes), (g_boxes, g_scores, g_classes) in zip(expected, got):
        assert len(e_scores) > 0, "the case has no detections to compare"
        assert g_classes.tolist() == e_classes.tolist()
        np.testing.assert_allclose(g_scores, e_scores, rtol=0, atol=1e-4)
        np.testing.assert_allclose(g_boxes, e_boxes, rtol=0, atol=0.01)


@pytest.mark.parametrize("case", ["square", "odd", "wide"])
def test_graph_in_onnxruntime_gives_pytorchs_detections_at_any_image_size(runs, case):
    assert_same_detections(*runs[case])


def test_padded_batch_of_two_sizes_gives_each_image_its_own_detections(runs):
    expected, got = runs["batch"]
    assert len(got) == 2
    assert_same_detections(expected, got)
    assert (got[1][0][:, [2, 3]] <= np.array([96, 128])).all()  # clipped to its own size


@pytest.mark.parametrize("case", ["black", "bn", "no_norm"])
def test_group_norm_batch_norm_and_plain_heads_export_and_match(runs, case):
    assert_same_detections(*runs[case])


def test_threshold_on_final_score_top_k_nms_and_detections_per_image_are_those_of_the_config(
        runs):
    expected, got = runs["other_keys"]
    assert max(len(e[1]) for e in expected) == 12  # TEST.DETECTIONS_PER_IMAGE
    assert_same_detections(expected, got)


@pytest.mark.parametrize("case", ["quiet", "quiet_black"])
def test_an_image_without_detections_gives_empty_outputs(runs, case):
    (expected,), (got,) = runs[case]
    assert len(expected[1]) == 0
    boxes, scores, classes = got
    assert boxes.shape == (0, 4) and scores.shape == (0,) and classes.shape == (0,)


def test_graph_exported_for_uint8_pixels_takes_uint8_images(models, tmp_path):
    export_onnx(models["GN"], str(tmp_path / "uint8.onnx"), input_dtype="uint8")
    image = torch.randint(0, 256, (3, 97, 131), dtype=torch.uint8)
    batch, sizes = pad_batch([image])
    got = onnxruntime_runner(str(tmp_path / "uint8.onnx"))(batch.numpy(), sizes.numpy())
    assert batch.dtype == torch.uint8
    assert_same_detections(pytorch_detections(models["GN"], [image.float()]),
                           split_by_image(got, 1))


def test_torchscript_file_runs_without_fcos_d2_and_matches_pytorch(tmp_path):
    model = tiny_model("GN")
    trace_torchscript(model, str(tmp_path / "fcos.pt"))
    images = [torch.randint(0, 256, (3, h, w)).float() for h, w in [(100, 130), (77, 64)]]
    batch, sizes = pad_batch(images)
    np.savez(tmp_path / "in.npz", images=batch.numpy(), image_sizes=sizes.numpy())
    run = subprocess.run([sys.executable, "-c", RUN_TORCHSCRIPT, str(tmp_path / "fcos.pt"),
                          str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = split_by_image(outputs(tmp_path / "out.npz"), 2)
    assert_same_detections(pytorch_detections(model, images), got)
