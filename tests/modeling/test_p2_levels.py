"""P2 (stride 4) as a level of its own, end to end: train_net.py trains and evaluates a P2
model and logs the level fit; the eval-mode fast path, test-time augmentation and the ONNX
graph give its detections; weights of a P3-P4 model load into a P2-P4 model by level name,
and weights whose levels are unknown are refused naming the keys."""
import subprocess
import sys

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.checkpoint import FCOSCheckpointer
from fcos_d2.checkpoint.checkpointer import WeightsMismatchError
from fcos_d2.checkpoint.levels import LEVELS_KEY, checkpoint_levels, remap_levels
from fcos_d2.export.files import export_onnx, pad_batch, pytorch_detections
from fcos_d2.export.onnx_graph import split_by_image
from tiny_training import REPO

P2 = ["MODEL.RESNETS.OUT_FEATURES", "['res2', 'res3', 'res4']",
      "MODEL.FPN.IN_FEATURES", "['res2', 'res3', 'res4']",
      "MODEL.FCOS.IN_FEATURES", "['p2', 'p3', 'p4']", "MODEL.FCOS.SIZES_OF_INTEREST", "[16, 32]"]
TINY = ["MODEL.FPN.OUT_CHANNELS", "32", "MODEL.FCOS.NUM_CONVS", "1", "MODEL.DEVICE", "cpu",
        "MODEL.FCOS.CHANNELS_LAST", "False"]


def tiny_model(*opts, seed: int = 0):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list([*TINY, *opts])
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    model.head.cls_logits.bias.data.fill_(-1.0)  # detections from random weights
    return cfg, model


def test_p2_model_trains_evaluates_and_logs_its_level_fit(scripts, dataset, tmp_path):
    run = scripts.run("train_net.py", "--config-file", "configs/quickstart.yaml",
                      "--register-coco", "tiny_p2", str(dataset / "annotations.json"),
                      str(dataset / "images"), *TINY, *P2, "SOLVER.MAX_ITER", "2",
                      "SOLVER.IMS_PER_BATCH", "2", "SOLVER.WARMUP_ITERS", "1",
                      "DATASETS.TRAIN", "('tiny_p2',)", "DATASETS.TEST", "('tiny_p2',)",
                      "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", "OUTPUT_DIR", str(tmp_path))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    log = (tmp_path / "log.txt").read_text()
    assert "Level fit on tiny_p2 (4 images)" in log and "levels p2, p3, p4 (strides 4, 8, 16)" in log
    assert "Evaluation results for bbox" in log
    saved = torch.load(tmp_path / "model_final.pth", map_location="cpu", weights_only=False)
    assert saved[LEVELS_KEY] == ["p2", "p3", "p4"]


def test_fast_path_and_tta_run_on_p2():
    from fcos_d2.modeling import FCOSWithTTA
    from fcos_d2.modeling.fast_inference import inference_model

    # two small scales, flipped: detectron2's default TEST.AUG (9 scales up to 1200 px)
    # took 20 s here for the same check
    cfg, model = tiny_model(*P2, "TEST.AUG.MIN_SIZES", "(96, 128)", "TEST.AUG.MAX_SIZE", "200")
    image = torch.randint(0, 256, (3, 97, 131)).float()
    with torch.no_grad():
        plain = model([{"image": image}])[0]["instances"]
        fast = inference_model(model, True)([{"image": image}])[0]["instances"]
        tta = FCOSWithTTA(cfg, model)([{"image": image, "height": 97, "width": 131}])
    assert len(plain) > 0 and len(fast) == len(plain)
    torch.testing.assert_close(fast.pred_boxes.tensor, plain.pred_boxes.tensor, atol=0.05, rtol=0)
    assert len(tta[0]["instances"]) > 0


