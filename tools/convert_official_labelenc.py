"""Converts the official LabelEnc step-1 file (``label_encoding_function.pth``) into the
weights that LabelEnc step 2 reads (MODEL.LABELENC.WEIGHTS), or strips a LabelEnc
checkpoint down to the plain FCOS it trains.

Usage:
    python tools/convert_official_labelenc.py label_encoding_function.pth step1.pth \
        [--config-file configs/LabelEnc/FCOS-R50-step2.yaml]
    python tools/convert_official_labelenc.py --fcos-only output/x/model_0004999.pth fcos.pth

Step 2 also reads the official file directly (converted when read); converting it once
checks it and makes it a data-only file. With --config-file, the LEF and head weights are
checked against the model the config builds: every one filled, none left over, same shapes
(the key mapping is in fcos_d2/modeling/labelenc/weights.py). --fcos-only drops the LEF and
the adapter from any LabelEnc checkpoint (step 2 writes model_final_fcos.pth so itself).
"""
import argparse
import sys

import torch

import fcos_d2  # noqa: F401  (registers FCOS before detectron2 is used)
from fcos_d2.checkpoint import CheckpointMismatchError
from fcos_d2.checkpoint.safe_load import (CheckpointReadError, UnsafeCheckpointError,
                                          load_model_state_dict)
from fcos_d2.modeling.labelenc import convert_official_labelenc, fcos_state_dict
from fcos_d2.modeling.labelenc.weights import (HEAD_PREFIX, LEF_PREFIX,
                                               check_matches)


def check_against_config(state, config_file: str) -> None:
    """Raises CheckpointMismatchError unless ``state`` fills exactly the LEF and the head of
    the LabelEnc model of ``config_file``."""
    from detectron2.config import get_cfg

    from fcos_d2.modeling.labelenc import LabelEncStep2

    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(config_file)
    cfg.MODEL.DEVICE = "cpu"
    own = {k: v for k, v in LabelEncStep2(cfg).state_dict().items()
           if k.startswith((LEF_PREFIX, HEAD_PREFIX))}
    check_matches(own, state, f"the LEF and head of {config_file}'s model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", help="official label_encoding_function.pth (or, with "
                                    "--fcos-only, a LabelEnc checkpoint)")
    parser.add_argument("dst", help="where to write the result")
    parser.add_argument("--config-file", help="check the LEF and head against this config's "
                                              "LabelEnc model")
    parser.add_argument("--fcos-only", action="store_true",
                        help="write the plain FCOS weights of a LabelEnc checkpoint")
    args = parser.parse_args()
    try:
        state = load_model_state_dict(args.src)
    except (CheckpointReadError, UnsafeCheckpointError) as error:
        sys.exit(str(error))
    try:
        if args.fcos_only:
            converted, author = fcos_state_dict(state), "fcos-d2 LabelEnc (plain FCOS weights)"
        else:
            converted, author = convert_official_labelenc(state), "official LabelEnc step 1"
            if args.config_file:
                check_against_config(converted, args.config_file)
    except CheckpointMismatchError as e:
        sys.exit(f"{args.src}: {e}")
    torch.save({"model": converted, "__author__": author + ", converted by fcos-d2",
                "matching_heuristics": False}, args.dst)
    print(f"wrote {args.dst}: {len(converted)} tensors")


if __name__ == "__main__":
    main()
