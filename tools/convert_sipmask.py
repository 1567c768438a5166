"""Converts a SipMask-benchmark checkpoint into one that MODEL.WEIGHTS loads.

Usage:
    python tools/convert_sipmask.py SipMask_R50_1x.pth sipmask_R_50_1x.pth \
        --config-file configs/SipMask/SipMask-R50-1x.yaml
    python train_net.py --config-file configs/SipMask/SipMask-R50-1x.yaml --eval-only \
        MODEL.WEIGHTS sipmask_R_50_1x.pth

SipMask_R50_1x.pth and SipMask_R101_3x.pth are the models published with
JialeCao001/SipMask (folder SipMask-benchmark). With --config-file, the result is also
checked against the model that config builds: every parameter filled, none left over (the
key mapping: fcos_d2/modeling/sipmask/checkpoint.py).
"""
from convert_official_fcos import convert_file  # tools/, this script's folder

from fcos_d2.modeling.sipmask import convert_sipmask_state_dict


def main() -> None:
    convert_file(__doc__.splitlines()[0], source_name="SipMask-benchmark",
                 convert=convert_sipmask_state_dict)


if __name__ == "__main__":
    main()
