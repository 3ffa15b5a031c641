"""Dropout masks hashed from a key: a function of (key, element index), with no RNG state.

Inductor's dropout on CPU draws its masks with a Philox generator it does not vectorise (about
1-2 ms a step for the seeds' MLP, more than its matmuls); an integer hash of the element index is
a handful of vectorised int32 operations that fuse with the activation around them. The same key
gives the same mask in eager and compiled code.
"""

from __future__ import annotations

import torch
from torch import nn

KEY_BITS = 24  # uniform bits per element: a drop rate is kept to 2^-24


def hash32(h: torch.Tensor) -> torch.Tensor:
    """int32 -> int32: a bijective integer hash (the "lowbias32" mix, Wellons' hash-prospector),
    every output bit depending on every input bit. Elementwise, so Inductor fuses and
    vectorises it. The right shifts are logical (masked): torch shifts int32 arithmetically."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * 0x7FEB352D
    h = h ^ ((h >> 15) & 0x1FFFF)
    h = h * -0x7B935975  # 0x846CA68B as an int32 (products wrap around, as in C)
    return h ^ ((h >> 16) & 0xFFFF)


def hashed_dropout(x: torch.Tensor, rate: float, key: torch.Tensor) -> torch.Tensor:
    """Inverted dropout of `x` (any shape) with a mask that is a function of (key, element index):
    each element is kept when the top KEY_BITS of hash32(index ^ hash32(key)) reach rate * 2^24,
    so a fraction `rate` is dropped, and the kept ones are scaled by 1 / (1 - rate).

    `key` is an int32 0-dim tensor; the same key gives the same mask, in eager and compiled code."""
    index = torch.arange(x.numel(), dtype=torch.int32, device=x.device).reshape(x.shape)
    uniform = (hash32(index ^ hash32(key)) >> (32 - KEY_BITS)) & ((1 << KEY_BITS) - 1)
    keep = uniform >= round(rate * (1 << KEY_BITS))
    return torch.where(keep, x * (1.0 / (1.0 - rate)), torch.zeros((), dtype=x.dtype, device=x.device))


def uniform_dropout(x: torch.Tensor, rate: float) -> torch.Tensor:
    """Inverted dropout of `x` with a mask from torch's generator (the eager step's masks): float32
    uniforms, about half the time of F.dropout's bernoulli_ on CPU (measured beside it); the
    generator's state (seeded per epoch, checkpointed mid-epoch) still says every mask."""
    return x * _kept_scale(x, rate)


def _kept_scale(x: torch.Tensor, rate: float) -> torch.Tensor:
    """1 / (1 - rate) where an element is kept, 0 where dropped, shaped and typed as `x`. In place
    on the uniforms: no bool tensor and two more copies (the values of (rand >= rate) * scale)."""
    return torch.rand(x.shape, device=x.device).ge_(rate).mul_(1.0 / (1.0 - rate)).to(x.dtype)


class UniformDropout(nn.Dropout):
    """nn.Dropout with uniform_dropout's masks: the same distribution (each element dropped with
    probability p, the kept ones scaled by 1 / (1 - p)), drawn from the same generator, at the
    eager built-in models' cost. `inplace` is honoured."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return input
        if self.p == 1:
            return input.mul_(0) if self.inplace else input * 0
        scale = _kept_scale(input, self.p)
        return input.mul_(scale) if self.inplace else input * scale


def uniform_dropouts(model: nn.Module) -> int:
    """Give every plain nn.Dropout in `model` UniformDropout's forward (its class swapped in place:
    p, inplace, training and hooks stay; a dropout has no state_dict); the count swapped. So a
    user's eager CPU module pays for its dropout what the built-in MLP does (F.dropout's bernoulli_
    takes about twice as long on CPU). Subclasses of nn.Dropout and functional dropout calls keep
    their own code."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = UniformDropout
            swapped += 1
    return swapped
