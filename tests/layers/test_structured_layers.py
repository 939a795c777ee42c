"""Attention over grids and videos: DividedSpaceTimeAttention against Hugging Face's TimesformerLayer,
AxialAttention and MaxViTAttention against the same attentions written with explicit reshapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import masks
from attnlab.layers import AxialAttention, DividedSpaceTimeAttention, MaxViTAttention
from attnlab.layers.spacetime import from_hf_order, to_hf_order

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FP32 = {"rtol": 0.0, "atol": 1e-5}  # the parity bound of the HF layer, float32


def _hf_layer(frames: int, side_h: int, side_w: int, dim: int = 24, heads: int = 3, seed: int = 0, **kw):
    """A random TimesformerLayer whose config fits (T, H, W) patches (HF reads W from image_size // patch_size)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.timesformer.modeling_timesformer import TimesformerLayer

    cfg = transformers.TimesformerConfig(hidden_size=dim, num_attention_heads=heads, intermediate_size=40,
                                         num_frames=frames, image_size=side_w * 4, patch_size=4,
                                         num_hidden_layers=1, **kw)
    torch.manual_seed(seed)
    layer = TimesformerLayer(cfg, 0).eval()
    with torch.no_grad():
        for p in layer.parameters():  # large random weights: every path matters
            p.normal_(0, 0.3)
    return layer


@pytest.mark.parametrize("shape,qkv_bias", [((4, 3, 3), True), ((5, 2, 3), False), ((1, 1, 4), True)])
def test_divided_space_time_equals_hugging_face_timesformer_layer(shape, qkv_bias):
    t, h, w = shape
    hf = _hf_layer(t, h, w, qkv_bias=qkv_bias)
    ours = DividedSpaceTimeAttention.from_hf(hf).eval()
    x = torch.randn(2, 1 + t * h * w, 24, generator=torch.Generator().manual_seed(1))  # HF's (H, W, T) order
    with torch.no_grad():
        want = hf(x)[0]
        got = to_hf_order(ours(from_hf_order(x, shape), shape), shape)
    torch.testing.assert_close(got, want, **FP32)


def test_padded_frames_equal_hugging_face_on_the_real_frames_alone():
    """A batch padded to T=5 frames equals HF's layer configured for each video's real frame count."""
    t, h, w, dim = 5, 2, 3, 24
    full = _hf_layer(t, h, w)
    ours = DividedSpaceTimeAttention.from_hf(full).eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 1 + t * h * w, dim, generator=g)  # attnlab's (T, H, W) order
    real = [5, 3, 1]
    with torch.no_grad():
        got = ours(x, (t, h, w), frames=real)
        for b, f in enumerate(real):
            short = _hf_layer(f, h, w)
            short.load_state_dict(full.state_dict())  # the same weights, num_frames = f
            alone = torch.cat([x[b:b + 1, :1], x[b:b + 1, 1:1 + f * h * w]], 1)  # the class token, real frames
            want = from_hf_order(short(to_hf_order(alone, (f, h, w)))[0], (f, h, w))
            torch.testing.assert_close(got[b:b + 1, :1 + f * h * w], want, **FP32)


def test_without_a_class_token_padded_frames_change_nothing_real():
    t, h, w, dim = 4, 3, 2, 16
    layer = DividedSpaceTimeAttention(dim, 2, ff_dim=32).eval()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, t * h * w, dim, generator=g)
    real = 2 * h * w  # the second video has 2 real frames
    with torch.no_grad():
        out = layer(x, (t, h, w), frames=[4, 2])
        x2 = x.clone()
        x2[1, real:] = 50.0
        out2 = layer(x2, (t, h, w), frames=[4, 2])
        torch.testing.assert_close(out2[1, :real], out[1, :real])
        torch.testing.assert_close(out2[0], out[0])
        # all frames real: the same as passing no frame counts
        torch.testing.assert_close(layer(x, (t, h, w), frames=[4, 4]), layer(x, (t, h, w)))


def test_from_hf_refuses_a_layer_that_is_not_divided():
    hf = _hf_layer(2, 2, 2, attention_type="joint_space_time")
    with pytest.raises(ValueError, match="divided_space_time"):
        DividedSpaceTimeAttention.from_hf(hf)
    with pytest.raises(ValueError, match="TimesformerLayer"):
        DividedSpaceTimeAttention.from_hf(nn.Linear(2, 2))


def test_hf_order_round_trip():
    x = torch.randn(2, 1 + 3 * 2 * 4, 5)
    torch.testing.assert_close(to_hf_order(from_hf_order(x, (3, 2, 4)), (3, 2, 4)), x)
    # HF's token (h, w, t) is attnlab's (t, h, w)
    y = torch.arange(3 * 2 * 4).view(1, -1, 1).float()  # HF index of each token
    ours = from_hf_order(y, (3, 2, 4))[0, :, 0]
    t, h, w = 2, 1, 3
    assert ours[(t * 2 + h) * 4 + w] == (h * 4 + w) * 3 + t


