"""The Extreme-Weather events the generator plants: their profiles on the grid's channels
(pressure depressions and warm cores of tropical depressions, tropical and extratropical
cyclones; moisture bands of atmospheric rivers) and the boxes that label them.

Split from ``ewa.py`` (the generator that places them), which re-exports what it used to hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from repro500.data.layout import EWA_CHANNELS

C = {name: i for i, name in enumerate(EWA_CHANNELS)}
TD, TC, ETC, AR = range(4)
TAIL = 3.0  # event windows reach 3 sigma; profiles are tapered to zero there
_BOX_LEVEL = 0.1  # a box covers the pixels where the signature reaches 10% of its peak


@dataclass
class Event:
    """One planted event, in pixel units of the grid it was planted on."""

    cls: int
    cy: float
    cx: float
    sigma_y: float
    sigma_x: float
    box: tuple[int, int, int, int] = (0, 0, 0, 0)  # ymin, xmin, ymax (excl.), xmax (excl.)
    props: dict[str, float] = field(default_factory=dict)


def _taper(r2: np.ndarray) -> np.ndarray:
    """1 near the centre, smoothly 0 at the window's edge (r = TAIL sigmas)."""
    return np.clip(1.0 - (r2 / TAIL**2) ** 2, 0.0, 1.0)


