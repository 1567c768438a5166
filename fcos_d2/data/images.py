"""Reading image files: detectron2's ``read_image`` with 16-bit images and clear errors.

What each kind of file becomes (``read_image(..., format="BGR")``, (H, W, 3) uint8):

* EXIF orientation (JPEG tag 274, values 2-8): applied, so the array is the image as
  viewers display it; annotations must describe that (rotated) image.
* grayscale ("L", "1"): the gray value in all three channels.
* RGBA, LA (and palette transparency): the alpha is dropped (not composited): colours as
  stored.
* palette ("P"): the palette's colours.
* 16-bit grayscale PNG (Pillow modes "I;16*", or "I"): scaled from 0..65535 to 0..255,
  v -> round(v * 255 / 65535), so 65535 -> 255 and 32768 -> 128. detectron2's
  ``read_image`` clips them instead: every value from 255 up turns white.
* 16-bit RGB(A) PNGs: Pillow keeps the high byte, nearly the same scaling.

A file that cannot be decoded (corrupt, truncated, not an image) raises
``UnreadableImageError`` naming the file, the image id when known, and what is wrong.
"""
from typing import Optional

import numpy as np
from detectron2.data.detection_utils import convert_PIL_to_numpy
from detectron2.utils.file_io import PathManager
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["UnreadableImageError", "read_image", "to_8_bit"]

_EXIF_ORIENTATION = 274  # 1 = upright; 2-8 = flipped and/or rotated
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class UnreadableImageError(OSError):
    """An image file that exists but cannot be decoded."""


def read_image(file_name: str, format: Optional[str] = None, *,
               image_id: Optional[object] = None) -> np.ndarray:
    """Reads an image file as detectron2's ``read_image`` does, with 16-bit images scaled.

    Args:
        file_name: the image file.
        format: ``INPUT.FORMAT``: "BGR", "RGB", "L", another Pillow mode, "YUV-BT.601",
            or None to keep the file's mode (after the 16-bit scaling).
        image_id: named in errors, e.g. the dataset dict's "image_id".

    Returns:
        (H, W, C) array: uint8 0..255 for "BGR", "RGB" (C = 3) and "L" (C = 1); as
        detectron2's ``convert_PIL_to_numpy`` returns it for other formats.

    Raises:
        FileNotFoundError: the file does not exist.
        UnreadableImageError: the file cannot be decoded.
    """
    try:
        with PathManager.open(file_name, "rb") as f:
            image = Image.open(f)
            image.load()  # decodes now, so that a truncated file fails here
    except FileNotFoundError:
        raise
    except UnidentifiedImageError as e:
        raise _unreadable(file_name, image_id, "not an image file Pillow can decode (unknown "
                          "format or damaged header)") from e
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise _unreadable(file_name, image_id, str(e)) from e
    image = to_8_bit(_upright(image))
    return convert_PIL_to_numpy(image, format)


def to_8_bit(image: Image.Image) -> Image.Image:
    """Returns a 16-bit grayscale image scaled to 8 bits ("L"), other images unchanged.

    A value v in 0..65535 becomes round(v * 255 / 65535); mode "I" (32-bit integers, how
    older Pillow versions open 16-bit PNGs) is read as 16-bit, values outside clipped.
    """
    if image.mode not in _SIXTEEN_BIT_MODES:
        return image
    pixels = np.asarray(image).astype(np.float32)  # (H, W) 0..65535
    scaled = np.rint(np.clip(pixels, 0, 65535) * np.float32(255 / 65535))
    return Image.fromarray(scaled.astype(np.uint8))  # (H, W) uint8: mode "L"


def _upright(image: Image.Image) -> Image.Image:
    """Applies the EXIF orientation; an unreadable EXIF block is ignored, as detectron2 does."""
    try:
        orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001  (Pillow raises various errors on malformed EXIF)
        return image
    return ImageOps.exif_transpose(image) if orientation in range(2, 9) else image


def _unreadable(file_name: str, image_id: Optional[object], reason: str) -> UnreadableImageError:
    listed = "" if image_id is None else f" (image id {image_id})"
    return UnreadableImageError(
        f"cannot read image file {file_name}{listed}: {reason}. Replace the file with a "
        "readable copy, or remove the image from the dataset's annotations.")
