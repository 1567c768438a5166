"""The environment contract: fcos_d2 and detectron2 import, missing C++ ops fail clearly."""
import subprocess
import sys

import pytest
import torch

from fcos_d2 import compat


def test_fcos_d2_and_detectron2_modules_import_in_a_fresh_interpreter():
    code = "import fcos_d2, detectron2.engine, detectron2.evaluation, detectron2.data"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _require_missing_extension():
    if compat.HAS_D2_EXTENSION:
        pytest.skip("detectron2 here was built with its C++ extension; the clear error for "
                    "a missing extension only exists without it")


def test_op_of_missing_extension_raises_error_naming_the_op():
    _require_missing_extension()
    import inspect

    from detectron2.layers.rotated_boxes import pairwise_iou_rotated
    if "torch.ops.detectron2" in inspect.getsource(pairwise_iou_rotated):
        pytest.skip("this detectron2 (main) calls box_iou_rotated through torch.ops, not "
                    "detectron2._C, which fcos_d2.compat stands in for; a main built from "
                    "source has the op")

    with pytest.raises(compat.MissingExtensionError, match="'box_iou_rotated'.*build detectron2"):
        pairwise_iou_rotated(torch.zeros(1, 5), torch.zeros(1, 5))


def test_rotated_nms_of_missing_extension_raises_error_naming_the_op():
    _require_missing_extension()
    from detectron2.layers import nms_rotated

    with pytest.raises(compat.MissingExtensionError, match="'nms_rotated'"):
        nms_rotated(torch.zeros(1, 5), torch.ones(1), 0.5)


def test_environment_report_runs_without_the_extension():
    from detectron2.utils.collect_env import collect_env_info

    report = collect_env_info()
    assert "detectron2" in report
    if not compat.HAS_D2_EXTENSION:
        assert "without its C++ extension" in report