def _cyclone_coords(ev: Event, dy: np.ndarray, dx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalised coordinates (along the major axis, across it) of a cyclone's window."""
    if ev.cls == ETC:
        ang = ev.props["angle"]
        c, s = math.cos(ang), math.sin(ang)
        u = (dx * c + dy * s) / ev.props["major"]
        v = (-dx * s + dy * c) / ev.props["minor"]
        return u, v
    return dx / ev.sigma_x, dy / ev.sigma_y


def cyclone_profile(ev: Event, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """The pressure-depression shape (peak 1) of a TD, TC or ETC on its window."""
    u, v = _cyclone_coords(ev, dy, dx)
    r2 = u * u + v * v
    return (np.exp(-0.5 * r2) * _taper(r2)).astype(np.float32)


def plant_cyclone(w: np.ndarray, ev: Event, dy: np.ndarray, dx: np.ndarray) -> None:
    p = ev.props
    north = p["north"]
    u, v = _cyclone_coords(ev, dy, dx)
    r2 = u * u + v * v
    taper = _taper(r2)
    g = np.exp(-0.5 * r2) * taper
    w[C["PSL"]] -= p["dp_pa"] * g
    w[C["PS"]] -= p["dp_pa"] * g
    w[C["Z1000"]] -= 0.08 * p["dp_pa"] * g
    # Tangential wind of a Gaussian low, maximal (= vmax) at one sigma; counter-clockwise
    # in the north.  In the window's (east, north) frame the unit tangent is (-dy, dx) / r.
    spin = p["vmax_ms"] * np.exp(0.5 * (1.0 - r2)) * taper * north
    ry, rx = dy / ev.sigma_y, dx / ev.sigma_x
    w[C["U850"]] -= spin * ry
    w[C["V850"]] += spin * rx
    w[C["UBOT"]] -= 0.8 * spin * ry
    w[C["VBOT"]] += 0.8 * spin * rx
    if ev.cls == ETC:
        # Warm sector ahead (east), cold air behind, rain band along the leading flank.
        front = np.tanh(u) * g
        w[C["T500"]] += p["dt_k"] * front
        w[C["TS"]] += 1.5 * p["dt_k"] * front
        w[C["TREFHT"]] += 1.5 * p["dt_k"] * front
        band = np.exp(-0.5 * (((v - 0.8 * north) / 0.45) ** 2 + (u / 1.4) ** 2)) * taper
        w[C["TMQ"]] += p["dq_kgm2"] * band
        w[C["QREFHT"]] += 0.0004 * p["dq_kgm2"] * band
        w[C["PRECT"]] += p["rain_ms"] * band
    else:
        core = np.exp(-0.5 * r2 / 0.36) * taper  # warm core: 0.6 sigma
        w[C["T500"]] += p["dt_k"] * core
        w[C["T200"]] += 0.8 * p["dt_k"] * core
        w[C["TS"]] += 0.5 * core
        w[C["TREFHT"]] += 0.5 * core
        moist = np.exp(-0.5 * r2 / 0.64) * taper
        w[C["TMQ"]] += p["dq_kgm2"] * moist
        w[C["QREFHT"]] += 0.0004 * p["dq_kgm2"] * moist
        w[C["PRECT"]] += p["rain_ms"] * core


def _river_coords(ev: Event, dy: np.ndarray, dx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(along, across-distance-from-centre-line) of an atmospheric river, in pixels."""
    p = ev.props
    c, s = math.cos(p["angle"]), math.sin(p["angle"])
    along = dx * c + dy * s
    across = -dx * s + dy * c
    half = 0.5 * p["length"]
    centre_line = p["bow"] * (along * along - half * half) / p["length"]
    return along, across - centre_line


def river_profile(ev: Event, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """The moisture shape (peak 1) of an atmospheric river on its window."""
    p = ev.props
    along, across = _river_coords(ev, dy, dx)
    r2 = (across / p["width"]) ** 2
    half = 0.5 * p["length"]
    ends = np.clip((half + TAIL * p["width"] - np.abs(along)) / (2.0 * TAIL * p["width"]), 0.0, 1.0)
    ends = ends * ends * (3.0 - 2.0 * ends)  # smoothstep: the filament fades out at both ends
    return (np.exp(-0.5 * r2) * _taper(r2) * ends).astype(np.float32)


def plant_river(w: np.ndarray, ev: Event, dy: np.ndarray, dx: np.ndarray) -> None:
    p = ev.props
    g = river_profile(ev, dy, dx)
    w[C["TMQ"]] += p["dq_kgm2"] * g
    w[C["QREFHT"]] += 0.004 * g
    c, s = math.cos(p["angle"]), math.sin(p["angle"])
    w[C["U850"]] += p["wind_ms"] * c * g
    w[C["V850"]] += p["wind_ms"] * s * g
    w[C["UBOT"]] += 0.6 * p["wind_ms"] * c * g
    w[C["VBOT"]] += 0.6 * p["wind_ms"] * s * g
    w[C["TS"]] += 1.0 * g
    w[C["TREFHT"]] += 1.0 * g
    along, _ = _river_coords(ev, dy, dx)
    landfall = np.clip(along / (0.5 * p["length"]), 0.0, 1.0)  # rain where it runs ashore
    w[C["PRECT"]] += p["rain_ms"] * g * landfall


def signature(ev: Event, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """The shape its box is drawn around: pressure for cyclones, moisture for rivers."""
    return river_profile(ev, dy, dx) if ev.cls == AR else cyclone_profile(ev, dy, dx)


# -- windows and boxes -------------------------------------------------------------------
def event_window(ev: Event) -> tuple[float, float, float, float]:
    return (
        ev.cy - TAIL * ev.sigma_y, ev.cx - TAIL * ev.sigma_x,
        ev.cy + TAIL * ev.sigma_y + 1, ev.cx + TAIL * ev.sigma_x + 1,
    )


def int_window(ev: Event) -> tuple[int, int, int, int]:
    y0, x0, y1, x1 = event_window(ev)
    return math.floor(y0), math.floor(x0), math.ceil(y1), math.ceil(x1)


def overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def event_box(ev: Event, height: int, width: int) -> tuple[int, int, int, int]:
    y0, x0, y1, x1 = int_window(ev)
    y0, x0, y1, x1 = max(y0, 0), max(x0, 0), min(y1, height), min(x1, width)
    dy = (np.arange(y0, y1, dtype=np.float32) - np.float32(ev.cy))[:, None]
    dx = (np.arange(x0, x1, dtype=np.float32) - np.float32(ev.cx))[None, :]
    mask = signature(ev, dy, dx) >= _BOX_LEVEL
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    return (y0 + int(rows[0]), x0 + int(cols[0]), y0 + int(rows[-1]) + 1, x0 + int(cols[-1]) + 1)
