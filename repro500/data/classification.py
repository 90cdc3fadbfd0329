"""Images whose class is a striped object's colour and stripe direction, with variation.

Class ``k`` of ``K`` is an ellipse filled with stripes whose hue is ``k / K`` of the way
round the colour wheel and whose direction is ``pi * frac(k * 0.618...)`` (the golden ratio
spreads the directions, so classes of neighbouring hue have very different stripes).
Within a class the hue is jittered (neighbouring classes overlap in colour, so colour alone
does not decide), and everything else varies at random: the stripes' direction by a few
degrees, their frequency and phase, the ellipse's position and size, the background's
colour and gradient, a distractor blob and per-pixel Gaussian noise.  A small network learns
it within a few hundred samples; it takes colour *and* texture to get it right.

Images are uint8 (N, C, H, W) like the real image data sets; labels are int64 and
balanced (sample ``i`` has label ``i % classes``).  The same (seed, split, params, index)
gives the same image in a file and in the in-memory data set (loaders.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from repro500.data.rng import sample_rng
from repro500.data.spec import DatasetSpec

VERSION = 1
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # class k's stripes lie at pi * frac(k * GOLDEN)
HUE_JITTER = 0.03  # hue standard deviation, as a fraction of the colour wheel
STRIPE_DEPTH = 0.7  # dark stripes are (1 - STRIPE_DEPTH) as bright as light ones
RADIUS = (0.5, 0.8)  # ellipse semi-axes, in half image widths
MAX_CLASSES = 100


@dataclass(frozen=True)
class ClassificationParams:
    """What a classification data set's samples depend on besides seed and index."""

    classes: int = 10
    channels: int = 3
    height: int = 32
    width: int = 32
    noise: float = 0.06  # per-pixel noise, standard deviation on a 0..1 intensity scale

    def __post_init__(self) -> None:
        if not 2 <= self.classes <= MAX_CLASSES:
            raise ValueError(f"classes must be between 2 and {MAX_CLASSES}, not {self.classes}")
        if self.channels < 1:
            raise ValueError(f"channels must be at least 1, not {self.channels}")
        if self.height < 8 or self.width < 8:
            raise ValueError(f"image size {self.height}x{self.width} is too small: use at least 8x8")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be between 0 and 1, not {self.noise}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ClassificationGenerator:
    """Labelled images; sample ``i`` depends only on (seed, split, params, i)."""

    kind = "classification"
    version = VERSION

    def __init__(self, params: ClassificationParams, seed: int, split: str) -> None:
        self.params = params
        self.seed = int(seed)
        self.split = split
        h, w = params.height, params.width
        scale = 2.0 / min(h, w)  # coordinates in [-1, 1] across the shorter side
        self._y = ((np.arange(h) - (h - 1) / 2) * scale)[:, None]
        self._x = ((np.arange(w) - (w - 1) / 2) * scale)[None, :]
        self._pixel = scale

    def datasets(self) -> list[DatasetSpec]:
        p = self.params
        return [
            DatasetSpec("images", (p.channels, p.height, p.width), "uint8", stats_axis=0),
            DatasetSpec("labels", (), "int64"),
        ]

    def attrs(self) -> dict[str, Any]:
        names = [
            f"hue{360.0 * k / self.params.classes:.0f}_stripes{180.0 * ((k * GOLDEN) % 1.0):.0f}"
            for k in range(self.params.classes)
        ]
        return {"class_names": names, "pixel_format": "uint8 0..255, channels first"}

    def label(self, index: int) -> int:
        return index % self.params.classes

    def sample(self, index: int) -> dict[str, np.ndarray]:
        p = self.params
        label = self.label(index)
        rng = sample_rng(self.seed, "classification", self.split, index)
        c = p.channels
        chan = np.arange(c) / c
        # background: a random colour, a gentle gradient, no class information
        bg = rng.uniform(0.0, 1.0, c)
        g_ang = rng.uniform(0.0, 2 * math.pi)
        gradient = (self._x * math.cos(g_ang) + self._y * math.sin(g_ang)) * rng.uniform(0.0, 0.2)
        img = bg[:, None, None] + gradient[None] * rng.choice((-1.0, 1.0), c)[:, None, None]

        # distractor: a plain blob of a random colour
        if rng.random() < 0.5:
            dc = rng.uniform(0.0, 1.0, c)
            dx, dy = rng.uniform(-0.9, 0.9, 2)
            dr = rng.uniform(0.1, 0.3)
            alpha = self._coverage(np.hypot(self._x - dx, self._y - dy) - dr)
            img = img * (1.0 - alpha[None]) + dc[:, None, None] * alpha[None]

        # the object: an ellipse filled with stripes; the class sets the stripes' hue
        # (jittered so that neighbouring classes overlap) and their orientation
        hue = label / p.classes + rng.normal(0.0, HUE_JITTER)
        fg = 0.5 + 0.4 * np.cos(2 * math.pi * (hue + chan))
        theta = math.pi * ((label * GOLDEN) % 1.0) + rng.normal(0.0, math.radians(6.0))
        freq = rng.uniform(2.2, 3.2)  # stripes per unit length (the image is 2 units across)
        phase = rng.uniform(0.0, 2 * math.pi)
        ra, rb = rng.uniform(*RADIUS), rng.uniform(*RADIUS)
        cx, cy = rng.uniform(-0.9 + ra, 0.9 - ra), rng.uniform(-0.9 + rb, 0.9 - rb)
        stripes = 0.5 + 0.5 * np.cos(
            2 * math.pi * freq * ((self._x - cx) * math.cos(theta) + (self._y - cy) * math.sin(theta))
            + phase
        )
        pattern = fg[:, None, None] * ((1.0 - STRIPE_DEPTH) + STRIPE_DEPTH * stripes[None])
        d = np.hypot((self._x - cx) / ra, (self._y - cy) / rb) - 1.0
        alpha = self._coverage(d * min(ra, rb))
        img = img * (1.0 - alpha[None]) + pattern * alpha[None]

        img = img + rng.normal(0.0, p.noise, img.shape)
        pixels = np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
        return {"images": pixels, "labels": np.array(label, dtype=np.int64)}

    def _coverage(self, d: np.ndarray) -> np.ndarray:
        """Anti-aliased coverage of a pixel by the region d < 0."""
        return np.clip(0.5 - d / self._pixel, 0.0, 1.0)


def parse_size(text: str | None) -> tuple[int, int]:
    """``"HxW"`` or ``"S"`` -> (H, W); None -> CIFAR's 32 x 32."""
    if text is None:
        return 32, 32
    parts = text.lower().split("x")
    if not all(p.strip().isdigit() for p in parts) or len(parts) not in (1, 2):
        raise ValueError(f"image size {text!r} is not HxW or S (e.g. 32x32 or 64)")
    return (int(parts[0]), int(parts[-1]))
