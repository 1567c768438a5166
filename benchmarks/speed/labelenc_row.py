"""The labelenc row of ``python -m benchmarks.speed``: what LabelEnc's step 2 leaves for
inference is a plain FCOS. The weights of a ``configs/LabelEnc/FCOS-R50-step2.yaml``
training model, without the LEF and the adapter (``fcos_state_dict``, as
``model_final_fcos.pth``), load strictly into the plain FCOS of ``configs/FCOS-R50.yaml``;
that model is timed against a plain FCOS-R50 of its own weights, interleaved, both as
inference runs them (the fast path of the configs), with parameters and backbone + head
MACs (fvcore) counted."""
from pathlib import Path
from typing import Callable, List

import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.modeling.fast_inference import fast_inference_enabled, inference_model
from fcos_d2.modeling.labelenc.weights import fcos_state_dict

REPO = Path(__file__).resolve().parents[2]
STEP2_CONFIG = REPO / "configs" / "LabelEnc" / "FCOS-R50-step2.yaml"


def _cfg(path: Path, device: str, *opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(path))
    cfg.merge_from_list(["MODEL.DEVICE", device, "MODEL.WEIGHTS", "", *opts])
    return cfg


def labelenc_plain_model(device: str, config: Path = STEP2_CONFIG, *opts) -> torch.nn.Module:
    """The plain FCOS (META_ARCH "FCOS", ``MODEL.LABELENC.STEP 0`` of `config`) holding the
    weights of a step-2 training model of `config`, loaded strictly."""
    step2 = build_model(_cfg(config, device, *opts))
    plain = build_model(_cfg(config, device, "MODEL.META_ARCHITECTURE", "FCOS",
                             "MODEL.LABELENC.STEP", 0, *opts))
    plain.load_state_dict(fcos_state_dict(step2.state_dict()), strict=True)
    return plain


def row(args, interleaved: Callable, macs: Callable, image_size) -> List[dict]:
    from benchmarks.speed import contenders as bc

    torch.manual_seed(0)
    cfg = bc.fcos_d2_cfg(args.device)  # configs/FCOS-R50.yaml
    models = {"plain FCOS-R50": build_model(cfg),
              "LabelEnc step 2's FCOS-R50": labelenc_plain_model(args.device)}
    contenders = {name: bc._detectron2_style(name, inference_model(
        model.to(args.device).eval(), fast_inference_enabled(cfg)))
        for name, model in models.items()}
    images = bc.random_images(1, *image_size, args.device)
    with torch.no_grad():
        medians = interleaved({name: (lambda c=c: c.infer(images))
                               for name, c in contenders.items()}, args.repeats, args.device)
        counted = {name: macs(c, images) for name, c in contenders.items()}
    print(f"\n[labelenc: the FCOS LabelEnc's step 2 leaves against plain FCOS-R50, fp32, "
          f"batch 1, {'x'.join(map(str, image_size))}, as inference runs them]")
    results = []
    plain = "plain FCOS-R50"
    for name, model in models.items():
        params = sum(p.numel() for p in model.parameters())
        result = {"row": "labelenc", "contender": name, "seconds": medians[name],
                  "parameters": params, "gmacs": counted[name] / 1e9,
                  "latency_vs_plain": medians[name] / medians[plain]}
        results.append(result)
        print(f"  {name:28s} {medians[name] * 1000:8.0f} ms  {params / 1e6:.2f} M parameters  "
              f"{counted[name] / 1e9:.1f} GMACs  {result['latency_vs_plain']:.2f}x plain")
    return results