def test_p2_onnx_graph_gives_pytorchs_detections(tmp_path):
    _, model = tiny_model(*P2)
    images = [torch.randint(0, 256, (3, 97, 131), generator=torch.Generator().manual_seed(1))
              .float()]
    export_onnx(model, str(tmp_path / "p2.onnx"))
    batch, sizes = pad_batch(images)
    np.savez(tmp_path / "in.npz", images=batch.numpy(), image_sizes=sizes.numpy())
    code = ("import sys, numpy as np, onnxruntime\n"
            "s = onnxruntime.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
            "d = np.load(sys.argv[2])\n"
            "np.savez(sys.argv[3], *s.run(None, {'images': d['images'], "
            "'image_sizes': d['image_sizes']}))\n")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "p2.onnx"),
                          str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as data:
        got = split_by_image([data[f"arr_{i}"] for i in range(4)], 1)
    (e_boxes, e_scores, e_classes), = pytorch_detections(model, images)
    (g_boxes, g_scores, g_classes), = got
    assert len(e_scores) > 0 and g_classes.tolist() == e_classes.tolist()
    np.testing.assert_allclose(g_scores, e_scores, atol=1e-4, rtol=0)
    np.testing.assert_allclose(g_boxes, e_boxes, atol=0.01, rtol=0)


def _scales(model):
    return [float(s.scale.detach()) for s in model.head.scales]


def test_p3_p4_weights_load_into_a_p2_model_by_level(tmp_path):
    _, small = tiny_model()
    with torch.no_grad():
        for value, scale in zip((3.0, 4.0), small.head.scales):
            scale.scale.fill_(value)
    FCOSCheckpointer(small, str(tmp_path)).save("p3p4")
    _, big = tiny_model(*P2, seed=1)
    fine_tune = FCOSCheckpointer(big, str(tmp_path), reinit_mismatched=True)
    fine_tune.resume_or_load(str(tmp_path / "p3p4.pth"), resume=False)
    assert _scales(big) == [1.0, 3.0, 4.0]  # P2 keeps its fresh scale; P3, P4 theirs
    torch.testing.assert_close(big.head.cls_logits.weight, small.head.cls_logits.weight)
    # to evaluate, the weights must hold every level of the model: the error names P2's
    with pytest.raises(WeightsMismatchError, match=r"head\.scales\.0\.scale") as error:
        FCOSCheckpointer(tiny_model(*P2)[1]).load(str(tmp_path / "p3p4.pth"))
    assert "backbone.fpn_lateral2.weight" in str(error.value)


def test_weights_without_their_levels_are_refused_naming_the_keys(tmp_path):
    _, small = tiny_model()
    state = {k: v for k, v in small.state_dict().items() if "fpn_lateral" not in k}
    torch.save({"model": state}, tmp_path / "bare.pth")  # no record, no FPN to tell
    with pytest.raises(WeightsMismatchError, match=r"head\.scales\.0-1.*MODEL\.FCOS\.IN_FEATURES"):
        FCOSCheckpointer(tiny_model(*P2)[1]).load(str(tmp_path / "bare.pth"))


def test_levels_of_an_unrecorded_file_come_from_its_fpn():
    state = {"backbone.fpn_lateral3.weight": 0, "backbone.fpn_lateral4.weight": 0,
             "backbone.fpn_lateral5.weight": 0, "backbone.top_block.p6.weight": 0,
             "backbone.top_block.p7.weight": 0,
             **{f"head.scales.{i}.scale": i for i in range(5)}}
    assert checkpoint_levels({"model": state}) == ["p3", "p4", "p5", "p6", "p7"]
    moved, notes = remap_levels(state, ["p3", "p4", "p5", "p6", "p7"], ["p2", "p3", "p4"])
    assert {k: v for k, v in moved.items() if "scales" in k} == \
        {"head.scales.1.scale": 0, "head.scales.2.scale": 1}
    assert notes == ["levels ['p5', 'p6', 'p7'] of the weights are not in the model: dropped",
                     "levels ['p2'] of the model are not in the weights"]
