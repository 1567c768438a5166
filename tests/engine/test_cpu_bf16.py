"""bf16 only where the CPU computes it natively (MODEL.FCOS.CPU_BF16): detection of native
bf16 from PyTorch's CPUID probe, /proc/cpuinfo and sysctl; training (SOLVER.AMP.ENABLED) and
inference (INFERENCE_DTYPE bfloat16) fall back to float32 elsewhere, saying so in the log,
unless CPU_BF16 is "always"."""
import logging
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config
from fcos_d2 import precision as bf16_policy
from fcos_d2.engine.amp import CPUAMPTrainer
from fcos_d2.engine.trainer import Trainer
from fcos_d2.precision import cpu_has_native_bf16, resolve_cpu_bf16
from tiny_training import register_two_images

REPO = Path(__file__).resolve().parents[2]
AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve i8mm bf16 svebf16\n"
NEOVERSE_N1 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 atomics\n"
NO_PROBE = {"torch": lambda: None, "sysctl": lambda: None}


@pytest.mark.parametrize("text, native", [(AVX2, False), (SAPPHIRE_RAPIDS, True),
                                          (GRAVITON3, True), (NEOVERSE_N1, False)])
def test_native_bf16_is_read_from_x86_flags_and_arm_features(tmp_path, text, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    probes = {**NO_PROBE, "cpuinfo": lambda: bf16_policy._from_cpuinfo(str(cpuinfo))}
    assert cpu_has_native_bf16(probes=probes) is native


def test_the_cpuid_probe_counts_where_the_kernel_flags_say_nothing(tmp_path):
    missing = str(tmp_path / "no")
    probes = {"torch": lambda: True, "cpuinfo": lambda: bf16_policy._from_cpuinfo(missing),
              "sysctl": lambda: None}
    assert cpu_has_native_bf16(probes=probes) is True
    assert cpu_has_native_bf16(probes={**probes, "torch": lambda: False}) is False
    assert cpu_has_native_bf16(probes={**probes, "torch": lambda: None}) is None


def test_torch_probe_agrees_with_this_machines_cpuinfo_where_both_tell():
    report = bf16_policy.cpu_bf16_report()
    if report["torch"] is None or report["cpuinfo"] is None:
        pytest.skip(f"one source cannot tell on this machine: {report}")
    assert report["torch"] == report["cpuinfo"]


@pytest.mark.parametrize("policy, native, uses_bf16", [
    ("auto", True, True), ("auto", False, False), ("auto", None, True),
    ("always", False, True), ("always", True, True)])
def test_policy_decides_bf16_from_the_cpus_answer(policy, native, uses_bf16, monkeypatch):
    # native None: no source can tell, on whatever CPU runs the test (not this machine's answer)
    monkeypatch.setattr(bf16_policy, "_native_here", lambda: None)
    use, message = resolve_cpu_bf16(policy, what="training", key="SOLVER.AMP.ENABLED",
                                    native=native)
    assert use is uses_bf16
    assert bool(message) is (not uses_bf16)
    if message:
        assert message.startswith("SOLVER.AMP.ENABLED: this CPU has no native bf16")
        assert "training runs in float32" in message and "CPU_BF16 always" in message


def test_an_unknown_policy_names_the_key():
    with pytest.raises(ValueError, match=r"MODEL\.FCOS\.CPU_BF16: unknown 'sometimes'"):
        resolve_cpu_bf16("sometimes", what="training", key="SOLVER.AMP.ENABLED", native=True)
    cfg = _tiny_cfg(CPU_BF16="sometimes")
    with pytest.raises(ValueError, match=r"MODEL\.FCOS\.CPU_BF16: unknown 'sometimes'"):
        build_model(cfg)


def _tiny_cfg(**fcos):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS = 32, 1
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    return cfg


def _detections(cfg):
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    head_dtypes = []
    model.head.register_forward_hook(lambda m, args, out: head_dtypes.append(out[0][0].dtype))
    image = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0)) * 255
    with torch.no_grad():
        instances = model([{"image": image}])[0]["instances"]
    return head_dtypes[0], instances


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(bf16_policy, "_native_here", lambda: False)
    bf16_policy._log_once.cache_clear()


def test_bf16_inference_runs_float32_on_a_cpu_without_native_bf16(cpu_without_bf16, caplog):
    with caplog.at_level(logging.WARNING, logger="fcos_d2"):
        dtype, fallback = _detections(_tiny_cfg(INFERENCE_DTYPE="bfloat16", INFERENCE_TH_TEST=0.0))
        _detections(_tiny_cfg(INFERENCE_DTYPE="bfloat16", INFERENCE_TH_TEST=0.0))
    _, float32 = _detections(_tiny_cfg(INFERENCE_TH_TEST=0.0))
    assert dtype == torch.float32
    assert torch.equal(fallback.scores, float32.scores)
    assert torch.equal(fallback.pred_boxes.tensor, float32.pred_boxes.tensor)
    lines = [r.message for r in caplog.records if "no native bf16" in r.message]
    assert len(lines) == 1 and lines[0].startswith("MODEL.FCOS.INFERENCE_DTYPE:")


def test_cpu_bf16_always_keeps_bf16_inference_on_such_a_cpu(cpu_without_bf16):
    dtype, _ = _detections(_tiny_cfg(INFERENCE_DTYPE="bfloat16", CPU_BF16="always"))
    assert dtype == torch.bfloat16


@pytest.mark.parametrize("policy, precision", [("auto", torch.float32),
                                               ("always", torch.bfloat16)])
def test_train_net_amp_trains_float32_on_a_cpu_without_native_bf16(
        tmp_path, monkeypatch, cpu_without_bf16, caplog, policy, precision):
    register_two_images(tmp_path, f"bf16_tiny_{policy}")
    cfg = _tiny_cfg(CPU_BF16=policy)
    cfg.merge_from_list(["SOLVER.AMP.ENABLED", True, "SOLVER.IMS_PER_BATCH", 2,
                         "SOLVER.MAX_ITER", 1, "DATALOADER.NUM_WORKERS", 0,
                         "DATASETS.TRAIN", (f"bf16_tiny_{policy}",), "DATASETS.TEST", (),
                         "OUTPUT_DIR", str(tmp_path / "output")])
    stem_dtypes, precisions = [], []
    run_step = CPUAMPTrainer.run_step
    monkeypatch.setattr(CPUAMPTrainer, "run_step",
                        lambda self: precisions.append(self.precision) or run_step(self))
    with caplog.at_level(logging.WARNING, logger="fcos_d2"):
        trainer = Trainer(cfg, skip_final_eval=True)
        trainer.model.backbone.bottom_up.stem.register_forward_hook(
            lambda m, args, out: stem_dtypes.append(out.dtype))
        trainer.train()
    assert precisions == [precision] and stem_dtypes == [precision]
    said = [r.message for r in caplog.records if "no native bf16" in r.message]
    assert len(said) == (0 if policy == "always" else 1)
    assert all(line.startswith("SOLVER.AMP.ENABLED:") for line in said)
