"""tools/benchmark.py's machinery (the timings themselves are its output, not tested):
interleaved timing, the target ratios, row selection, and --device cuda without a GPU."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def benchmark():
    import sys
    sys.path.insert(0, str(REPO / "tools"))
    spec = importlib.util.spec_from_file_location("benchmark", REPO / "tools" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_contenders_are_timed_in_turn_after_a_warm_up(benchmark):
    calls = []
    medians = benchmark.interleaved_medians({"a": lambda: calls.append("a"),
                                             "b": lambda: calls.append("b")}, 3, "cpu")
    assert calls == ["a", "b"] * 4  # one warm-up round, then 3 timed rounds
    assert set(medians) == {"a", "b"} and all(t >= 0 for t in medians.values())


def test_target_ratios_divide_the_named_rows(benchmark):
    inference = [{"row": "inference", "contender": c, "batch": b, "seconds": t}
                 for c, b, t in [("fcos-d2 fp32", 1, 3.0), ("fcos-d2 fp32 +CL +fold", 1, 2.4),
                                 ("torchvision fp32", 1, 4.0), ("fcos-d2 bf16 +CL +fold", 1, 1.2),
                                 ("torchvision fp32", 4, 99.0)]]
    training = [{"row": "training", "contender": c, "batch": 2, "seconds": t}
                for c, t in [("fcos-d2 fp32", 6.0), ("torchvision fp32", 8.0),
                             ("fcos-d2 bf16 +CL", 3.0)]]
    ratios = benchmark.target_ratios({"inference": inference, "training": training,
                                      "flops": [{"floor_seconds": 2.0}]}, "cpu")
    assert list(ratios.values()) == pytest.approx([2.4 / 4.0, 1.2 / 2.4, 2.4 / 2.0,
                                                   6.0 / 8.0, 3.0 / 6.0])


def test_an_unknown_row_is_rejected_naming_the_option(benchmark, capsys):
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--rows", "inference,speed"])
    assert "--rows: unknown ['speed']" in capsys.readouterr().err


def test_device_cuda_without_a_gpu_prints_why_and_writes_the_reason(benchmark, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: --device cuda would run the whole benchmark")
    benchmark.main(["--device", "cuda", "--json", str(tmp_path / "b.json")])
    assert "skipped: --device cuda: CUDA is not available" in capsys.readouterr().out
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["rows"] == {} and "CUDA is not available" in report["skipped"]
