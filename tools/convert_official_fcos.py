"""Converts a checkpoint of the official FCOS repo into one that MODEL.WEIGHTS loads.

Usage:
    python tools/convert_official_fcos.py FCOS_imprv_R_50_FPN_1x.pth fcos_R_50_1x.pth \
        [--config-file configs/FCOS-R50.yaml]

With --config-file, the result is also checked against the model that config builds:
every parameter must be filled and none left over (the key mapping is in docs/deployment.md and
in fcos_d2/checkpoint/official.py).
"""
import argparse
import sys

import torch

import fcos_d2  # noqa: F401  (registers FCOS before detectron2 is used)
from fcos_d2.checkpoint.safe_load import (CheckpointReadError, UnsafeCheckpointError,
                                          load_model_state_dict)
from fcos_d2.checkpoint import (CheckpointMismatchError, check_matches_model,
                                convert_official_state_dict)


def build_model_from_config(config_file: str):
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(config_file)
    cfg.MODEL.DEVICE = "cpu"
    return build_model(cfg)


def convert_file(description: str, *, source_name: str, convert) -> None:
    """The command line of a converter: SRC DST [--config-file CFG]; ``convert`` renames a
    state dict (raising CheckpointMismatchError), ``source_name`` says whose it was."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("src", help=f"{source_name} checkpoint ({{'model': state_dict}})")
    parser.add_argument("dst", help="where to write the converted checkpoint")
    parser.add_argument("--config-file", help="check the result against this config's model")
    args = parser.parse_args()
    try:
        state_dict = load_model_state_dict(args.src)
    except (CheckpointReadError, UnsafeCheckpointError) as error:
        sys.exit(str(error))
    try:
        converted = convert(state_dict)
        if args.config_file:
            check_matches_model(converted, build_model_from_config(args.config_file))
    except CheckpointMismatchError as e:
        sys.exit(f"{args.src}: {e}")
    torch.save({"model": converted, "__author__": f"{source_name}, converted by fcos-d2",
                "matching_heuristics": False}, args.dst)
    print(f"wrote {args.dst}: {len(converted)} tensors")


def main() -> None:
    convert_file(__doc__.splitlines()[0], source_name="official FCOS",
                 convert=convert_official_state_dict)


if __name__ == "__main__":
    main()
