"""CosmoFlow-like universes: 3D particle counts whose statistics depend on 4 parameters.

Each universe draws its parameters uniformly from ``PARAM_RANGES`` (Omega_m, sigma_8, n_s
and H_0 given as h = H_0 / 100 km/s/Mpc) and builds a Gaussian random field in Fourier
space with the linear power spectrum

    P(k) ∝ k^n_s T(k / Gamma)^2,   Gamma = Omega_m h   (BBKS transfer function T),

normalised so that the field smoothed with an 8 Mpc/h top-hat has standard deviation
sigma_8 (the definition of sigma_8).  Each channel is one redshift bin: the same field
scaled by the linear growth factor D(z; Omega_m) (Carroll, Press & Turner 1992), turned
into a positive density by the lognormal transform ``exp(g - var(g)/2)`` and sampled as
Poisson counts with mean ``mean_count`` per voxel.  So sigma_8 sets the amplitude, n_s the
slope, Gamma (Omega_m and h together) the turnover and Omega_m the growth between bins: a
3D CNN can learn the parameters back, which is the CosmoFlow task.

``fixed_amplitude`` draws "fixed" initial conditions (Angulo & Pontzen 2016, used by simulation
suites such as Quijote): every Fourier mode has exactly the amplitude sqrt(P(k)) and only its
phase is random.  A small box then carries no cosmic variance in its power spectrum, which is
what limits n_s and H_0 at 32^3 (n_s and Omega_m h tilt P(k) almost alike, docs/data.md).

Layout (the real one batched over universes): ``full`` (N, D, D, D, C) int16 counts,
channels last; ``unitPar`` (N, 4) float32, the parameters mapped linearly from their range
to [-1, 1] (``unitPar = 2 (p - low) / (high - low) - 1``); ``physPar`` (N, 4) float32, the
parameters themselves.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from repro500.data.layout import COSMO_PARAMS
from repro500.data.rng import sample_rng
from repro500.data.spec import DatasetSpec

VERSION = 1
PARAM_RANGES = {  # synthetic prior: wide enough that the parameters are worth learning
    "Omega_m": (0.20, 0.40),
    "sigma_8": (0.60, 1.00),
    "n_s": (0.85, 1.05),
    "H_0": (0.60, 0.80),  # h = H_0 / (100 km/s/Mpc)
}
REDSHIFTS = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)


@dataclass(frozen=True)
class CosmoParams:
    """What a cosmo data set's universes depend on besides the seed and the index."""

    size: int = 64  # voxels per side
    channels: int = 4  # redshift bins, REDSHIFTS[:channels]
    voxel_mpc: float = 8.0  # voxel edge in Mpc/h (the 8 Mpc/h of sigma_8: moderate voxel variance)
    mean_count: float = 8.0  # mean particle count per voxel and bin
    fixed_amplitude: bool = False  # |mode| = sqrt(P(k)) exactly, random phases only

    def __post_init__(self) -> None:
        if not 8 <= self.size <= 512:
            raise ValueError(f"cosmo size {self.size} is outside 8..512 voxels per side")
        if not 1 <= self.channels <= len(REDSHIFTS):
            raise ValueError(f"cosmo channels must be 1..{len(REDSHIFTS)}, not {self.channels}")
        if self.voxel_mpc <= 0 or self.mean_count <= 0:
            raise ValueError("voxel_mpc and mean_count must be positive")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.fixed_amplitude:
            # Left out when off, so files made before the option keep their bytes (params attr).
            del d["fixed_amplitude"]
        return d


def bbks_transfer(q: np.ndarray) -> np.ndarray:
    """Bardeen et al. (1986) transfer function of q = k / Gamma (k in h/Mpc)."""
    q = np.maximum(q, 1e-8)
    x = 2.34 * q
    poly = 1.0 + 3.89 * q + (16.1 * q) ** 2 + (5.46 * q) ** 3 + (6.71 * q) ** 4
    return np.log1p(x) / x * poly**-0.25


def growth(z: float, omega_m: float) -> float:
    """Linear growth factor D(z) / D(0) for flat LCDM (Carroll, Press & Turner 1992)."""

    def g(om: float, ol: float) -> float:
        return 2.5 * om / (om ** (4.0 / 7.0) - ol + (1.0 + om / 2.0) * (1.0 + ol / 70.0))

    a3 = (1.0 + z) ** 3
    e2 = omega_m * a3 + (1.0 - omega_m)
    om_z, ol_z = omega_m * a3 / e2, (1.0 - omega_m) / e2
    return g(om_z, ol_z) / (g(omega_m, 1.0 - omega_m) * (1.0 + z))


@functools.lru_cache(maxsize=4)
def _k_grid(size: int, voxel_mpc: float) -> np.ndarray:
    """|k| in h/Mpc on the rfft grid of a size^3 box."""
    k1 = 2 * np.pi * np.fft.fftfreq(size, d=voxel_mpc)
    kz = 2 * np.pi * np.fft.rfftfreq(size, d=voxel_mpc)
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)
    k.setflags(write=False)
    return k


