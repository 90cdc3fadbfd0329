"""How low can CosmoFlow's eval_error go on repro500's synthetic universes?

MLPerf HPC 3.0.0 accepts a CosmoFlow log only once ``eval_error`` (the mean absolute error of
the four ``unitPar`` targets in [-1, 1]) reaches 0.124.  Whether a model can get there depends
first on how much the volumes say about the parameters.  The generator's field is Gaussian
before its lognormal and Poisson steps, so its power spectrum per redshift bin carries nearly
all of the information; this script measures the error of a small regressor on those spectra
(log band powers in log-spaced |k| bins, plus each bin's mean and r.m.s. of log1p(counts)).
That figure approximates the floor for the settings given: a CNN reading the voxels
does not beat it, and if it is above 0.124 no CPU budget will reach MLPerf's target.

Measured on 2 shared cores (1,500 training and 300 evaluation universes of 32^3, seed 124):

* default generator (8 particles per voxel, random amplitudes): 0.19 to 0.22, with n_s at
  ~0.3 and H_0 at ~0.4: the cosmic variance of a 32^3 box's spectrum hides their tilt;
* ``--fixed-amplitude --mean-count 512``: ~0.05 (n_s 0.08, H_0 0.09).

Run: ``python bench/cosmo_information.py [--size 32] [--mean-count 8] [--fixed-amplitude]``;
prints the per-parameter errors, the mean and its ratio to 0.124; exits 0 when the mean is
at or under 0.124.  Needs scikit-learn (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from repro500.data.cosmo import CosmoGenerator, CosmoParams
from repro500.data.layout import COSMO_PARAMS

MLPERF_TARGET = 0.124  # HPC 3.0.0 cosmoflow: eval_error <= 0.124
BINS = 8  # log-spaced |k| bins from the fundamental mode to the grid's corner


def spectrum_features(full: np.ndarray) -> np.ndarray:
    """log band powers, mean and r.m.s. of log1p(counts), per redshift bin of one universe."""
    size = full.shape[0]
    volume = np.log1p(full.astype(np.float32))
    k1, kz = np.fft.fftfreq(size), np.fft.rfftfreq(size)
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)
    edges = np.geomspace(1.0 / size, np.sqrt(3) / 2 + 1e-6, BINS + 1)
    which = np.digitize(k, edges) - 1
    which[which < 0] = BINS  # the mean mode: in the dropped slot, with any mode past the edges
    counts = np.bincount(which.ravel(), minlength=BINS + 1)[:BINS]
    features = []
    for c in range(volume.shape[-1]):
        channel = volume[..., c]
        power = np.abs(np.fft.rfftn(channel - channel.mean())) ** 2
        band = np.bincount(which.ravel(), weights=power.ravel(), minlength=BINS + 1)[:BINS]
        features += [*np.log(band / np.maximum(counts, 1) + 1e-9), channel.mean(), channel.std()]
    return np.array(features)


def universes(params: CosmoParams, seed: int, split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    gen = CosmoGenerator(params, seed, split)
    rows, targets = [], []
    for i in range(n):
        sample = gen.sample(i)
        rows.append(spectrum_features(sample["full"]))
        targets.append(sample["unitPar"])
    return np.array(rows), np.array(targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32, help="voxels per side")
    parser.add_argument("--mean-count", type=float, default=CosmoParams.mean_count)
    parser.add_argument("--voxel-mpc", type=float, default=CosmoParams.voxel_mpc)
    parser.add_argument("--fixed-amplitude", action="store_true")
    parser.add_argument("--train", type=int, default=1500, help="training universes")
    parser.add_argument("--eval", type=int, default=300, help="evaluation universes")
    parser.add_argument("--seed", type=int, default=124)
    args = parser.parse_args(argv)

    from sklearn.neural_network import MLPRegressor
    from sklearn.preprocessing import StandardScaler

    params = CosmoParams(size=args.size, mean_count=args.mean_count, voxel_mpc=args.voxel_mpc,
                         fixed_amplitude=args.fixed_amplitude)
    start = time.perf_counter()
    x_train, y_train = universes(params, args.seed, "train", args.train)
    x_eval, y_eval = universes(params, args.seed, "eval", args.eval)
    scaler = StandardScaler().fit(x_train)
    # One joint regressor: n_s and H_0 are told apart only together (both tilt P(k)).
    model = MLPRegressor(hidden_layer_sizes=(64, 64), alpha=1e-3, max_iter=2000, random_state=0)
    model.fit(scaler.transform(x_train), y_train)
    predicted = np.clip(model.predict(scaler.transform(x_eval)), -1.0, 1.0)
    error = np.abs(predicted - y_eval).mean(axis=0)
    guess = np.abs(y_eval - y_train.mean(axis=0)).mean(axis=0)  # predicting the mean
    elapsed_s = time.perf_counter() - start

    print(f"cosmo {args.size}^3, {args.mean_count:g} particles/voxel, voxel {args.voxel_mpc:g} Mpc/h, "
          f"{'fixed' if args.fixed_amplitude else 'random'} amplitudes; "
          f"{args.train} train / {args.eval} eval universes ({elapsed_s:.0f} s)")
    for name, e, g in zip(COSMO_PARAMS, error, guess, strict=True):
        print(f"  {name:8s} MAE {e:.3f}   (predicting the mean: {g:.3f})")
    mean_error = float(error.mean())
    print(f"spectrum-regressor eval_error {mean_error:.3f}; MLPerf target {MLPERF_TARGET}: "
          f"ratio {mean_error / MLPERF_TARGET:.2f}")
    return 0 if mean_error <= MLPERF_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
