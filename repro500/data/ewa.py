"""Extreme-Weather-like climate fields with planted, labelled events.

One sample is ``images`` (16, H, W) float32 in the real channel order (layout.EWA_CHANNELS)
and physical units (K, Pa, kg/kg, kg/m^2, m/s, m), plus ``boxes`` (15, 5) float32 rows
``ymin, xmin, ymax, xmax, class`` padded with -1.  Row 0 is the southernmost latitude
(latitude ascending, as CAM5 writes it), column 0 is longitude 0 and columns run east.

Background (stream 0 of the sample's random streams, rng.py): zonal-mean climate that
depends on latitude (warm moist tropics, subtropical highs, subpolar lows, trade winds and
westerlies) plus smooth random weather at two scales (smooth.py), with geostrophic winds
derived from the pressure anomaly.  A fixed orography (drawn once per seed, shared by every
sample and split) lowers surface pressure as real terrain does.

Events (stream 1) are analytic shapes on small windows, so their cost does not grow with
the grid:

* tropical cyclone (class 1): compact Gaussian low at 8-30 deg, warm core aloft, cyclonic
  rotation (counter-clockwise in the north, clockwise in the south) peaking at the radius
  of maximum wind, high TMQ and heavy rain;
* tropical depression (class 0): the same structure, weaker and smaller, at 5-25 deg;
* extratropical cyclone (class 2): larger tilted elliptical low at 35-65 deg with a warm
  sector to the east, a cold one to the west and a rain band on one flank (asymmetric);
* atmospheric river (class 3): a long, narrow, slightly curved moisture filament running
  poleward and eastward from the subtropics, with winds along it.

A box is the tight bounding box of the pixels where the event's main signature (the
pressure profile of a cyclone, the moisture of a river) reaches 10% of its peak; ``ymax``
and ``xmax`` are exclusive pixel edges.  Event sizes are the full-resolution ones
(768 x 1152, about 25 km a pixel) scaled to the grid, but never smaller than a few pixels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from repro500.data import smooth
from repro500.data.ewa_events import (  # noqa: F401 - re-exported: the events were defined here
    AR,
    ETC,
    TAIL,
    TC,
    TD,
    C,
    Event,
    cyclone_profile,
    event_box,
    event_window,
    int_window,
    overlap,
    plant_cyclone,
    plant_river,
    river_profile,
    signature,
)
from repro500.data.layout import (
    EWA_CHANNELS,
    EWA_CLASSES,
    EWA_FULL_SIZE,
    EWA_MAX_BOXES,
)
from repro500.data.rng import FILE_LEVEL, sample_rng
from repro500.data.spec import DatasetSpec

VERSION = 1  # bump when the bytes of a sample change for the same seed and parameters

_COARSE = (12, 18)  # synoptic scale: ~1700 km cells
_MESO = (48, 72)  # mesoscale: ~400 km cells
_MIN_SIGMA_PX = 2.0  # no event narrower than this, whatever the grid

CHANNEL_UNITS = {
    "PRECT": "m/s", "PS": "Pa", "PSL": "Pa", "QREFHT": "kg/kg", "T200": "K", "T500": "K",
    "TMQ": "kg/m^2", "TREFHT": "K", "TS": "K", "U850": "m/s", "UBOT": "m/s", "V850": "m/s",
    "VBOT": "m/s", "Z1000": "m", "Z200": "m", "ZBOT": "m",
}


@dataclass(frozen=True)
class EwaParams:
    """What an EWA file's samples depend on besides the seed and the sample index."""

    height: int = EWA_FULL_SIZE[0]
    width: int = EWA_FULL_SIZE[1]
    # Poisson means of the number of events per sample: TD, TC, ETC, AR.
    events_per_sample: tuple[float, float, float, float] = (0.8, 0.8, 1.2, 0.8)

    def __post_init__(self) -> None:
        if self.height < 32 or self.width < 32:
            raise ValueError(f"EWA size {self.height}x{self.width} is too small: use at least 32x32")
        if len(self.events_per_sample) != 4 or min(self.events_per_sample) < 0:
            raise ValueError("events_per_sample needs 4 non-negative means (TD, TC, ETC, AR)")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["events_per_sample"] = list(self.events_per_sample)
        return d