# -- axial and MaxViT --------------------------------------------------------------------------------


def test_axial_attention_is_one_pass_per_axis_in_turn():
    """The same as running each pass's MultiHeadAttention on explicitly reshaped rows / columns / time lines."""
    torch.manual_seed(0)
    t, h, w, dim = 3, 4, 5, 8
    layer = AxialAttention(dim, 2, ndim=3).eval()
    x = torch.randn(2, t * h * w, dim)
    with torch.no_grad():
        got = layer(x, (t, h, w))
        y = x.view(2, t, h, w, dim)
        for axis in range(3):
            moved = y.movedim(1 + axis, 3)  # (B, a, b, L, dim): the attended axis last but one
            lines = moved.reshape(-1, moved.shape[3], dim)  # (B a b, L, dim)
            out = layer.attns[axis](layer.norms[axis](lines)).view(moved.shape)
            y = y + out.movedim(3, 1 + axis)
        torch.testing.assert_close(got, y.reshape(2, -1, dim), rtol=1e-5, atol=1e-5)


def test_one_sequential_axial_layer_reaches_the_whole_grid():
    torch.manual_seed(0)
    layer = AxialAttention(8, 2, ndim=2)
    x = torch.randn(1, 5 * 7, 8, requires_grad=True)
    layer(x, (5, 7))[0, 0].sum().backward()  # the output at (0, 0)
    assert bool((x.grad[0].abs().sum(-1) > 0).all())  # depends on every input position, (4, 6) included


@pytest.mark.parametrize("kind", ["block", "grid"])
def test_maxvit_attention_equals_timm_partitions_when_the_size_divides(kind):
    torch.manual_seed(0)
    hh, ww, p, dim = 6, 8, 2, 8
    layer = MaxViTAttention(dim, 2, p, kind).eval()
    x = torch.randn(2, hh * ww, dim)
    with torch.no_grad():
        got = layer(x, (hh, ww))
        y = x.view(2, hh, ww, dim)
        if kind == "block":  # timm window_partition
            parts = y.view(2, hh // p, p, ww // p, p, dim).permute(0, 1, 3, 2, 4, 5).reshape(-1, p * p, dim)
            out = layer.attn(layer.norm(parts)).view(2, hh // p, ww // p, p, p, dim).permute(0, 1, 3, 2, 4, 5)
        else:  # timm grid_partition
            parts = y.view(2, p, hh // p, p, ww // p, dim).permute(0, 2, 4, 1, 3, 5).reshape(-1, p * p, dim)
            out = layer.attn(layer.norm(parts)).view(2, hh // p, ww // p, p, p, dim).permute(0, 3, 1, 4, 2, 5)
        want = x + out.reshape(2, hh * ww, dim)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_maxvit_attention_with_ragged_windows_equals_its_dense_mask():
    torch.manual_seed(0)
    layer = MaxViTAttention(8, 2, (2, 3), "block").eval()
    x = torch.randn(2, 5 * 7, 8)
    with torch.no_grad():
        dense = masks.block_2d((5, 7), (2, 3)).dense(35, 35)
        want = x + layer.attn(layer.norm(x), mask=dense)
        torch.testing.assert_close(layer(x, (5, 7)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call,words", [
    (lambda: DividedSpaceTimeAttention(8, 2)(torch.randn(1, 20, 8), (2, 3, 3)), ["shape (2, 3, 3) has 18", "19"]),
    (lambda: DividedSpaceTimeAttention(8, 2)(torch.randn(1, 18, 8), (2, 3, 3), frames=[3]), ["frames", "[1, 2]"]),
    (lambda: DividedSpaceTimeAttention(8, 2)(torch.randn(1, 18, 8), (2, 9)), ["shape", "(T, H, W)"]),
    (lambda: AxialAttention(8, 2, ndim=2)(torch.randn(1, 20, 8), (4, 4)), ["shape (4, 4) has 16", "20"]),
    (lambda: AxialAttention(8, 2, ndim=3)(torch.randn(1, 16, 8), (4, 4)), ["shape", "3 axes"]),
    (lambda: MaxViTAttention(8, 2, 3)(torch.randn(1, 20, 8), (4, 4)), ["shape (4, 4) has 16", "20"]),
    (lambda: MaxViTAttention(8, 2, 5)(torch.randn(1, 16, 8), (4, 4)), ["size", "[1, 4]"]),
    (lambda: MaxViTAttention(8, 2, 0, "grid")(torch.randn(1, 16, 8), (4, 4)), ["size", "[1, 4]"]),
    (lambda: MaxViTAttention(8, 2, 2, "window"), ["kind", "block", "grid"]),
])
def test_bad_input_names_the_argument(call, words):
    with pytest.raises(ValueError) as e:
        call()
    for word in words:
        assert word in str(e.value), (word, str(e.value))
