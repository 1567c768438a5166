"""The host row of benchmarks.speed (a whole training iteration of three tiny FCOS, its
overhead over the arithmetic floor) and the floor itself (the model's FLOPs at the rate of
its largest conv): MACs by hand, the largest conv found, the ratios, the table cells."""
import argparse
import json

import pytest
import torch
from torch import nn

from benchmarks import tables
from benchmarks.speed import contenders as bc, floor, host_row


def test_conv_macs_count_one_multiply_add_per_output_and_kernel_tap():
    conv = nn.Conv2d(2, 3, 3, padding=1)
    output = conv(torch.zeros(1, 2, 4, 5))  # (1, 3, 4, 5): 60 outputs, 2 * 3 * 3 taps each
    assert floor.conv_macs(conv, output) == 60 * 18
    grouped = nn.Conv2d(4, 4, 3, padding=1, groups=2)  # 2 input channels per group
    assert floor.conv_macs(grouped, grouped(torch.zeros(1, 4, 2, 2))) == 16 * 18


def _two_conv_contender():
    small, large = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 8, 3, padding=1)
    model = nn.Sequential(small, large)
    # small: 4 * 6 * 8 outputs * 3 = 576 MACs; large: 8 * 6 * 8 * 36 = 13824
    return bc.Contender("two convs", model, infer=model, loss=None, backbone_head=model), large


def test_the_largest_conv_is_the_one_with_most_multiply_adds_with_its_input_shape():
    contender, large = _two_conv_contender()
    conv, shape = floor.largest_conv(contender, torch.zeros(1, 3, 6, 8))
    assert conv is large and tuple(shape) == (1, 4, 6, 8)


def test_the_conv_floor_times_a_copy_of_the_largest_conv_in_the_given_precision():
    contender, _ = _two_conv_contender()
    peak = floor.conv_floor(contender, torch.zeros(1, 3, 6, 8), "cpu", torch.float32, 1)
    assert peak["flops_per_second"] > 0
    assert peak["conv"] == "3x3 conv 4->8 stride 1 on (1, 4, 6, 8) float32"


def test_a_training_floor_is_three_forwards_of_the_batch():
    # 10 GMACs per image, 2 images, 100 GFLOP/s: 2 * 10e9 * 2 / 100e9 = 0.4 s forward
    assert floor.floor_seconds(10e9, 2, 100e9, training=False) == pytest.approx(0.4)
    assert floor.floor_seconds(10e9, 2, 100e9, training=True) == pytest.approx(1.2)


def test_host_targets_divide_fcos_d2s_overhead_by_each_others():
    results = [{"contender": "fcos-d2", "overhead_seconds": 0.1},
               {"contender": "torchvision", "overhead_seconds": 0.4},
               {"contender": "detectron2 0.6 FCOS", "overhead_seconds": 0.2}]
    ratios = host_row.target_ratios(results)
    assert ratios == pytest.approx({
        "host overhead per training iteration, fcos-d2 / torchvision (target <= 0.5)": 0.25,
        "host overhead per training iteration, fcos-d2 / detectron2 (target <= 0.7)": 0.5})


def test_the_host_row_times_the_three_tiny_fcos_and_keeps_each_overhead_over_its_floor(capsys):
    torch.set_num_threads(1)
    results = host_row.row(argparse.Namespace(device="cpu", repeats=1))
    timed = [r for r in results if "seconds" in r]
    names = [r["contender"].split()[0] for r in timed]
    assert names[:2] == ["fcos-d2", "torchvision"]
    for r in timed:
        assert r["batch"] == 2 and r["image_size"] == [64, 96]
        assert 0 < r["floor_seconds"] < r["seconds"]
        assert r["overhead_seconds"] == pytest.approx(r["seconds"] - r["floor_seconds"])
        assert r["rest_seconds"] == pytest.approx(r["seconds"] - r["network_seconds"])
        assert r["network_seconds"] > 0
    if bc.detectron2_has_fcos():
        assert names[2] == "detectron2" and len(results[0]["targets"]) == 2
    else:
        assert "has no FCOS" in results[-1]["missing"] and len(results[0]["targets"]) == 1
    assert "[host: training iteration, ResNet-18 from scratch" in capsys.readouterr().out


def test_tensors_in_nested_head_outputs_are_all_found_in_order():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [t.item() for t in host_row.tensors_in(([a, b], {"x": c}))] == [0.0, 1.0, 2.0]


def test_a_detectron2_without_fcos_is_named_and_left_out(monkeypatch):
    monkeypatch.setattr(bc, "detectron2_has_fcos", lambda: False)
    built, missing = host_row.contenders("cpu")
    assert sorted(built) == ["fcos-d2", "torchvision"]
    assert missing.startswith(f"detectron2 {bc.detectron2_version()} has no FCOS")


def test_the_table_shows_each_timed_result_beside_its_floor(tmp_path):
    result = {"row": "host", "contender": "fcos-d2", "batch": 2, "seconds": 0.2,
              "floor_seconds": 0.05}
    record = {"benchmark": "speed", "date": "2026-12-05T15:00:00+00:00", "commit": "b" * 40,
              "dirty": False, "cpu": {"model": "A CPU", "flags": [], "cores": 2},
              "command": "python -m benchmarks.speed --rows host", "seed": 0, "overrides": [],
              "metrics": {"rows": {"host": [result]}, "targets": {}}, "times": {},
              "run": {"machine": {"device": "cpu"}, "options": {"threads": 1}}}
    path = tmp_path / "speed.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert "| host | fcos-d2 | 2 | 200.0 | 10.00 | 50.0 | 4.0 | cpu | 1 | bbbbbbb | A CPU | 1 |" \
        in tables.generate(path).splitlines()


def test_each_contender_steps_with_its_projects_optimizer():
    built, _ = host_row.contenders("cpu")
    ours = built["fcos-d2"].optimizer(built["fcos-d2"].model)
    assert ours.defaults["fused"] is True  # fcos_d2.engine.optimizer.build_optimizer
    assert ours.defaults["lr"] == bc.LR and ours.defaults["momentum"] == 0.9
    torchvisions = built["torchvision"].optimizer(built["torchvision"].model)
    assert not torchvisions.defaults["fused"]
    assert {g["weight_decay"] for g in torchvisions.param_groups} == {1e-4}  # norms too
    if "detectron2" in built:
        detectrons = built["detectron2"].optimizer(built["detectron2"].model)
        assert not detectrons.defaults["fused"]
        assert {g["weight_decay"] for g in detectrons.param_groups} == {0.0, 1e-4}