class EwaGenerator:
    """Samples of an EWA-like data set; every sample depends on (seed, split, params, index)."""

    kind = "ewa"
    version = VERSION

    def __init__(self, params: EwaParams, seed: int, split: str) -> None:
        self.params = params
        self.seed = int(seed)
        self.split = split
        h, w = params.height, params.width
        lat = -90.0 + 180.0 * (np.arange(h) + 0.5) / h
        self.lat_deg = lat
        phi = np.deg2rad(lat)[:, None]
        self._sin2 = (np.sin(phi) ** 2).astype(np.float32)
        # The Coriolis parameter changes sign at the equator; a smooth step keeps the winds
        # continuous there (geostrophy does not hold in the deep tropics anyway).
        self._sign = np.tanh(np.deg2rad(lat)[:, None] / np.deg2rad(8.0)).astype(np.float32)
        abslat = np.abs(lat)[:, None]
        self._tropics = np.exp(-((lat[:, None] / 25.0) ** 2)).astype(np.float32)
        self._psl_zonal = (
            101300.0
            + 800.0 * np.exp(-(((abslat - 30.0) / 12.0) ** 2))
            - 1500.0 * np.exp(-(((abslat - 62.0) / 10.0) ** 2))
        ).astype(np.float32)
        self._u_zonal = (
            -7.0 * np.exp(-((lat[:, None] / 14.0) ** 2))
            + 14.0 * np.exp(-(((abslat - 45.0) / 12.0) ** 2))
        ).astype(np.float32)
        # Terrain is the same for every sample of a seed (the planet does not change).
        orng = sample_rng(self.seed, "ewa", FILE_LEVEL, 0, 0)
        relief = smooth.upsample(orng.standard_normal((24, 36)), h, w)
        height_m = 1200.0 * np.maximum(relief - 1.0, 0.0) ** 1.5
        self._surface_factor = np.exp(-height_m / 8400.0)  # scale height of the atmosphere
        self._surface_factor = self._surface_factor.astype(np.float32)
        sy, sx = h / EWA_FULL_SIZE[0], w / EWA_FULL_SIZE[1]
        self._scale = (sy, sx)

    # -- the file's layout -------------------------------------------------------------
    def datasets(self) -> list[DatasetSpec]:
        h, w = self.params.height, self.params.width
        return [
            DatasetSpec("images", (16, h, w), "float32", stats_axis=0),
            DatasetSpec("boxes", (EWA_MAX_BOXES, 5), "float32", fill=-1.0),
        ]

    def attrs(self) -> dict[str, Any]:
        return {
            "channel_names": list(EWA_CHANNELS),
            "channel_units": [CHANNEL_UNITS[c] for c in EWA_CHANNELS],
            "class_names": list(EWA_CLASSES),
            "box_format": "ymin,xmin,ymax,xmax,class; ymax/xmax exclusive pixel edges; -1 rows are padding",
            "grid": "row 0 southernmost, latitude ascending; column 0 at longitude 0, eastward",
        }

    # -- samples ----------------------------------------------------------------------
    def sample(self, index: int) -> dict[str, np.ndarray]:
        images = self.background(index)
        events = self.events(index)
        for ev in events:
            self._plant(images, ev)
        boxes = np.full((EWA_MAX_BOXES, 5), -1.0, dtype=np.float32)
        for row, ev in enumerate(events):
            boxes[row] = (*ev.box, ev.cls)
        return {"images": images, "boxes": boxes}

    def background(self, index: int) -> np.ndarray:
        """The sample's fields without its events (same bytes as sample() minus the events)."""
        h, w = self.params.height, self.params.width
        rng = sample_rng(self.seed, "ewa", self.split, index, 0)
        coarse = rng.standard_normal((3, *_COARSE))  # pressure, temperature, moisture
        meso = rng.standard_normal((3, *_MESO))  # small-scale pressure/wind, moisture, temperature
        d_dy, d_dx = smooth.coarse_gradient(coarse[0])
        # 3 coarse + 2 gradient fields and 3 meso fields, unit variance on average
        big = smooth.upsample(np.concatenate([coarse, d_dy[None] * 2.5, d_dx[None] * 2.5]), h, w)
        small = smooth.upsample(meso, h, w)
        p, t, q, dpdy, dpdx = big
        m_p, m_q, m_t = small

        out = np.empty((16, h, w), dtype=np.float32)
        s2, sign = self._sin2, self._sign
        ts = out[C["TS"]]
        ts[:] = (302.0 - 50.0 * s2) + 3.0 * t + 0.8 * m_t
        np.subtract(ts, 1.2, out=out[C["TREFHT"]])
        out[C["TREFHT"]] -= 0.4 * m_t
        out[C["T500"]] = (266.0 - 38.0 * s2) + 2.5 * t + 0.3 * m_t
        out[C["T200"]] = (217.0 + 5.0 * s2) - 1.5 * t

        psl = out[C["PSL"]]
        psl[:] = self._psl_zonal + (900.0 * (0.35 + s2)) * p + 120.0 * m_p
        np.multiply(psl, self._surface_factor, out=out[C["PS"]])
        np.subtract(psl, 100000.0, out=out[C["Z1000"]])
        out[C["Z1000"]] *= 0.08  # about 8 m per hPa near the surface
        out[C["Z200"]] = (12250.0 - 1300.0 * s2) + 35.0 * t
        np.subtract(ts, 288.0, out=out[C["ZBOT"]])
        out[C["ZBOT"]] *= 0.22
        out[C["ZBOT"]] += 62.0

        # Moisture: maximum in the tropics, log-normal weather on top.
        weather = 0.3 * q + 0.12 * m_q
        out[C["TMQ"]] = (52.0 * self._tropics + 6.0) * np.exp(weather)
        weather *= 0.8  # near-surface humidity varies a little less than the column's water
        out[C["QREFHT"]] = (0.0185 * self._tropics + 0.0015) * np.exp(weather)
        prect = out[C["PRECT"]]
        np.multiply(m_q, 1.1, out=prect)
        prect += 0.4 * q
        np.exp(prect, out=prect)
        prect *= out[C["TMQ"]] ** 2
        prect *= 1.5e-8 / 900.0

        # Geostrophic winds: u ~ -dp/dy / f, v ~ dp/dx / f (the sign of f flips at the equator).
        out[C["U850"]] = self._u_zonal - (6.0 * sign) * dpdy + 1.5 * m_p
        out[C["V850"]] = (6.0 * sign) * dpdx + 1.5 * m_t
        np.multiply(out[C["U850"]], 0.7, out=out[C["UBOT"]])
        out[C["UBOT"]] -= 0.6 * m_t
        np.multiply(out[C["V850"]], 0.7, out=out[C["VBOT"]])
        out[C["VBOT"]] += 0.4 * m_p
        return out

    def events(self, index: int) -> list[Event]:
        """The events planted in sample ``index``, boxes included (they do not touch the fields)."""
        rng = sample_rng(self.seed, "ewa", self.split, index, 1)
        counts = rng.poisson(self.params.events_per_sample)
        classes = np.repeat(np.arange(4), counts)
        rng.shuffle(classes)
        placed: list[Event] = []
        windows: list[tuple[float, float, float, float]] = []
        for cls in classes[: 3 * EWA_MAX_BOXES]:
            if len(placed) == EWA_MAX_BOXES:
                break
            for _attempt in range(8):
                ev = self._draw(int(cls), rng)
                win = event_window(ev)
                if not self._inside(win) or any(overlap(win, o) for o in windows):
                    continue
                ev.box = event_box(ev, self.params.height, self.params.width)
                placed.append(ev)
                windows.append(win)
                break
        return placed

    # -- events -----------------------------------------------------------------------
    def _lat_to_row(self, lat_deg: float) -> float:
        return (lat_deg + 90.0) / 180.0 * self.params.height - 0.5

    def _sigma(self, full_res_px: float, axis: int) -> float:
        return max(full_res_px * self._scale[axis], _MIN_SIGMA_PX)

    def _draw(self, cls: int, rng: np.random.Generator) -> Event:
        hemi = 1.0 if rng.random() < 0.5 else -1.0
        w = self.params.width
        if cls in (TD, TC):
            lat_lo, lat_hi = (5.0, 25.0) if cls == TD else (8.0, 30.0)
            size = rng.uniform(4.0, 7.0) if cls == TD else rng.uniform(6.0, 10.0)
            sy, sx = self._sigma(size, 0), self._sigma(size, 1)
            props = {
                "dp_pa": rng.uniform(500.0, 1500.0) if cls == TD else rng.uniform(2500.0, 7000.0),
                "vmax_ms": rng.uniform(10.0, 17.0) if cls == TD else rng.uniform(33.0, 65.0),
                "dt_k": rng.uniform(1.0, 2.5) if cls == TD else rng.uniform(4.0, 8.0),
                "dq_kgm2": rng.uniform(6.0, 12.0) if cls == TD else rng.uniform(15.0, 25.0),
                "rain_ms": rng.uniform(3e-7, 6e-7) if cls == TD else rng.uniform(1e-6, 2e-6),
                "angle": 0.0,
            }
        elif cls == ETC:
            lat_lo, lat_hi = 35.0, 65.0
            major, minor = rng.uniform(14.0, 24.0), rng.uniform(9.0, 14.0)
            # tilted SW-NE in the north, NW-SE in the south
            angle = hemi * math.radians(rng.uniform(20.0, 60.0))
            a, b = self._sigma(major, 1), self._sigma(minor, 0)
            sx = math.hypot(a * math.cos(angle), b * math.sin(angle))
            sy = math.hypot(a * math.sin(angle), b * math.cos(angle))
            props = {
                "dp_pa": rng.uniform(1500.0, 4000.0), "vmax_ms": rng.uniform(15.0, 30.0),
                "dt_k": rng.uniform(3.0, 6.0), "dq_kgm2": rng.uniform(8.0, 15.0),
                "rain_ms": rng.uniform(4e-7, 8e-7), "angle": angle, "major": a, "minor": b,
            }
        else:  # AR
            lat_lo, lat_hi = 25.0, 40.0  # the filament's middle
            length = self._sigma(rng.uniform(100.0, 220.0), 1)
            width = self._sigma(rng.uniform(6.0, 11.0), 0)
            angle = hemi * math.radians(rng.uniform(20.0, 50.0))
            bow = rng.uniform(-0.12, 0.12)  # curvature: centre-line offset per unit length
            half_l = 0.5 * length + TAIL * width
            half_n = abs(bow) * length * 0.25 + TAIL * width
            sx = (abs(half_l * math.cos(angle)) + abs(half_n * math.sin(angle))) / TAIL
            sy = (abs(half_l * math.sin(angle)) + abs(half_n * math.cos(angle))) / TAIL
            props = {
                "length": length, "width": width, "angle": angle, "bow": bow,
                "dq_kgm2": rng.uniform(18.0, 30.0), "wind_ms": rng.uniform(10.0, 18.0),
                "rain_ms": rng.uniform(1.5e-7, 3e-7),
            }
        lat = hemi * rng.uniform(lat_lo, lat_hi)
        cy = self._lat_to_row(lat)
        cx = rng.uniform(TAIL * sx, w - TAIL * sx)
        props["north"] = hemi
        return Event(cls=cls, cy=cy, cx=cx, sigma_y=sy, sigma_x=sx, props=props)

    def _inside(self, win: tuple[float, float, float, float]) -> bool:
        y0, x0, y1, x1 = win
        return y0 >= 0 and x0 >= 0 and y1 <= self.params.height and x1 <= self.params.width

    def _plant(self, out: np.ndarray, ev: Event) -> None:
        y0, x0, y1, x1 = (int(v) for v in int_window(ev))
        dy = (np.arange(y0, y1, dtype=np.float32) - np.float32(ev.cy))[:, None]
        dx = (np.arange(x0, x1, dtype=np.float32) - np.float32(ev.cx))[None, :]
        win = (slice(None), slice(y0, y1), slice(x0, x1))
        if ev.cls == AR:
            plant_river(out[win], ev, dy, dx)
        else:
            plant_cyclone(out[win], ev, dy, dx)


# -- analytic event shapes (window arrays, pixel offsets dy north, dx east) ---------------
def parse_size(text: str | None) -> tuple[int, int]:
    """``"HxW"`` -> (H, W); None -> the full 768 x 1152 grid."""
    if text is None:
        return EWA_FULL_SIZE
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"EWA size {text!r} is not HxW (e.g. 96x144 or 768x1152)")
    return int(parts[0]), int(parts[1])
