"""Smooth random fields on a lat-lon grid from low-resolution noise.

A field is white noise on a coarse (ny, nx) grid, spread to the full (H, W) grid by two
small matrix products ``Wy @ noise @ Wx.T`` with Gaussian interpolation weights.  That costs
O(H * ny * W) flops, a few milliseconds at 768 x 1152, where a spatial filter over the full
grid (scipy.ndimage.gaussian_filter, or zoom's spline prefilter) costs an order of magnitude
more.  Longitude wraps around; latitude does not.  The geometry is resolution-independent:
the same noise gives the same large-scale pattern at any output size.
"""

from __future__ import annotations

import functools

import numpy as np

_KERNEL_WIDTH = 0.75  # in coarse-grid cells: wide enough that no grid imprint is visible


@functools.lru_cache(maxsize=32)
def upsampler(n_out: int, n_in: int, periodic: bool) -> np.ndarray:
    """(n_out, n_in) float32 Gaussian interpolation weights, each row summing to 1.

    Rows are then scaled so that white unit-variance input gives unit-variance output
    on average (the smoothing would otherwise shrink the amplitude).
    """
    u = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
    d = u[:, None] - np.arange(n_in)[None, :]
    if periodic:
        d = (d + n_in / 2) % n_in - n_in / 2
    w = np.exp(-0.5 * (d / _KERNEL_WIDTH) ** 2)
    w[w < 1e-6] = 0.0  # far tails would be float32 denormals, which make matmul 50x slower
    w /= w.sum(axis=1, keepdims=True)
    w /= np.sqrt((w**2).sum(axis=1)).mean()
    w.setflags(write=False)
    return w.astype(np.float32)


def upsample(coarse: np.ndarray, height: int, width: int) -> np.ndarray:
    """Spread coarse fields (..., ny, nx) to (..., height, width), float32."""
    ny, nx = coarse.shape[-2:]
    wy = upsampler(height, ny, False)
    wx = upsampler(width, nx, True)
    return np.matmul(wy, np.matmul(coarse.astype(np.float32), wx.T))


def coarse_gradient(coarse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centred differences (d/dy, d/dx) of coarse fields; x wraps around, y is one-sided at the poles."""
    d_dx = 0.5 * (np.roll(coarse, -1, axis=-1) - np.roll(coarse, 1, axis=-1))
    d_dy = np.gradient(coarse, axis=-2)
    return d_dy, d_dx