def _tophat(x: np.ndarray) -> np.ndarray:
    x = np.maximum(x, 1e-6)
    return 3.0 * (np.sin(x) - x * np.cos(x)) / x**3


def to_unit(phys: np.ndarray) -> np.ndarray:
    low = np.array([PARAM_RANGES[p][0] for p in COSMO_PARAMS])
    high = np.array([PARAM_RANGES[p][1] for p in COSMO_PARAMS])
    return 2.0 * (np.asarray(phys) - low) / (high - low) - 1.0


class CosmoGenerator:
    """Universes; universe ``i`` depends only on (seed, split, params, i)."""

    kind = "cosmo"
    version = VERSION

    def __init__(self, params: CosmoParams, seed: int, split: str) -> None:
        self.params = params
        self.seed = int(seed)
        self.split = split

    def datasets(self) -> list[DatasetSpec]:
        d, c = self.params.size, self.params.channels
        return [
            DatasetSpec("full", (d, d, d, c), "int16"),
            DatasetSpec("unitPar", (4,), "float32"),
            DatasetSpec("physPar", (4,), "float32"),
        ]

    def attrs(self) -> dict[str, Any]:
        return {
            "param_names": list(COSMO_PARAMS),
            "param_low": [PARAM_RANGES[p][0] for p in COSMO_PARAMS],
            "param_high": [PARAM_RANGES[p][1] for p in COSMO_PARAMS],
            "unitPar": "2 (physPar - param_low) / (param_high - param_low) - 1",
            "redshifts": list(REDSHIFTS[: self.params.channels]),
            "box_mpc_h": self.params.size * self.params.voxel_mpc,
            "full": "particle counts per voxel, (universe, z, y, x, redshift bin)",
        }

    def parameters(self, index: int) -> np.ndarray:
        """Physical parameters of universe ``index`` (Omega_m, sigma_8, n_s, h)."""
        rng = sample_rng(self.seed, "cosmo", self.split, index, 0)
        return np.array([rng.uniform(*PARAM_RANGES[p]) for p in COSMO_PARAMS])

    def density(self, index: int) -> np.ndarray:
        """The linear density contrast at z = 0, float32 (D, D, D): before growth and sampling."""
        import scipy.fft  # float32 FFTs: half the memory and time of numpy.fft

        p = self.params
        omega_m, sigma_8, n_s, h = self.parameters(index)
        k = _k_grid(p.size, p.voxel_mpc)
        power = k**n_s * bbks_transfer(k / (omega_m * h)) ** 2
        power.flat[0] = 0.0  # no mean mode: the field has zero mean
        # E[var of the 8 Mpc/h smoothed field] = mean over the full k grid of P W^2; the
        # rfft grid counts the modes with 0 < kz < Nyquist twice.
        weight = np.full(k.shape[-1], 2.0)
        weight[0] = 1.0
        if p.size % 2 == 0:
            weight[-1] = 1.0
        var8 = float((power * _tophat(k * 8.0) ** 2 * weight).sum() / p.size**3)
        amplitude = np.sqrt(power * (sigma_8**2 / var8)).astype(np.float32)
        rng = sample_rng(self.seed, "cosmo", self.split, index, 1)
        white = rng.standard_normal((p.size,) * 3, dtype=np.float32)
        field = scipy.fft.rfftn(white)
        if p.fixed_amplitude:
            # Keep the phases, set |mode| to the white noise's expected sqrt(D^3): the same
            # normalisation as the random amplitudes, without their scatter.
            modulus = np.abs(field)
            field *= np.float32(p.size**1.5) / np.maximum(modulus, np.float32(1e-30))
        field *= amplitude
        return scipy.fft.irfftn(field, s=white.shape).astype(np.float32)

    def sample(self, index: int) -> dict[str, np.ndarray]:
        p = self.params
        phys = self.parameters(index)
        delta = self.density(index)
        var0 = float(delta.var(dtype=np.float64))
        rng = sample_rng(self.seed, "cosmo", self.split, index, 2)
        full = np.empty((p.size,) * 3 + (p.channels,), dtype=np.int16)
        for c, z in enumerate(REDSHIFTS[: p.channels]):
            d = growth(z, float(phys[0]))
            lam = np.exp(delta * np.float32(d) - np.float32(0.5 * d * d * var0))
            lam *= np.float32(p.mean_count)
            full[..., c] = np.minimum(rng.poisson(lam), np.iinfo(np.int16).max)
        return {
            "full": full,
            "unitPar": to_unit(phys).astype(np.float32),
            "physPar": phys.astype(np.float32),
        }


def parse_size(text: str | None) -> int:
    """``"D"`` (or ``"DxDxD"``) -> D; None -> 64."""
    if text is None:
        return 64
    parts = text.lower().split("x")
    if not all(p.strip().isdigit() for p in parts) or len(set(parts)) != 1 or len(parts) not in (1, 3):
        raise ValueError(f"cosmo size {text!r} is not D or DxDxD (e.g. 64 or 128x128x128)")
    return int(parts[0])
