"""``repro500 data generate``: reproducible, shardable, atomic synthetic data with physical structure."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from scipy.stats import spearmanr

from repro500.data import classification, cosmo, ewa
from repro500.data.classification import ClassificationParams
from repro500.data.cosmo import CosmoGenerator, CosmoParams
from repro500.data.ewa import AR, ETC, TC, TD, EwaGenerator, EwaParams
from repro500.data.ewa_events import int_window
from repro500.data.generate import generate, shard_range
from repro500.data.layout import EWA_CHANNELS
from repro500.digest import file_digest
from repro500.errors import InvalidInput

REPRO500 = [sys.executable, "-m", "repro500.cli"]
PSL, TMQ = EWA_CHANNELS.index("PSL"), EWA_CHANNELS.index("TMQ")
UBOT, VBOT = EWA_CHANNELS.index("UBOT"), EWA_CHANNELS.index("VBOT")
GENERATOR_VERSIONS = {"ewa": ewa.VERSION, "cosmo": cosmo.VERSION, "classification": classification.VERSION}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPRO500, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as h5:
        return {name: h5[name][()] for name in h5}


@pytest.mark.parametrize(
    ("kind", "size", "n"), [("ewa", "64x96", 5), ("cosmo", "16", 3), ("classification", None, 40)]
)
def test_same_seed_gives_identical_files_and_another_seed_differs(tmp_path, kind, size, n):
    a = generate(kind, tmp_path / "a.h5", samples=n, size=size, seed=7)
    b = generate(kind, tmp_path / "b.h5", samples=n, size=size, seed=7)
    c = generate(kind, tmp_path / "c.h5", samples=n, size=size, seed=8)
    assert file_digest(a.path, "md5") == file_digest(b.path, "md5")
    main = {"ewa": "images", "cosmo": "full", "classification": "images"}[kind]
    assert not np.array_equal(_arrays(a.path)[main], _arrays(c.path)[main])
    with h5py.File(a.path, "r") as h5:  # the file says how it was made
        assert h5.attrs["kind"] == kind and h5.attrs["seed"] == 7 and h5.attrs["split"] == "train"
        assert h5.attrs["generator"] == f"repro500.workloads.data.{kind}"  # a stable name: it is in the file's bytes
        assert h5.attrs["samples_total"] == n and "params" in h5.attrs
        assert "generator_version" in h5.attrs
        assert h5.attrs["generator_version"] == GENERATOR_VERSIONS[kind]


@pytest.mark.parametrize(
    ("kind", "size", "n"), [("ewa", "48x72", 7), ("cosmo", "16", 5), ("classification", "16x16", 9)]
)
def test_two_shards_hold_exactly_the_arrays_of_one_pass(tmp_path, kind, size, n):
    one = _arrays(generate(kind, tmp_path / "all.h5", samples=n, size=size, seed=3).path)
    # the shards are written by separate processes, as on a cluster
    for i in range(2):
        proc = _cli("data", "generate", kind, "--out", f"part{i}.h5", "--samples", str(n),
                    "--size", size, "--seed", "3", "--shard", f"{i}/2", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    parts = [_arrays(tmp_path / f"part{i}.h5") for i in range(2)]
    # contiguous blocks: the first floor(n/2) samples, then the rest
    assert [len(next(iter(p.values()))) for p in parts] == [n // 2, n - n // 2]
    for name, whole in one.items():
        joined = np.concatenate([p[name] for p in parts])
        assert joined.dtype == whole.dtype
        assert joined.tobytes() == whole.tobytes(), name
    with h5py.File(tmp_path / "part1.h5", "r") as h5:
        assert h5.attrs["sample_offset"] == shard_range(n, 1, 2)[0] and h5.attrs["shard"] == "1/2"


def test_train_and_eval_splits_draw_different_samples(tmp_path):
    gen_train = EwaGenerator(EwaParams(48, 72), 0, "train")
    gen_eval = EwaGenerator(EwaParams(48, 72), 0, "eval")
    assert not np.array_equal(gen_train.sample(0)["images"], gen_eval.sample(0)["images"])


def test_ewa_boxes_are_in_bounds_tight_and_cover_their_event():
    h, w = 192, 288
    gen = EwaGenerator(EwaParams(h, w), seed=11, split="train")
    seen = set()
    for i in range(12):
        sample = gen.sample(i)
        boxes = sample["boxes"]
        events = gen.events(i)
        anomaly = sample["images"] - gen.background(i)  # what the events added
        valid = boxes[boxes[:, 4] >= 0]
        assert len(valid) == len(events) and np.all(boxes[len(events):] == -1)
        for (ymin, xmin, ymax, xmax, cls), ev in zip(valid, events, strict=True):
            assert 0 <= ymin < ymax <= h and 0 <= xmin < xmax <= w
            seen.add(int(cls))
            y0, x0, y1, x1 = int_window(ev)
            if cls == AR:
                field = anomaly[TMQ, y0:y1, x0:x1]  # the river's moisture
            else:
                field = -anomaly[PSL, y0:y1, x0:x1]  # the cyclone's pressure drop
            peak_y, peak_x = np.unravel_index(np.argmax(field), field.shape)
            assert ymin <= y0 + peak_y < ymax and xmin <= x0 + peak_x < xmax
            # tight: outside the box the event's signature stays below 10% of its peak
            outside = field.copy()
            outside[int(ymin) - y0:int(ymax) - y0, int(xmin) - x0:int(xmax) - x0] = 0
            assert outside.max() <= 0.12 * field.max()
    assert seen == {TD, TC, ETC, AR}


def _elongation(weights: np.ndarray) -> float:
    """sqrt of the ratio of the principal second moments of a non-negative blob."""
    ys, xs = np.indices(weights.shape)
    total = weights.sum()
    my, mx = (weights * ys).sum() / total, (weights * xs).sum() / total
    cov = np.cov(np.stack([ys.ravel() - my, xs.ravel() - mx]), aweights=weights.ravel())
    low, high = np.linalg.eigvalsh(cov)
    return float(np.sqrt(high / max(low, 1e-9)))


def test_moisture_blob_shape_separates_rivers_from_tropical_cyclones():
    gen = EwaGenerator(EwaParams(192, 288), seed=5, split="train")
    rivers, cyclones = [], []
    for i in range(20):
        sample = gen.sample(i)
        moisture = sample["images"][TMQ] - gen.background(i)[TMQ]
        for ymin, xmin, ymax, xmax, cls in sample["boxes"]:
            if cls in (AR, TC, TD):
                blob = np.clip(moisture[int(ymin):int(ymax), int(xmin):int(xmax)], 0, None)
                (rivers if cls == AR else cyclones).append(_elongation(blob))
    assert len(rivers) >= 5 and len(cyclones) >= 5
    threshold = 2.0
    correct = sum(e > threshold for e in rivers) + sum(e <= threshold for e in cyclones)
    assert correct / (len(rivers) + len(cyclones)) >= 0.95, (rivers, cyclones)


def test_event_classes_differ_as_in_the_real_data():
    # Measured in the written fields inside each written box, as a detector would see them.
    # 384x576: at smaller grids both tropical classes hit the minimum event width.
    h, w = 384, 576
    gen = EwaGenerator(EwaParams(h, w), seed=3, split="train")
    found: dict[int, list[tuple[float, float, float, float]]] = {TD: [], TC: [], ETC: []}
    for i in range(16):
        sample = gen.sample(i)
        anomaly = sample["images"] - gen.background(i)  # what the events added
        for ymin, xmin, ymax, xmax, cls in sample["boxes"].astype(int):
            if cls not in found:
                continue
            win = np.s_[ymin:ymax, xmin:xmax]
            pressure_drop_pa = -anomaly[PSL][win].min()
            wind_ms = np.hypot(anomaly[UBOT][win], anomaly[VBOT][win]).max()
            area_px = (ymax - ymin) * (xmax - xmin)
            abs_lat_deg = abs(-90.0 + 180.0 * (ymin + ymax) / 2 / h)  # row 0 is the south edge
            found[cls].append((pressure_drop_pa, wind_ms, area_px, abs_lat_deg))
    td, tc, etc = (np.array(found[c]) for c in (TD, TC, ETC))
    assert min(len(td), len(tc), len(etc)) >= 8, {c: len(v) for c, v in found.items()}
    # tropical depressions: weaker (pressure drop, wind) and smaller than tropical cyclones
    assert td[:, 0].max() < tc[:, 0].min() and td[:, 1].max() < tc[:, 1].min()
    assert np.median(td[:, 2]) <= 0.75 * np.median(tc[:, 2])
    # extratropical cyclones: mid-latitude, poleward of every tropical cyclone
    assert etc[:, 3].min() > tc[:, 3].max() and etc[:, 3].min() >= 30.0


def test_ewa_fields_are_physically_shaped():
    gen = EwaGenerator(EwaParams(96, 144), seed=2, split="train")
    img = np.mean([gen.background(i) for i in range(4)], axis=0)
    rows = img.mean(axis=2)  # zonal means, row 0 = south pole
    ts, tmq = rows[EWA_CHANNELS.index("TS")], rows[TMQ]
    eq, pole_s, pole_n = 48, 2, 93
    assert ts[eq] > ts[pole_s] + 30 and ts[eq] > ts[pole_n] + 30  # warm tropics, cold poles
    assert tmq[eq] > 4 * tmq[pole_s] and tmq[eq] > 4 * tmq[pole_n]  # moist tropics
    assert np.all(img[EWA_CHANNELS.index("PRECT")] >= 0)
    assert 9.0e4 < np.median(img[PSL]) < 1.1e5
    assert img.dtype == np.float32


def test_cosmo_volumes_carry_their_parameters():
    gen = CosmoGenerator(CosmoParams(size=32), seed=1, split="train")
    sigma_8, log_var = [], []
    for i in range(16):
        s = gen.sample(i)
        sigma_8.append(float(s["physPar"][1]))
        log_var.append(float(np.log1p(s["full"][..., 0].astype(np.float64)).var()))
        assert np.all(np.abs(s["unitPar"]) <= 1.0) and s["full"].min() >= 0
    rho, _ = spearmanr(sigma_8, log_var)
    assert rho > 0.8, rho  # more clustering (sigma_8) -> more variance in the counts
    with pytest.raises(ValueError):
        CosmoParams(size=4)


def _realised_sigma_8(delta: np.ndarray, voxel_mpc: float) -> float:
    """r.m.s. of ``delta`` in 8 Mpc/h top-hat spheres, from its Fourier modes (Parseval)."""
    k1 = 2 * np.pi * np.fft.fftfreq(delta.shape[0], d=voxel_mpc)
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + k1[None, None, :] ** 2)
    x = np.maximum(k * 8.0, 1e-6)
    tophat = 3.0 * (np.sin(x) - x * np.cos(x)) / x**3
    power = np.abs(np.fft.fftn(delta.astype(np.float64))) ** 2
    return float(np.sqrt((power * tophat**2).sum() / delta.size**2))


def test_fixed_amplitude_universes_have_exactly_their_sigma_8():
    # sigma_8 is defined by the power spectrum: with fixed amplitudes every universe realises
    # it exactly, with random ones a 16^3 box scatters by percents (its cosmic variance).
    scatter = {}
    for fixed in (False, True):
        gen = CosmoGenerator(CosmoParams(size=16, fixed_amplitude=fixed), seed=2, split="train")
        ratios = [_realised_sigma_8(gen.density(i), gen.params.voxel_mpc) / gen.parameters(i)[1]
                  for i in range(8)]
        scatter[fixed] = np.abs(np.log(ratios)).max()
    # float32 rounding bound: the modulus set per mode (about 6 u32) plus a float32 inverse FFT's
    # normwise error, log2(16^3) * (u + gamma_4 sqrt 2) ~ 80 u32 (Higham, Accuracy and Stability,
    # Thm 24.2): ~5e-6 (5e-8 measured).  1e-3 is the threshold, well apart from cosmic variance.
    assert scatter[True] < 1e-3, scatter
    assert scatter[False] > 0.01, scatter  # 0.03 measured


def test_default_cosmo_universes_keep_their_bytes():
    # Files generated before --fixed-amplitude and --mean-count existed must not change: the
    # option is off by default and left out of the params attribute.
    gen = CosmoGenerator(CosmoParams(size=16), seed=5, split="train")
    full = gen.sample(3)["full"]
    digest = hashlib.sha256(full.tobytes()).hexdigest()
    assert digest == "70c8115262e1e7483fd37795c6682bcc3bc5be4b7b7ccdcc3598b6971d88f1d1"
    assert "fixed_amplitude" not in CosmoParams().as_dict()


def test_cosmo_generator_options_reach_the_file(tmp_path):
    proc = _cli("data", "generate", "cosmo", "--out", "c.h5", "--samples", "2", "--size", "16",
                "--mean-count", "64", "--fixed-amplitude", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "c.h5", "r") as h5:
        params = json.loads(h5.attrs["params"])
        full = h5["full"][()]
    assert params["mean_count"] == 64.0 and params["fixed_amplitude"] is True
    assert 50 < full.mean() < 80  # 64 particles per voxel on average, not the default 8


def test_classification_images_have_class_structure():
    from repro500.data.classification import ClassificationGenerator, ClassificationParams

    gen = ClassificationGenerator(ClassificationParams(), seed=0, split="train")
    samples = [gen.sample(i) for i in range(200)]
    labels = np.array([int(s["labels"]) for s in samples])
    assert np.bincount(labels).tolist() == [20] * 10
    # nearest class mean on the spatial power spectrum (the stripes' direction) beats chance by far
    spectra = np.array([np.abs(np.fft.fft2(s["images"].mean(axis=0) - s["images"].mean())) for s in samples])
    feats = spectra.reshape(len(samples), -1)
    train, test = slice(0, 100), slice(100, 200)
    means = np.stack([feats[train][labels[train] == k].mean(axis=0) for k in range(10)])
    dist = ((feats[test][:, None, :] - means[None]) ** 2).sum(axis=2)
    accuracy = (dist.argmin(axis=1) == labels[test]).mean()
    assert accuracy > 0.5, accuracy  # 0.67 measured; shuffled labels give ~0.1
    assert samples[0]["images"].dtype == np.uint8 and samples[0]["images"].shape == (3, 32, 32)


def test_existing_output_is_refused_without_force(tmp_path):
    out = tmp_path / "data.h5"
    out.write_bytes(b"precious")
    proc = _cli("data", "generate", "classification", "--out", str(out), "--samples", "10", cwd=tmp_path)
    assert proc.returncode == 4
    assert proc.stderr.strip().splitlines() == [f"repro500: error: {out} already exists: pass --force to replace it"]
    assert out.read_bytes() == b"precious"
    proc = _cli("data", "generate", "classification", "--out", str(out), "--samples", "10", "--force", cwd=tmp_path)
    assert proc.returncode == 0 and h5py.is_hdf5(out)


def test_bad_options_are_usage_errors(tmp_path):
    for args in (["ewa", "--size", "12x7"], ["ewa", "--shard", "2/2"], ["cosmo", "--classes", "3"],
                 ["ewa", "--mean-count", "9"], ["classification", "--fixed-amplitude"],
                 ["classification", "--seed", str(2**200)]):  # a seed HDF5 cannot store as an attribute
        proc = _cli("data", "generate", *args, "--out", "x.h5", cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.h5").exists()


def test_help_states_the_noise_default_the_generator_uses(tmp_path):
    proc = _cli("data", "generate", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"(default {ClassificationParams.noise})" in " ".join(proc.stdout.split())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_generation_leaves_no_complete_looking_file(tmp_path, sig):
    out = tmp_path / "big.h5"
    proc = subprocess.Popen(
        [*REPRO500, "data", "generate", "ewa", "--out", str(out), "--samples", "400", "--size", "384x576"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a shell running us in the background may ignore SIGINT; the child must not inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".partial") and p.stat().st_size > 10**6 for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "generation never started writing"
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=60)
    assert not out.exists()
    if sig != signal.SIGKILL:
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr
        assert list(tmp_path.iterdir()) == []  # the partial file was removed too
    else:  # nothing can clean up after SIGKILL, but what is left is hidden and says .partial
        assert all(p.name.startswith(".") and p.name.endswith(".partial") for p in tmp_path.iterdir())


def test_an_output_under_a_file_names_the_file_that_is_not_a_directory(tmp_path):
    proc = _cli("data", "generate", "classification", "--out", "/dev/null/x.h5", "--samples", "4", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "/dev/null is not a directory" in proc.stderr and "Errno" not in proc.stderr


def test_generate_refuses_a_directory_as_output(tmp_path):
    with pytest.raises(InvalidInput, match="is a directory"):
        generate("classification", tmp_path, samples=4)
