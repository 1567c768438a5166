"""ONNX export: the graph runs in onnxruntime and equals PyTorch; its dense outputs contain
exactly what FCOS inference selects from."""
from pathlib import Path

import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.export import FCOSDenseOutputs

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = ["--config-file", "configs/quickstart.yaml"]


def test_dense_graph_matches_pytorch_in_onnxruntime(tmp_path, scripts):
    weights, output = tmp_path / "w.pth", tmp_path / "fcos.onnx"
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs/quickstart.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    torch.save({"model": build_model(cfg).state_dict()}, weights)
    result = scripts.run("tools/export_onnx.py", *QUICKSTART, "--dense", "--height", "128",
                         "--width", "160", "--output", str(output), "MODEL.WEIGHTS", str(weights))
    assert result.returncode == 0, result.stderr[-2000:]
    error = float(result.stdout.strip().rsplit(" ", 1)[-1])
    assert output.stat().st_size > 0 and error < 1e-4


def test_dense_outputs_contain_the_detections_of_fcos_inference():
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs/quickstart.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    model.head.cls_logits.bias.data.fill_(-1.0)  # make detections likely with random weights
    image = torch.rand(3, 128, 128) * 255
    with torch.no_grad():
        instances = model([{"image": image}])[0]["instances"]
        boxes, scores = FCOSDenseOutputs(model)(image[None])
    assert len(instances) > 0
    for box, score, label in zip(instances.pred_boxes.tensor, instances.scores,
                                 instances.pred_classes):
        clipped = boxes[0].clamp(min=0, max=128)  # inference clips to the 128x128 image
        hit = ((clipped - box).abs().max(dim=1).values < 1e-3) & \
              ((scores[0, :, label] - score).abs() < 1e-5)
        assert hit.any()
