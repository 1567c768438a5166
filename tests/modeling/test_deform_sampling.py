"""The CPU deformable conv (``deform_sampling``) is torchvision's ``deform_conv2d``: the same
outputs and gradients (float64, random offsets that leave the image, strides, dilations,
deform groups and conv groups), and DeformConv2d uses it on the CPU."""
import pytest
import torch
from torchvision.ops import deform_conv2d

from fcos_d2.modeling import layers
from fcos_d2.modeling.deform_sampling import sampled_deform_conv2d
from fcos_d2.modeling.layers import DeformConv2d


def _inputs(size, *, deform_groups, conv_groups, stride, padding, dilation, modulated):
    n, c, o, h, w = 2, 4, 6, *size
    ho = (h + 2 * padding - 2 * dilation - 1) // stride + 1
    wo = (w + 2 * padding - 2 * dilation - 1) // stride + 1
    torch.manual_seed(0)
    make = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    x, weight, bias = make(n, c, h, w), make(o, c // conv_groups, 3, 3), make(o)
    offset = (3.0 * torch.randn(n, 2 * deform_groups * 9, ho, wo, dtype=torch.float64)
              ).requires_grad_()  # 3 px: many samples fall outside the image
    mask = torch.rand(n, deform_groups * 9, ho, wo, dtype=torch.float64,
                      requires_grad=True) if modulated else None
    return [x, offset, weight, bias, mask]


@pytest.mark.parametrize("size, deform_groups, conv_groups, stride, padding, dilation, modulated", [
    ((7, 9), 2, 1, 1, 1, 1, True), ((8, 6), 1, 2, 2, 2, 2, False), ((1, 1), 1, 1, 1, 1, 1, True)])
def test_sampled_deform_conv_equals_torchvision_forward_and_backward(
        size, deform_groups, conv_groups, stride, padding, dilation, modulated):
    x, offset, weight, bias, mask = _inputs(size, deform_groups=deform_groups,
                                            conv_groups=conv_groups, stride=stride,
                                            padding=padding, dilation=dilation,
                                            modulated=modulated)
    options = dict(stride=stride, padding=padding, dilation=dilation, mask=mask)
    expected = deform_conv2d(x, offset, weight, bias, **options)
    got = sampled_deform_conv2d(x, offset, weight, bias, **options)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    leaves = [t for t in (x, offset, weight, bias, mask) if t is not None]
    upstream = torch.randn_like(expected)
    for g, e in zip(torch.autograd.grad((got * upstream).sum(), leaves),
                    torch.autograd.grad((expected * upstream).sum(), leaves)):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-11)


def test_offset_channels_that_do_not_fit_are_refused_naming_the_counts():
    x, weight = torch.randn(1, 4, 5, 5), torch.randn(4, 4, 3, 3)
    with pytest.raises(ValueError, match=r"offset channels 10 are not 2 \* 9 taps"):
        sampled_deform_conv2d(x, torch.zeros(1, 10, 5, 5), weight, padding=1)


def test_deform_conv2d_module_takes_the_sampled_path_on_the_cpu(monkeypatch):
    calls = []
    original = layers.sampled_deform_conv2d
    monkeypatch.setattr(layers, "sampled_deform_conv2d",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    module = DeformConv2d(4, 4, 3, padding=1, deform_groups=2)
    out = module(torch.randn(1, 4, 6, 6))
    assert calls == [1] and out.shape == (1, 4, 6, 6)


def test_bf16_autocast_on_the_cpu_gives_bf16_close_to_float32():
    torch.manual_seed(0)
    module = DeformConv2d(8, 8, 3, padding=1)
    torch.nn.init.normal_(module.offset.weight, std=0.1)  # real offsets
    x = torch.randn(2, 8, 6, 6)
    reference = module(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = module(x)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), reference, rtol=0.05, atol=0.05)
