"""Converts an AdelaiDet FCOS checkpoint into one that fcos-d2's MODEL.WEIGHTS loads.

Usage:
    python tools/convert_adelaidet_fcos.py FCOS_R_50_1x.pth fcos_R_50_1x_adet.pth \
        [--config-file configs/FCOS-R50.yaml | --adelaidet-config AdelaiDet/configs/FCOS-Detection/R_50_1x.yaml]

With --config-file, the result is checked against the model that fcos-d2 config builds:
every parameter must be filled and none left over. With --adelaidet-config, the AdelaiDet
config is translated into an fcos-d2 config (written next to DST as DST.yaml, MODEL.WEIGHTS
set to DST; options without an fcos-d2 equivalent are an error that lists them) and the
result is checked against its model. The key mapping is in fcos_d2/checkpoint/adelaidet.py.
"""
import argparse
import sys
from pathlib import Path


import torch

import fcos_d2  # noqa: F401  (registers FCOS before detectron2 is used)
from fcos_d2.checkpoint.safe_load import (CheckpointReadError, UnsafeCheckpointError,
                                          load_model_state_dict)
from fcos_d2.checkpoint import (AdelaiDetConfigError, CheckpointMismatchError,
                                check_matches_model, convert_adelaidet_state_dict,
                                fcos_d2_config_from_adelaidet)

DETECTRON2_PIXEL_MEAN = [103.53, 116.28, 123.675]  # detectron2's default, AdelaiDet's too


def fcos_d2_config(args):
    """(the fcos-d2 config to check against or None, warnings)."""
    if args.adelaidet_config:
        cfg, warnings = fcos_d2_config_from_adelaidet(args.adelaidet_config)
        cfg.MODEL.WEIGHTS = str(Path(args.dst).resolve())
        return cfg, warnings
    if not args.config_file:
        return None, []
    from detectron2.config import get_cfg

    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    return cfg, []


def pixel_warnings(cfg, pixels) -> list:
    """Where the checkpoint's (or AdelaiDet's default) input normalization differs from cfg."""
    expected = {"pixel_mean": pixels["pixel_mean"] or DETECTRON2_PIXEL_MEAN,
                "pixel_std": pixels["pixel_std"]}
    warnings = []
    for key, values in expected.items():
        ours = list(cfg.MODEL[key.upper()])
        if values is not None and any(abs(a - b) > 1e-3 for a, b in zip(values, ours)):
            source = "the checkpoint" if pixels[key] else "AdelaiDet's default config"
            warnings.append(f"MODEL.{key.upper()}: {source} normalizes with {values}, the config "
                            f"with {ours}; evaluate with MODEL.{key.upper()} '{values}'")
    return warnings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="AdelaiDet checkpoint ({'model': state_dict})")
    parser.add_argument("dst", help="where to write the converted checkpoint")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--config-file", help="check the result against this fcos-d2 config")
    group.add_argument("--adelaidet-config",
                       help="the AdelaiDet config of the checkpoint: write the equivalent "
                            "fcos-d2 config to DST.yaml and check the result against it")
    args = parser.parse_args()
    try:
        state_dict = load_model_state_dict(args.src)
    except (CheckpointReadError, UnsafeCheckpointError) as error:
        sys.exit(str(error))
    try:
        converted, pixels = convert_adelaidet_state_dict(state_dict)
        cfg, warnings = fcos_d2_config(args)
        if cfg is not None:
            from detectron2.modeling import build_model

            cfg.MODEL.DEVICE = "cpu"
            check_matches_model(converted, build_model(cfg))
            warnings += pixel_warnings(cfg, pixels) if args.config_file else []
    except CheckpointMismatchError as e:
        sys.exit(f"{args.src}: {e}")
    except AdelaiDetConfigError as e:
        sys.exit(str(e))
    torch.save({"model": converted, "__author__": "AdelaiDet FCOS, converted by fcos-d2",
                "matching_heuristics": False}, args.dst)
    print(f"wrote {args.dst}: {len(converted)} tensors")
    if args.adelaidet_config:
        config_path = f"{args.dst}.yaml"
        Path(config_path).write_text(cfg.dump())
        print(f"wrote {config_path}: the fcos-d2 config of {args.adelaidet_config}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


if __name__ == "__main__":
    main()
