"""SipMask's crop-split and ground-truth crop in plain PyTorch, against a plain loop that
follows the rules of SipMask's CUDA kernels pixel by pixel."""
import pytest
import torch

from fcos_d2.modeling.sipmask.crop_split import box_inside_masks, crop_split, crop_to_boxes


def loop_crop_split(maps, boxes):
    """The CUDA kernel's rule, one pixel at a time: inside x1 <= x < x2 (and y), cell
    width (x2 - x1 + 0.1) / 2, quadrant row * 2 + column."""
    num, _, height, width = maps.shape
    out = torch.zeros(num, height, width, dtype=maps.dtype)
    for p, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        cell_w, cell_h = (x2 - x1 + 0.1) / 2, (y2 - y1 + 0.1) / 2
        for y in range(height):
            for x in range(width):
                if x1 <= x < x2 and y1 <= y < y2:
                    quadrant = int((y - y1) / cell_h) * 2 + int((x - x1) / cell_w)
                    out[p, y, x] = maps[p, quadrant, y, x]
    return out


# Fractional boxes, one past every border, one of a single pixel, one with no pixel.
BOXES = torch.tensor([[1.0, 2.0, 7.0, 6.0], [0.5, 0.25, 4.5, 3.75], [-3.0, -2.0, 12.0, 11.0],
                      [5.0, 5.0, 5.5, 5.5], [2.2, 2.2, 2.8, 2.8], [6.0, 0.0, 10.0, 9.0]])


def test_crop_split_equals_the_per_pixel_loop_of_the_cuda_kernel():
    maps = torch.randn(len(BOXES), 4, 9, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(crop_split(maps, BOXES), loop_crop_split(maps, BOXES))


def test_each_quadrant_of_a_box_shows_its_own_map():
    # Quadrant maps 1, 2, 3, 4 everywhere; the box covers pixels 0..3 in x and y. Cells are
    # 2.05 wide, so pixel 2 (2 / 2.05 < 1) still lies in the first: top-left 1, top-right
    # 2, bottom-left 3, bottom-right 4, zero outside.
    maps = torch.arange(1.0, 5.0).reshape(1, 4, 1, 1).expand(1, 4, 5, 5)
    out = crop_split(maps, torch.tensor([[0.0, 0.0, 4.0, 4.0]]))[0]
    assert out[:4, :4].tolist() == [[1, 1, 1, 2], [1, 1, 1, 2], [1, 1, 1, 2], [3, 3, 3, 4]]
    assert out[4].abs().sum() == 0 and out[:, 4].abs().sum() == 0


def test_gradients_reach_only_the_quadrant_each_pixel_shows():
    maps = torch.zeros(1, 4, 4, 4, requires_grad=True)
    crop_split(maps, torch.tensor([[0.0, 0.0, 4.0, 2.0]])).sum().backward()
    # Rows 0..1 inside, both in the top cells (1 / 1.05 < 1); columns 0..2 left, 3 right.
    assert maps.grad[0, 0].tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert maps.grad[0, 1].tolist() == [[0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert maps.grad[0, 2:].sum() == 0


def test_ground_truth_crop_keeps_in_image_pixels_of_a_box_past_the_border():
    masks = torch.ones(1, 3, 4)
    out = crop_to_boxes(masks, torch.tensor([[-5.0, 1.0, 100.0, 100.0]]))
    assert out[0].tolist() == [[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]


def test_ground_truth_crop_of_tiny_boxes_keeps_only_the_integer_pixels_they_hold():
    masks = torch.ones(2, 5, 5)
    out = crop_to_boxes(masks, torch.tensor([[3.0, 1.0, 3.5, 1.5], [2.2, 2.2, 2.8, 2.8]]))
    assert out[0].nonzero().tolist() == [[1, 3]]  # pixel (x 3, y 1) only
    assert out[1].sum() == 0  # no integer coordinate lies in [2.2, 2.8)


def test_inside_masks_of_no_boxes_and_bad_shapes_are_clear():
    assert box_inside_masks(torch.zeros(0, 4), 3, 3).shape == (0, 3, 3)
    with pytest.raises(ValueError, match="crop_split: maps must be"):
        crop_split(torch.zeros(2, 3, 4, 4), torch.zeros(2, 4))


def test_gpu_gives_the_cpu_result():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the GPU path is the same PyTorch code on CUDA tensors")
    maps = torch.randn(len(BOXES), 4, 9, 10)
    expected = crop_split(maps, BOXES)
    assert torch.equal(crop_split(maps.cuda(), BOXES.cuda()).cpu(), expected)
    assert torch.equal(crop_to_boxes(maps[:, 0].cuda(), BOXES.cuda()).cpu(),
                       crop_to_boxes(maps[:, 0], BOXES))


def test_cell_width_rounding_follows_the_kernel_at_a_cell_boundary():
    # Box [0, 20): cells of width 10.05; pixel 10 lies in the left cell (10 / 10.05 < 1).
    maps = torch.stack([torch.zeros(1, 21), torch.ones(1, 21)] * 2)[None]  # (1, 4, 1, 21)
    out = crop_split(maps, torch.tensor([[0.0, 0.0, 20.0, 1.0]]))[0, 0]
    assert out[:11].sum() == 0 and out[11:20].tolist() == [1] * 9 and out[20] == 0
