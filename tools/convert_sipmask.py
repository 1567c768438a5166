"""Converts a SipMask-benchmark checkpoint into one that MODEL.WEIGHTS loads.

Usage:
    python tools/convert_sipmask.py SipMask_R50_1x.pth sipmask_R_50_1x.pth \
        --config-file configs/SipMask/SipMask-R50-1x.yaml
    python train_net.py --config-file configs/SipMask/SipMask-R50-1x.yaml --eval-only \
        MODEL.WEIGHTS sipmask_R_50_1x.pth

SipMask_R50_1x.pth and SipMask_R101_3x.pth are the models published with
JialeCao001/SipMask (folder SipMask-benchmark). With --config-file, the result is also
checked against the model that config builds: every parameter filled, none left over (the
key mapping: fcos_d2/checkpoint/sipmask.py).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fcos_d2  # noqa: E402  (registers FCOS and SipMask before detectron2 is used)
from fcos_d2.checkpoint import (CheckpointMismatchError, CheckpointReadError,  # noqa: E402
                                UnsafeCheckpointError, check_matches_model,
                                convert_sipmask_state_dict)
from fcos_d2.checkpoint.safe_load import load_model_state_dict  # noqa: E402


def build_model_from_config(config_file: str):
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(config_file)
    cfg.MODEL.DEVICE = "cpu"
    return build_model(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="SipMask-benchmark checkpoint ({'model': state_dict})")
    parser.add_argument("dst", help="where to write the converted checkpoint")
    parser.add_argument("--config-file", help="check the result against this config's model")
    args = parser.parse_args()
    try:
        state_dict = load_model_state_dict(args.src)
    except (CheckpointReadError, UnsafeCheckpointError) as error:
        sys.exit(str(error))
    try:
        converted = convert_sipmask_state_dict(state_dict)
        if args.config_file:
            check_matches_model(converted, build_model_from_config(args.config_file))
    except CheckpointMismatchError as e:
        sys.exit(f"{args.src}: {e}")
    torch.save({"model": converted, "__author__": "SipMask-benchmark, converted by fcos-d2",
                "matching_heuristics": False}, args.dst)
    print(f"wrote {args.dst}: {len(converted)} tensors")


if __name__ == "__main__":
    main()
