"""Convolution and pooling for the JAX models on XLA's CPU backend, whose own gradients of these
run as slow loops inside the epoch's lax.scan.

XLA's CPU compiler hands a convolution to Eigen (at the matmul rate) only when its dimensions
are in the canonical order: input NHWC, kernel HWIO, output NHWC. The convolutions JAX derives
for a gradient are not (the kernel's gradient contracts over the batch, the input's uses the
kernel as HWOI), so XLA runs them as plain loops: ~2 s a train step of the bench's CNN against
~60 ms in PyTorch. `conv2d` gives the same function a gradient of canonical convolutions only;
`CpuConv` is nn.Conv with it. Measured on 2 cores (batch 128, conv 32 -> conv 64 on 14 x 14,
2026-12-03): the bench's CNN epoch 7.2-8.3 s with the convolution as one im2col matmul, the
previous way, 5.9-6.3 s with `conv2d`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from trainers.spec import CONV_KERNEL

Padding = tuple[tuple[int, int], tuple[int, int]]
NHWC = ("NHWC", "HWIO", "NHWC")


# Eigen's convolution of an input with few channels (an image's 1 or 3) is slower than one matmul
# over its k x k shifted copies: 4.8 against 1.5 ms for 3x3, 1 -> 32 channels, 128 x 28 x 28;
# 5.3 / 4.1 ms with 3 channels; 7.9 / 9.5 ms with 8 (2 cores, 2026-12-03).
MATMUL_PATCH_ROW = 27


def _conv(x: jax.Array, kernel: jax.Array, padding: Padding) -> jax.Array:
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), padding, dimension_numbers=NHWC)


def im2col_conv(x: jax.Array, kernel: jax.Array, strides: int, padding: Padding) -> jax.Array:
    """The convolution of x [B, H, W, C] with kernel [k, k, C, F] as one matmul: the k x k
    shifted (and strided) copies of the padded input side by side, [B, H', W', k*k*C], times the
    kernel as [k*k*C, F]. Its gradients are slices, pads and matmuls."""
    k, s = kernel.shape[0], strides
    x = jnp.pad(x, ((0, 0), *padding, (0, 0)))
    out_h, out_w = (x.shape[1] - k) // s + 1, (x.shape[2] - k) // s + 1
    # (row offset, column offset, channel) order: the order of kernel.reshape's rows.
    patches = jnp.concatenate(
        [x[:, i : i + s * (out_h - 1) + 1 : s, j : j + s * (out_w - 1) + 1 : s, :] for i in range(k) for j in range(k)],
        axis=-1,
    )
    return patches @ kernel.reshape(-1, kernel.shape[-1])


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def conv2d(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, padding: Padding) -> jax.Array:
    """Stride-1 2-D convolution plus bias: x [B, H, W, C], kernel [k, k, C, F] (HWIO), bias [F]
    or None, padding ((top, bottom), (left, right)) -> [B, H + top + bottom - k + 1, W + left +
    right - k + 1, F], nn.Conv's values.

    Its gradient is two convolutions in XLA's canonical order: the input's, the output gradient
    convolved with the kernel flipped and transposed (padding k - 1 - p); the kernel's, the input
    as [C, H, W, B] "convolved" with the output gradient as [H', W', B, F], the batch contracted
    like an input channel. A channel of ones beside the input's gives the bias's gradient (the
    output gradient's sum over batch and positions) in the same pass. The forward pass is
    `im2col_conv` when the input has few channels (k*k*C <= MATMUL_PATCH_ROW), else Eigen's."""
    return _forward(x, kernel, bias, padding)[0]


Residuals = tuple[jax.Array, jax.Array, jax.Array | None]


def _forward(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, padding: Padding) -> tuple[jax.Array, Residuals]:
    k, channels = kernel.shape[0], kernel.shape[2]
    out = im2col_conv(x, kernel, 1, padding) if k * k * channels <= MATMUL_PATCH_ROW else _conv(x, kernel, padding)
    return (out if bias is None else out + bias.astype(out.dtype)), (x, kernel, bias)


def _backward(padding: Padding, residuals: Residuals, g: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    x, kernel, bias = residuals
    k = kernel.shape[0]
    flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)
    (top, bottom), (left, right) = padding
    dx = _conv(g, flipped, ((k - 1 - top, k - 1 - bottom), (k - 1 - left, k - 1 - right)))
    channels = x.transpose(3, 1, 2, 0)
    if bias is not None:
        channels = jnp.concatenate([channels, jnp.ones_like(channels[:1])])
    dw = _conv(channels, g.transpose(1, 2, 0, 3), padding)  # [C (+1), k, k, F]
    if bias is None:
        return dx, dw.transpose(1, 2, 0, 3), None
    # The ones channel at the unshifted offset: every output position's gradient once.
    db = dw[-1, top, left]
    return dx, dw[:-1].transpose(1, 2, 0, 3), db.astype(bias.dtype)


conv2d.defvjp(_forward, _backward)


class CpuConv(nn.Module):
    """nn.Conv (the same parameters, `kernel` [k, k, C, features] HWIO and `bias`; padding "SAME"
    or "VALID") for XLA on the CPU: x [B, H, W, C] -> [B, H', W', features]. A stride of 1 is
    `conv2d`; a larger one, `im2col_conv`."""

    features: int
    kernel_size: int = CONV_KERNEL
    strides: int = 1
    padding: str = "SAME"
    use_bias: bool = True
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        k, s = self.kernel_size, self.strides
        channels = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (k, k, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,)) if self.use_bias else None
        before = (k - 1) // 2 if self.padding == "SAME" else 0
        pad = (before, k - 1 - before) if self.padding == "SAME" else (0, 0)
        x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
        if s == 1:
            return conv2d(x, kernel, None if bias is None else bias.astype(self.dtype), (pad, pad))
        out = im2col_conv(x, kernel, s, (pad, pad))
        return out if bias is None else out + bias.astype(self.dtype)


