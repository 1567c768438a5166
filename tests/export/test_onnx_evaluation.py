"""tools/test_onnx.py evaluates the exported graph over a dataset as train_net.py
--eval-only evaluates the PyTorch model: same AP, same detections, a summary block marked
as the ONNX model.

One tiny model (the quickstart config made narrow, every candidate kept), its box biases
started at about the size of the shapes so that AP is above 0 after a short training
(five SGD steps in-process on the 4-image COCO dataset of synthetic shapes that the test
writes and registers with --register-coco, as tests/engine/test_train_net.py does), saved as a
checkpoint that both tools load.
"""
import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import DatasetMapper
from detectron2.data.datasets import load_coco_json
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.data import synthetic
from fcos_d2.export.runtime import ONNXRuntimeDetector

REPO = Path(__file__).resolve().parents[2]
CONFIG = ["--config-file", "configs/quickstart.yaml"]
TINY_MODEL = ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1",
              "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", "MODEL.FCOS.PRE_NMS_TOPK_TEST", "50",
              "DATALOADER.NUM_WORKERS", "0", "DATASETS.TEST", "('tiny',)", "MODEL.DEVICE", "cpu"]


def run(scripts, script: str, *arguments: str) -> subprocess.CompletedProcess:
    result = scripts.run(script, *arguments)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def summary_blocks(output: Path):
    """(header, AP values) of each block of the tiny dataset's summary.txt."""
    lines = (output / "inference" / "tiny" / "summary.txt").read_text().splitlines()
    return [(line, [float(v) for v in lines[i + 2].split()])
            for i, line in enumerate(lines) if line.startswith("== tiny |")]


def detections(results_json: Path):
    """COCOEvaluator's detections, sorted by image and then as listed."""
    records = json.loads(results_json.read_text())
    return sorted(records, key=lambda r: r["image_id"])


def train_briefly(model, cfg, dataset: Path, *, steps: int) -> None:
    """``steps`` SGD steps on every image of the COCO dataset at ``dataset``, in place."""
    mapper = DatasetMapper(cfg, is_train=True)
    batch = [mapper(d) for d in load_coco_json(str(dataset / "annotations.json"),
                                               str(dataset / "images"), "tiny_train")]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for _ in range(steps):
        loss = sum(model(batch).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def test_test_onnx_gives_the_ap_and_detections_of_eval_only(tmp_path, scripts):
    dataset = tmp_path / "tiny_coco"
    synthetic.write_split(dataset, split="val", num_images=4)
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list(TINY_MODEL)
    torch.manual_seed(0)
    model = build_model(cfg)
    model.head.bbox_pred.bias.data.fill_(2.0)  # boxes of about the shapes' size: AP above 0
    train_briefly(model, cfg, dataset, steps=5)
    torch.save({"model": model.state_dict(), "iteration": 4}, tmp_path / "model.pth")
    register = ["--register-coco", "tiny", str(dataset / "annotations.json"),
                str(dataset / "images")]
    opts = [*TINY_MODEL, "MODEL.WEIGHTS", str(tmp_path / "model.pth"),
            "OUTPUT_DIR", str(tmp_path / "output")]

    run(scripts, "train_net.py", *CONFIG, *register, "--eval-only", *opts)
    export = run(scripts, "tools/export_onnx.py", *CONFIG, "--output",
                 str(tmp_path / "fcos.onnx"), *opts)
    onnx = run(scripts, "tools/test_onnx.py", *CONFIG, "--onnx-model", str(tmp_path / "fcos.onnx"),
               *register, *opts)

    assert export.stdout.count("onnxruntime, agree at ") == 2
    (pytorch_header, pytorch_ap), (onnx_header, onnx_ap) = summary_blocks(tmp_path / "output")
    assert "model:" not in pytorch_header
    assert f"| iterations trained: 5 | model: ONNX {tmp_path / 'fcos.onnx'} |" in onnx_header
    assert pytorch_ap[0] > 0  # AP, AP50, AP75, APs, APm, APl
    np.testing.assert_allclose(onnx_ap, pytorch_ap, atol=0.1, rtol=0, equal_nan=True)
    assert "Evaluation results for bbox" in onnx.stdout + onnx.stderr  # the same AP table
    expected = detections(tmp_path / "output" / "inference" / "tiny" /
                          "coco_instances_results.json")
    got = detections(tmp_path / "output" / "onnx" / "inference" / "tiny" /
                     "coco_instances_results.json")
    assert len(got) == len(expected) > 0
    assert [r["category_id"] for r in got] == [r["category_id"] for r in expected]
    np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in expected],
                               atol=1e-4, rtol=0)
    np.testing.assert_allclose([r["bbox"] for r in got], [r["bbox"] for r in expected],
                               atol=0.01, rtol=0)


def test_a_graph_that_is_not_the_whole_detector_is_refused_naming_the_file(tmp_path):
    images = onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT, [1, 3, 8, 8])
    boxes = onnx.helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, [1, 3, 8, 8])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["images"], ["boxes"])],
                                   "dense_like", [images], [boxes])
    onnx.save(onnx.helper.make_model(graph), tmp_path / "dense.onnx")
    with pytest.raises(ValueError, match=r"dense.onnx: inputs \['images'\] are not those of "
                                         r"the whole-detector graph .* without --dense"):
        ONNXRuntimeDetector(str(tmp_path / "dense.onnx"))
