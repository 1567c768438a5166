"""Image files of every common kind load as the (C, H, W) uint8 image in INPUT.FORMAT that the
model expects, through the mapper of training and evaluation; a file that cannot be decoded
is an error naming it and its image id."""
import numpy as np
import pytest
import torch
from detectron2.data.detection_utils import SizeMismatchError
from PIL import Image

from fcos_d2.data.images import UnreadableImageError, read_image
from fcos_d2.data.mapper import FCOSDatasetMapper


def load(path, image_format="BGR", image_id=7) -> np.ndarray:
    """The mapper's image of the file, as (H, W, C) uint8."""
    mapper = FCOSDatasetMapper(is_train=False, augmentations=[], image_format=image_format)
    image = mapper({"file_name": str(path), "image_id": image_id})["image"]
    assert image.dtype == torch.uint8
    return image.permute(1, 2, 0).numpy()  # (C, H, W) -> (H, W, C)


def test_16_bit_grayscale_png_is_scaled_to_8_bits_not_clipped(tmp_path):
    values = np.array([[0, 256, 1000], [32768, 65280, 65535]], dtype=np.uint16)  # (2, 3)
    Image.fromarray(values).save(tmp_path / "depth.png")
    assert Image.open(tmp_path / "depth.png").mode == "I;16"
    image = load(tmp_path / "depth.png")
    assert image.shape == (2, 3, 3)
    expected = np.array([[0, 1, 4], [128, 254, 255]])  # round(v * 255 / 65535)
    for channel in range(3):
        np.testing.assert_array_equal(image[..., channel], expected)


def upright_test_card() -> np.ndarray:
    """(16, 24, 3) black image, white in its top-left 8 x 8 corner."""
    pixels = np.zeros((16, 24, 3), dtype=np.uint8)
    pixels[:8, :8] = 255
    return pixels


@pytest.mark.parametrize("orientation, white_corner", [
    (6, (slice(0, 8), slice(8, 16))),  # shown turned 90 degrees clockwise: top right
    (8, (slice(16, 24), slice(0, 8))),  # 90 degrees counter-clockwise: bottom left
])
def test_exif_rotated_jpeg_loads_as_displayed(tmp_path, orientation, white_corner):
    picture = Image.fromarray(upright_test_card())
    exif = picture.getexif()
    exif[274] = orientation
    picture.save(tmp_path / "photo.jpg", exif=exif, quality=95)
    image = load(tmp_path / "photo.jpg")
    assert image.shape == (24, 16, 3)  # (H, W) swapped
    white = np.zeros((24, 16), dtype=bool)
    white[white_corner] = True
    assert image[white].min() > 200 and image[~white].max() < 55


def test_exif_rotated_jpeg_annotated_as_stored_is_an_error_that_says_so(tmp_path):
    picture = Image.fromarray(upright_test_card())  # 24 wide, 16 high as stored
    exif = picture.getexif()
    exif[274] = 6
    picture.save(tmp_path / "photo.jpg", exif=exif)
    mapper = FCOSDatasetMapper(is_train=False, augmentations=[], image_format="BGR")
    with pytest.raises(SizeMismatchError, match=r"photo.jpg, got \(16, 24\), expect \(24, 16\).* "
                       r"\(image id 3\) Width and height are swapped: .* EXIF orientation"):
        mapper({"file_name": str(tmp_path / "photo.jpg"), "image_id": 3, "width": 24,
                "height": 16})


def test_grayscale_png_is_replicated_into_the_three_channels(tmp_path):
    Image.fromarray(np.array([[77, 0], [255, 9]], dtype=np.uint8)).save(tmp_path / "gray.png")
    image = load(tmp_path / "gray.png")
    assert image.shape == (2, 2, 3)
    for channel in range(3):
        np.testing.assert_array_equal(image[..., channel], [[77, 0], [255, 9]])


@pytest.mark.parametrize("image_format, expected", [("BGR", [50, 100, 200]),
                                                   ("RGB", [200, 100, 50])])
def test_rgba_png_keeps_its_colours_and_drops_alpha(tmp_path, image_format, expected):
    pixels = np.zeros((2, 2, 4), dtype=np.uint8)
    pixels[..., :3] = [200, 100, 50]
    pixels[..., 3] = [[0, 128], [255, 30]]  # the alpha values do not matter
    Image.fromarray(pixels, mode="RGBA").save(tmp_path / "rgba.png")
    image = load(tmp_path / "rgba.png", image_format)
    assert image.shape == (2, 2, 3)
    assert (image.reshape(4, 3) == expected).all()


def test_palette_png_loads_the_palette_colours(tmp_path):
    picture = Image.fromarray(np.array([[0, 1, 1]], dtype=np.uint8)).convert("P")
    picture.putpalette([10, 20, 30, 250, 0, 5] + [0, 0, 0] * 254)
    picture.save(tmp_path / "palette.png")
    assert Image.open(tmp_path / "palette.png").mode == "P"
    np.testing.assert_array_equal(load(tmp_path / "palette.png")[0],
                                  [[30, 20, 10], [5, 0, 250], [5, 0, 250]])  # BGR


def test_grayscale_format_gives_one_channel(tmp_path):
    Image.fromarray(np.full((3, 5, 3), 60, dtype=np.uint8)).save(tmp_path / "rgb.png")
    assert load(tmp_path / "rgb.png", "L").shape == (3, 5, 1)


def test_corrupt_file_is_an_error_naming_the_file_and_image_id(tmp_path):
    (tmp_path / "broken.jpg").write_bytes(b"this is not a JPEG")
    with pytest.raises(UnreadableImageError, match=r"cannot read image file .*broken.jpg "
                       r"\(image id 7\): not an image file Pillow can decode") as error:
        load(tmp_path / "broken.jpg")
    assert "BufferedReader" not in str(error.value)


def test_truncated_file_is_an_error_naming_the_file_and_image_id(tmp_path):
    noise = np.random.default_rng(0).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "whole.jpg", quality=90)
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[:len(data) // 2])
    with pytest.raises(UnreadableImageError, match=r"cannot read image file .*cut.jpg "
                       r"\(image id 12\): image file is truncated"):
        load(tmp_path / "cut.jpg", image_id=12)


def test_missing_file_stays_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_image(str(tmp_path / "gone.png"), "BGR")