def tiled_pool(x: jax.Array, window: int, kind: str) -> jax.Array:
    """Max or average pooling of x [B, H, W, C] over non-overlapping window x window tiles (stride =
    window, "VALID": a partial last row or column of tiles is dropped, as PyTorch's floor mode
    does) -> [B, H // window, W // window, C], as a reshape and a reduction.

    The same values as nn.max_pool / nn.avg_pool, and PyTorch's gradients: for max, each tile's
    gradient goes to its first maximum in row-major order (`_tiled_max`). Why: their gradients
    are XLA's select-and-scatter and a windowed reduction, which run as slow loops on the CPU (the
    bench's CNN step: 97 -> 70 ms on 2 cores)."""
    if kind == "max_pool":
        return _tiled_max(x, window)
    return _tiles(x, window).mean(axis=(2, 4))


def _tiles(x: jax.Array, window: int) -> jax.Array:
    b, h, w, c = x.shape
    rows, cols = h // window, w // window
    return x[:, : rows * window, : cols * window].reshape(b, rows, window, cols, window, c)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _tiled_max(x: jax.Array, window: int) -> jax.Array:
    # Rows first, then columns: XLA's CPU code for one reduction over both window axes was ~20%
    # slower (3.25 against 2.65 ms for 128 x 28 x 28 x 32).
    b, h, w, c = x.shape
    rows, cols = h // window, w // window
    row_max = x[:, : rows * window, : cols * window].reshape(b, rows, window, cols * window * c).max(axis=2)
    return row_max.reshape(b, rows, cols, window, c).max(axis=3)


def _tiled_max_forward(x: jax.Array, window: int) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    out = _tiled_max(x, window)
    return out, (x, out)


def _tiled_max_backward(window: int, residuals: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array]:
    # One elementwise pass per tile position, each taking the gradient where no earlier position
    # held the maximum: cheaper on the CPU than counting the ties of a tile (a reduction).
    x, out = residuals
    tiles = _tiles(x, window)
    taken = jnp.zeros(out.shape, bool)
    rows = []
    for i in range(window):
        row = []
        for j in range(window):
            tile = tiles[:, :, i, :, j]
            first = ((tile == out) | jnp.isnan(tile)) & ~taken  # a NaN is its tile's maximum, as in PyTorch
            taken = taken | first
            row.append(jnp.where(first, g, jnp.zeros_like(g)))
        rows.append(jnp.stack(row, axis=3))
    dx = jnp.stack(rows, axis=2).reshape(x.shape[0], out.shape[1] * window, out.shape[2] * window, x.shape[3])
    dropped = x.shape[1] - dx.shape[1], x.shape[2] - dx.shape[2]
    return (jnp.pad(dx, ((0, 0), (0, dropped[0]), (0, dropped[1]), (0, 0))),)


_tiled_max.defvjp(_tiled_max_forward, _tiled_max_backward)
