"""ONNX export of NAS-FCOS: the quickstart model (separable convs) exports and agrees with
PyTorch; a model with deformable convs is refused naming the operation."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

import fcos_d2
from fcos_d2.export.files import (UnsupportedOperationError, check_against_pytorch,
                                  export_onnx, onnxruntime_runner)


def _model(config: str):
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(fcos_d2.get_config_file(config))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.NAS_FCOS.CHANNELS", "32",
                         "MODEL.FCOS.INFERENCE_TH_TEST", "0.0"])
    torch.manual_seed(0)
    return build_model(cfg).eval()


def test_the_quickstart_nas_fcos_exports_and_agrees_with_pytorch(tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    model = _model("NAS-FCOS/quickstart.yaml")
    export_onnx(model, str(tmp_path / "nas.onnx"))
    lines = check_against_pytorch(model, onnxruntime_runner(str(tmp_path / "nas.onnx")),
                                  [(128, 160)], "float32")
    assert lines and all(line.startswith("agree") for line in lines), lines


def test_deformable_convs_are_refused_naming_the_operation(tmp_path):
    model = _model("NAS-FCOS/quickstart_dcn.yaml")
    with pytest.raises(UnsupportedOperationError,
                       match=r"16 deformable convs \(torchvision::deform_conv2d, DCNv2: "
                             r"backbone\.cells\.0\.ops\.0, backbone\.cells\.0\.ops\.1, "):
        export_onnx(model, str(tmp_path / "nas.onnx"))
    assert not (tmp_path / "nas.onnx").exists()
