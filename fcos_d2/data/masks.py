"""Instance masks as JSON: COCO compressed RLE, for annotation files (the synthetic set
with masks) and for detection listings (``fcos_d2.visualization``)."""
import numpy as np
import pycocotools.mask as mask_util

__all__ = ["mask_to_rle"]


def mask_to_rle(mask: np.ndarray) -> dict:
    """Encodes an (H, W) bool mask as a JSON-ready COCO compressed RLE.

    Returns:
        ``{"size": [H, W], "counts": str}``; ``pycocotools.mask.decode`` reads it back.
    """
    rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(n) for n in rle["size"]], "counts": rle["counts"].decode("ascii")}
