"""``open_dataset``: real layouts and generated files load through the same code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import fixtures
from torch.utils.data import DataLoader

from repro500.data import collate_detection, open_dataset
from repro500.data.generate import generate
from repro500.errors import InvalidInput

_own_cache = fixtures.own_cache


def _write_real_climo(path, n=10, h=64, w=96):
    """A file laid out like the Extreme Weather dataset's climo_YYYY.h5: no repro500 attributes."""
    rng = np.random.default_rng(0)
    images = rng.normal(size=(n, 16, h, w)).astype(np.float32)
    images *= np.arange(1, 17, dtype=np.float32)[None, :, None, None] * 100  # very different channel scales
    images += np.arange(16, dtype=np.float32)[None, :, None, None] * 1000
    boxes = np.full((n, 15, 5), -1, dtype=np.int32)
    boxes[0, 0] = (10, 20, 30, 50, 1)  # ymin, xmin, ymax, xmax, class (tropical cyclone)
    boxes[0, 1] = (40, 0, 60, 95, 3)
    boxes[1, 0] = (5, 5, 5, 9, 0)  # degenerate in y: must still be a valid torchvision box
    with h5py.File(path, "w") as h5:
        h5.create_dataset("images", data=images)
        h5.create_dataset("boxes", data=boxes)
    return images, boxes


def test_ewa_loader_reads_a_file_in_the_real_layout(tmp_path):
    years = tmp_path / "climo"
    years.mkdir()
    images, _ = _write_real_climo(years / "climo_1979.h5")
    train = open_dataset("ewa", "train", path=years)
    evaluation = open_dataset("ewa", "eval", path=years / "climo_1979.h5")
    assert len(train) == 9 and len(evaluation) == 1  # the last 10% of samples is held out
    assert train.info["task"] == "detection" and train.info["in_channels"] == 16
    assert train.info["channel_names"][6] == "TMQ" and train.info["num_classes"] == 4

    image, target = train[0]
    assert image.dtype == torch.float32 and image.shape == (16, 64, 96)
    np.testing.assert_array_equal(image.numpy(), images[0])  # the file's values, as stored
    # per-channel statistics from the file, for the model to normalise with: the channels'
    # very different scales are what they must capture
    spread = images.std(axis=(0, 2, 3))
    assert np.all(np.abs(np.array(train.info["channel_mean"]) - images.mean(axis=(0, 2, 3))) < 0.1 * spread)
    np.testing.assert_allclose(train.info["channel_std"], spread, rtol=0.1)
    # (ymin, xmin, ymax, xmax, class) -> torchvision (x1, y1, x2, y2), labels class + 1
    assert target["boxes"].tolist() == [[20, 10, 50, 30], [0, 40, 95, 60]]
    assert target["labels"].tolist() == [2, 4] and target["labels"].dtype == torch.int64
    degenerate = train[1][1]["boxes"]
    assert degenerate.tolist() == [[5, 5, 9, 6]]
    empty = train[2][1]
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)
    assert evaluation[0][0].shape == (16, 64, 96)
    # statistics were computed once and cached for the next run
    assert list((tmp_path / "cache" / "data-stats").glob("*.json"))


def test_ewa_loader_reads_shards_in_sample_order_with_workers(tmp_path):
    for i in range(2):
        generate("ewa", tmp_path / "shards" / f"train-{i}.h5", samples=6, size="48x72", shard=(i, 2), seed=4)
    generate("ewa", tmp_path / "one.h5", samples=6, size="48x72", seed=4)
    whole = open_dataset("ewa", "train", path=tmp_path / "one.h5")
    # given in the wrong order on purpose: shards are ordered by their sample offset
    shards = open_dataset("ewa", "train", path=[tmp_path / "shards" / "train-1.h5", tmp_path / "shards" / "train-0.h5"])
    assert len(shards) == len(whole) == 6
    loader = DataLoader(shards, batch_size=2, num_workers=2, collate_fn=collate_detection)
    got = [(img, tgt) for images, targets in loader for img, tgt in zip(images, targets, strict=True)]
    for i, (img, tgt) in enumerate(got):
        ref_img, ref_tgt = whole[i]
        assert torch.equal(img, ref_img)
        assert torch.equal(tgt["boxes"], ref_tgt["boxes"]) and torch.equal(tgt["labels"], ref_tgt["labels"])
    # pooled shard statistics = one-pass statistics.  Both sides are float64 sums of the same
    # float32 values in other orders (sum and sum of squares of n values, var = E[x^2] - mean^2, a
    # few pooling operations): each errs by at most gamma_n (u = 2^-53) times rms = sqrt(mean^2 +
    # std^2) in the mean, 3 gamma_n rms^2 in the variance, so 3 gamma_n rms^2 / std in the std.
    mean, std = np.array(whole.info["channel_mean"]), np.array(whole.info["channel_std"])
    n = 6 * 48 * 72 + 16
    gamma = n * 2.0**-53 / (1 - n * 2.0**-53)
    rms2 = mean**2 + std**2
    assert np.all(np.abs(np.array(shards.info["channel_mean"]) - mean) <= 2 * gamma * np.sqrt(rms2))
    assert np.all(np.abs(np.array(shards.info["channel_std"]) - std) <= 2 * 3 * gamma * rms2 / std)
    with pytest.raises(InvalidInput, match="overlapping shards"):
        open_dataset("ewa", "train", path=[tmp_path / "one.h5", tmp_path / "shards" / "train-1.h5"])


# layout -> (create_dataset options, dtype, whether the loader reads samples as plain file bytes)
STORAGE = {
    "contiguous": ({}, "<f4", True),
    "chunk-per-sample": ({"chunks": (1, 16, 48, 72)}, "<f4", True),
    "gzip": ({"chunks": (1, 16, 48, 72), "compression": "gzip", "shuffle": True}, "<f4", False),
    "chunk-per-channel": ({"chunks": (1, 1, 48, 72)}, "<f4", False),
    "big-endian": ({}, ">f4", False),
    "float64": ({}, "<f8", False),  # HDF5 converts it to float32
}


@pytest.mark.parametrize("layout", sorted(STORAGE))
def test_ewa_samples_read_as_file_bytes_equal_hdf5_reads(tmp_path, monkeypatch, layout):
    from repro500.data import h5files

    options, dtype, direct_read = STORAGE[layout]
    path = tmp_path / "climo_1979.h5"
    images = np.random.default_rng(1).normal(1000.0, 50.0, size=(4, 16, 48, 72))
    with h5py.File(path, "w", userblock_size=512) as h5:  # sample addresses are offset by the userblock
        h5.create_dataset("images", data=images.astype(dtype), **options)
        h5.create_dataset("boxes", data=np.full((4, 15, 5), -1, dtype=np.float32))
    data = open_dataset("ewa", "train", path=path)
    assert (h5files.sample_offset(data.files.handle(0)["images"], 2) is not None) == direct_read
    direct = [data[i][0] for i in range(len(data))]
    monkeypatch.setattr(h5files, "sample_offset", lambda *args: None)  # every read through HDF5
    through_hdf5 = [data[i][0] for i in range(len(data))]
    assert all(torch.equal(a, b) for a, b in zip(direct, through_hdf5, strict=True))
    np.testing.assert_array_equal(direct[1].numpy(), images[1].astype(dtype).astype(np.float32))


def test_a_file_truncated_after_opening_is_one_clear_error(tmp_path):
    path = generate("ewa", tmp_path / "train.h5", samples=4, size="48x72").path
    data = open_dataset("ewa", "train", path=path)
    data[0]  # handles open
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 16 * 48 * 72 * 4)
    with pytest.raises(InvalidInput, match="train.h5: cannot be read .* corrupt or truncated"):
        data[len(data) - 1]
    # the same from a DataLoader worker: the same exception, its message still one sentence
    loader = DataLoader(data, batch_size=1, num_workers=1, collate_fn=collate_detection,
                        sampler=[len(data) - 1])
    with pytest.raises(InvalidInput) as raised:
        next(iter(loader))
    # (a worker opens the file afresh, and HDF5 itself sees it is short)
    assert str(raised.value).startswith(str(path)) and "truncated" in str(raised.value)
    assert "\n" not in str(raised.value) and "Traceback" not in str(raised.value)


@pytest.mark.slow
def test_the_detection_model_normalises_with_the_datasets_statistics(tmp_path):
    from repro500.workloads.trainer import train as trainer

    path = generate("ewa", tmp_path / "train.h5", samples=2, size="48x72").path
    data = open_dataset("ewa", "train", path=path)
    spec = trainer.TrainSpec(workload="detection", model="fasterrcnn_mobilenet_v3_fpn", dataset={},
                             target={"metric": "map_50", "value": 0.5}, epochs=1, batch_size=1,
                             model_options={"min_size": 48, "max_size": 72})
    model = trainer.build_model(spec, data.info)
    assert model.transform.image_mean == pytest.approx(data.info["channel_mean"])
    assert model.transform.image_std == pytest.approx(data.info["channel_std"])
    image = data[0][0]
    normalised = model.transform.normalize(image)
    stats = torch.tensor(data.info["channel_mean"])[:, None, None], torch.tensor(data.info["channel_std"])[:, None, None]
    torch.testing.assert_close(normalised, (image - stats[0]) / stats[1])


def _mapped_file(tensor):
    """The file whose pages hold ``tensor``'s data in this process (from /proc/self/maps), or None."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high:
            return fields[5].strip() if len(fields) == 6 else None
    return None


@pytest.mark.parametrize(
    ("compression", "strategy"), [("none", "file_descriptor"), ("gzip", "file_descriptor"), ("none", "file_system")]
)
def test_ewa_samples_from_workers_are_handed_over_without_a_copy(tmp_path, compression, strategy):
    path = generate("ewa", tmp_path / "train.h5", samples=4, size="48x72", compression=compression).path
    data = open_dataset("ewa", "train", path=path)
    loader = DataLoader(data, batch_size=2, num_workers=2, collate_fn=collate_detection)
    default = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        got = [image for images, _ in loader for image in images]
    finally:
        torch.multiprocessing.set_sharing_strategy(default)
    assert len(got) == 4 and all(type(image) is torch.Tensor for image in got)
    assert all(torch.equal(image, data[i][0]) for i, image in enumerate(got))
    if compression == "none":  # stored as plain bytes: the main process maps the file's own pages
        assert all(_mapped_file(image) == str(path) for image in got)
        got[0].mul_(2)  # copy-on-write: the tensor is the caller's, the file stays as it was
        assert torch.equal(got[0], 2 * data[0][0])
    else:  # decoded by HDF5 in the worker, into shared memory torch hands over as it is
        assert all(image.is_shared() and _mapped_file(image) != str(path) for image in got)


class _Changed(torch.utils.data.Dataset):
    """A worker-side transform that changes the sample in place: through a view with torch, or
    through numpy (which torch's version counter does not see)."""

    def __init__(self, data, how):
        self.data, self.how = data, how

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        image, target = self.data[i]
        if self.how == "torch":
            image[0].add_(1000.0)
        else:
            image.numpy()[0] += 1000.0
        return image, target


@pytest.mark.parametrize("how", ["torch", "numpy"])
def test_a_sample_changed_in_place_in_a_worker_arrives_changed(tmp_path, how):
    path = generate("ewa", tmp_path / "train.h5", samples=2, size="48x72").path
    data = open_dataset("ewa", "train", path=path)
    loader = DataLoader(_Changed(data, how), batch_size=1, num_workers=1, collate_fn=collate_detection)
    got = [images[0] for images, _ in loader]
    for i, image in enumerate(got):
        expected = data[i][0].clone()
        expected[0] += 1000.0
        assert torch.equal(image, expected) and _mapped_file(image) != str(path)


def _worker_sample(monkeypatch, tmp_path, index=1):
    """What file_tensor gives inside a DataLoader worker, made in this process."""
    from repro500.data import h5files, handoff

    path = generate("ewa", tmp_path / "train.h5", samples=2, size="48x72").path
    data = open_dataset("ewa", "train", path=path)
    offset = h5files.sample_offset(data.files.handle(0)["images"], index)
    with monkeypatch.context() as m:
        m.setattr(handoff, "get_worker_info", lambda: object())
        sample = handoff.file_tensor(data.files.fd(0), offset, (16, 48, 72), str(path))
    assert type(sample) is handoff._FileSample
    return sample, data[index][0], path


def test_a_worker_sample_travels_as_its_file_only_through_the_dataloaders_pickler(tmp_path, monkeypatch):
    import copy
    from multiprocessing.reduction import ForkingPickler

    sample, expected, path = _worker_sample(monkeypatch, tmp_path)
    received = pickle.loads(ForkingPickler.dumps(sample))  # the DataLoader queue's way
    assert type(received) is torch.Tensor and torch.equal(received, expected) and _mapped_file(received) == str(path)
    for other in (pickle.loads(pickle.dumps(sample)), copy.deepcopy(sample)):  # torch.save, a cache, a copy
        assert type(other) is torch.Tensor and torch.equal(other, expected) and _mapped_file(other) != str(path)
    assert type(sample * 2) is torch.Tensor  # operations give plain tensors


def test_a_file_replaced_while_its_samples_travel_is_one_clear_error(tmp_path, monkeypatch):
    from multiprocessing.reduction import ForkingPickler

    sample, _, path = _worker_sample(monkeypatch, tmp_path)
    message = ForkingPickler.dumps(sample)
    generate("ewa", path, samples=2, size="48x72", seed=9, force=True)  # a new file renamed over it
    with pytest.raises(InvalidInput, match="train.h5 was replaced by another file while it was being read"):
        pickle.loads(message)


def test_small_target_tensors_travel_as_values(tmp_path):
    path = generate("ewa", tmp_path / "train.h5", samples=4, size="48x72").path
    data = open_dataset("ewa", "train", path=path)
    loader = DataLoader(data, batch_size=2, num_workers=1, collate_fn=collate_detection)
    targets = [t for _, batch in loader for t in batch]
    for i, target in enumerate(targets):
        for key in ("boxes", "labels"):
            assert type(target[key]) is torch.Tensor and not target[key].is_shared()  # no file descriptor
            assert torch.equal(target[key], data[i][1][key])


def test_split_directories_and_split_attributes_choose_the_files(tmp_path):
    generate("ewa", tmp_path / "d" / "train.h5", samples=3, size="48x72")
    generate("ewa", tmp_path / "d" / "eval.h5", samples=2, size="48x72", split="eval")
    assert len(open_dataset("ewa", "train", path=tmp_path / "d")) == 3
    assert len(open_dataset("ewa", "eval", path=tmp_path / "d")) == 2
    assert len(open_dataset("ewa", "eval", path=str(tmp_path / "d" / "*.h5"))) == 2
    with pytest.raises(InvalidInput, match="--split eval"):
        open_dataset("ewa", "eval", path=tmp_path / "d" / "train.h5")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    generate("ewa", mixed / "synthetic.h5", samples=2, size="64x96")
    _write_real_climo(mixed / "climo_1980.h5", n=3)
    with pytest.raises(InvalidInput, match="mixes generated files"):
        open_dataset("ewa", "eval", path=mixed)


def test_imagefolder_reads_class_directories(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for k, cls in enumerate(("cat", "dog")):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (40, 30), (100 * k, 50, 20 * i)).save(tmp_path / split / cls / f"{i}.png")
    train = open_dataset("imagefolder", "train", path=tmp_path, params={"size": 24})
    evaluation = open_dataset("imagefolder", "eval", path=tmp_path, params={"size": 24})
    assert len(train) == len(evaluation) == 4 and train.info["num_classes"] == 2
    image, label = train[3]
    assert image.shape == (3, 24, 24) and label.dtype == torch.int64 and label.item() == 1
    assert train.info["class_names"] == ["cat", "dog"]


def _write_cifar(root, per_batch=4, test=3):
    rng = np.random.default_rng(1)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {}
    for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", test)]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(x) for x in rng.integers(0, 10, size=n)]
        batches[name] = (data, labels)
        with open(folder / name, "wb") as fh:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"x.png"] * n}, fh, protocol=2)
    return batches


def test_cifar10_loader_reads_the_python_pickle_archive(tmp_path):
    batches = _write_cifar(tmp_path)
    train = open_dataset("cifar10", "train", path=tmp_path)
    test = open_dataset("cifar10", "eval", path=tmp_path / "cifar-10-batches-py")
    assert len(train) == 20 and len(test) == 3 and train.info["num_classes"] == 10
    image, label = train[5]  # batch 2, row 1
    data, labels = batches["data_batch_2"]
    assert label.item() == labels[1] and label.dtype == torch.int64
    red = data[1, :1024].reshape(32, 32).astype(np.float32)
    # Loader and test normalise in float32 in their own orders: a few roundings of values <= 1
    # divided by 0.247, so <= ~5 u32 (1 - 0.49) / 0.247 + 5 u32 |result| < 1e-6: 1e-5 covers any order.
    np.testing.assert_allclose(image[0].numpy(), (red / 255 - 0.4914) / 0.2470, rtol=1e-5, atol=1e-5)
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32


def test_cifar10_loader_refuses_missing_and_malicious_batches(tmp_path):
    _write_cifar(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    (folder / "data_batch_3").unlink()
    with pytest.raises(InvalidInput, match="data_batch_3 is missing"):
        open_dataset("cifar10", "train", path=tmp_path)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(InvalidInput, match="not a CIFAR-10 python batch"):
        open_dataset("cifar10", "eval", path=tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_cosmo_loader_returns_crops_and_targets(tmp_path):
    generate("cosmo", tmp_path / "c.h5", samples=2, size="16")
    ds = open_dataset("cosmo", "train", path=tmp_path / "c.h5", params={"crop": 8})
    assert len(ds) == 2 * 8 and ds.info["num_targets"] == 4 and ds.info["task"] == "regression"
    volume, target = ds[9]  # universe 1, crop 1
    with h5py.File(tmp_path / "c.h5", "r") as h5:
        counts, unit = h5["full"][1, 0:8, 0:8, 8:16, :], h5["unitPar"][1]
    np.testing.assert_allclose(volume.numpy(), np.log1p(np.moveaxis(counts, -1, 0).astype(np.float32)))
    assert volume.shape == (4, 8, 8, 8) and torch.equal(target, torch.from_numpy(unit))

    # real CosmoFlow files hold one universe each: (D, D, D, 4) counts and (4,) targets
    real = [tmp_path / "real" / f"univ_ics_2019-03_a1000066{k}.hdf5" for k in (8, 9)]
    real[0].parent.mkdir()
    for k, path in enumerate(real):
        with h5py.File(path, "w") as h5:
            h5["full"] = np.random.default_rng(k).poisson(2.0, size=(16, 16, 16, 4)).astype(np.int16)
            h5["unitPar"] = np.array([0.1, -0.2, 0.3, -0.4 + k], dtype=np.float32)
    train = open_dataset("cosmo", "train", path=tmp_path / "real")
    evaluation = open_dataset("cosmo", "eval", path=tmp_path / "real")
    assert len(train) == len(evaluation) == 1  # a universe is never split between train and eval
    assert evaluation[0][1].tolist() == pytest.approx([0.1, -0.2, 0.3, 0.6])
    assert train[0][0].shape == (4, 16, 16, 16)
    with pytest.raises(InvalidInput, match="too few"):
        open_dataset("cosmo", "eval", path=real[0])


def test_synthetic_classification_matches_the_generated_file(tmp_path):
    generate("classification", tmp_path / "cls.h5", samples=32, seed=9)
    in_memory = open_dataset("synthetic-classification", "train", seed=9, params={"samples": 32})
    from_file = open_dataset("classification-h5", "train", path=tmp_path / "cls.h5")
    assert len(in_memory) == len(from_file) == 32 and in_memory.info["num_classes"] == 10
    with h5py.File(tmp_path / "cls.h5", "r") as h5:
        pixels, labels = h5["images"][()], h5["labels"][()]
    for i in (0, 13, 31):
        assert np.array_equal(in_memory.generator.sample(i)["images"], pixels[i])
        image, label = from_file[i]
        assert label.item() == labels[i] == in_memory[i][1].item()
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert open_dataset("synthetic-classification", "eval").samples == 512


def test_synthetic_images_are_drawn_once_per_process_up_to_the_kept_bytes(monkeypatch):
    from repro500.data import synthetic
    from repro500.data.classification import ClassificationGenerator

    drawn = []
    sample = ClassificationGenerator.sample
    monkeypatch.setattr(ClassificationGenerator, "sample", lambda self, i: drawn.append((self.split, i)) or sample(self, i))
    monkeypatch.setattr(synthetic, "KEPT_BYTES", 10 * 3 * 8 * 8)  # ten 8x8 images a split
    synthetic._drawn.cache_clear()
    synthetic._normalisation.cache_clear()
    params = {"samples": 24, "size": "8x8"}
    first = open_dataset("synthetic-classification", "train", seed=5, params=params)
    assert drawn == [("train", i) for i in range(synthetic.STATS_SAMPLES)]  # the normalisation's
    epoch = [first[i][0] for i in range(24)]
    assert len(drawn) == synthetic.STATS_SAMPLES + 14  # 0..9 kept from the statistics, 10..23 drawn
    drawn.clear()
    # the next repeat's data set (a new object, as each repeat makes) and its next epoch read the kept
    # ten, draw the others again, and give the same tensors
    again = open_dataset("synthetic-classification", "train", seed=5, params=params)
    assert all(torch.equal(again[i][0], epoch[i]) for i in range(24))
    assert drawn == [("train", i) for i in range(10, 24)]
    drawn.clear()
    evaluation = open_dataset("synthetic-classification", "eval", seed=5, params=params)
    evaluation[0], evaluation[0]
    assert drawn == [("eval", 0)]  # its normalisation is the train split's, already made
    import pickle

    sent = pickle.loads(pickle.dumps(again))  # what a loader worker started by spawn receives
    assert not sent._drawn._images and torch.equal(sent[3][0], epoch[3])
    # another seed is other images
    assert not torch.equal(open_dataset("synthetic-classification", "train", seed=6, params=params)[0][0], epoch[0])
    synthetic._drawn.cache_clear()
    synthetic._normalisation.cache_clear()


def test_bad_dataset_requests_are_one_clear_error(tmp_path):
    generate("cosmo", tmp_path / "c.h5", samples=1, size="8")
    cases = [
        (("imagenet", "train"), {}, "unknown dataset"),
        (("ewa", "train"), {"path": tmp_path / "nope.h5"}, "does not exist"),
        (("ewa", "train"), {}, "needs a path"),
        (("ewa", "train"), {"path": tmp_path / "c.h5"}, "not an EWA file"),
        (("ewa", "valid"), {"path": tmp_path / "c.h5"}, "unknown split"),
        (("imagefolder", "train"), {"path": tmp_path}, "no train directory"),
        (("cosmo", "train"), {"path": tmp_path / "c.h5", "params": {"crop_size": 4}}, "does not take"),
        (("cosmo", "train"), {"path": tmp_path / "c.h5", "params": {"crop": 9}}, "does not fit"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(InvalidInput, match=message):
            open_dataset(*args, **kwargs)


@pytest.mark.parametrize("offset", [2048, 6400, 7168])  # global heap, object header, dataset header
def test_corrupt_metadata_is_invalid_input_not_a_traceback(tmp_path, offset):
    good = generate("ewa", tmp_path / "good.h5", samples=4, size="64x96").path
    raw = bytearray(good.read_bytes())
    raw[offset:offset + 8] = bytes.fromhex("123456789abcdef0")
    (tmp_path / "bad.h5").write_bytes(bytes(raw))
    with pytest.raises(InvalidInput, match=r"bad\.h5: cannot be read .*corrupt"):
        open_dataset("ewa", "train", path=tmp_path / "bad.h5")


def test_corrupt_chunk_read_for_statistics_is_invalid_input(tmp_path):
    path = tmp_path / "climo_1980.h5"  # real layout: no stored statistics, so they are computed
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as h5:
        h5.create_dataset("images", data=rng.normal(size=(4, 16, 32, 48)).astype(np.float32),
                          chunks=(1, 16, 32, 48), compression="gzip")
        h5.create_dataset("boxes", data=np.full((4, 15, 5), -1, dtype=np.float32))
    with h5py.File(path, "r") as h5:
        info = h5["images"].id.get_chunk_info(0)
    raw = bytearray(path.read_bytes())
    raw[info.byte_offset + info.size // 3:info.byte_offset + info.size // 3 + 64] = b"\xff" * 64
    path.write_bytes(bytes(raw))
    with pytest.raises(InvalidInput, match=r"climo_1980\.h5: cannot be read .*corrupt"):
        open_dataset("ewa", "train", path=path)


def test_cifar10_augmentation_crops_and_flips_only_the_training_split(tmp_path):
    import torch

    _write_cifar(tmp_path)
    plain = open_dataset("cifar10", "train", path=tmp_path)
    augmented = open_dataset("cifar10", "train", path=tmp_path, params={"augment": True})
    evaluation = open_dataset("cifar10", "eval", path=tmp_path, params={"augment": True})
    reference, _ = plain[0]
    torch.manual_seed(0)
    draws = [augmented[0][0] for _ in range(20)]
    assert all(d.shape == reference.shape for d in draws)
    assert any(not torch.equal(d, reference) for d in draws)  # crops and flips happen
    # every draw is the padded image shifted by at most 4 pixels, possibly mirrored
    padded = torch.nn.functional.pad(reference, (4, 4, 4, 4))
    for d in draws:
        windows = [padded[:, t:t + 32, s:s + 32] for t in range(9) for s in range(9)]
        assert any(torch.equal(d, w) or torch.equal(d, w.flip(-1)) for w in windows)
    torch.manual_seed(0)
    assert torch.equal(augmented[0][0], draws[0])  # reproducible from torch's seed
    assert torch.equal(evaluation[0][0], open_dataset("cifar10", "eval", path=tmp_path)[0][0])


def test_cube_symmetries_are_the_48_isometries_of_a_cube():
    from repro500.data.cube import SYMMETRIES, symmetry

    d = 5
    coords = np.stack(np.meshgrid(*(np.arange(d),) * 3, indexing="ij")).astype(np.float32)  # (3, d, d, d)
    seen = set()
    for i in range(SYMMETRIES):
        moved = symmetry(coords, i)
        assert moved.shape == coords.shape
        # voxels that were neighbours are still neighbours: each step along an axis of the
        # result moves one voxel along one axis of the original (an isometry of the grid)
        for axis in (1, 2, 3):
            step = np.abs(np.diff(moved, axis=axis)).sum(axis=0)
            assert np.all(step == 1)
        # and every voxel appears exactly once
        assert len({tuple(v) for v in moved.reshape(3, -1).T.tolist()}) == d**3
        seen.add(moved.tobytes())
    assert len(seen) == SYMMETRIES == 48
    assert np.array_equal(symmetry(coords, 0), coords)
    with pytest.raises(ValueError, match="48 symmetries"):
        symmetry(coords, 48)


def test_cosmo_symmetry_augmentation_turns_training_crops_only(tmp_path):
    from repro500.data.cube import SYMMETRIES, symmetry

    generate("cosmo", tmp_path / "data" / "train.h5", samples=3, size="8", seed=4)
    generate("cosmo", tmp_path / "data" / "eval.h5", samples=2, size="8", seed=4, split="eval")
    params = {"augment": "symmetries"}
    plain = open_dataset("cosmo", "train", path=tmp_path / "data")
    turned = open_dataset("cosmo", "train", path=tmp_path / "data", params=params)
    torch.manual_seed(0)
    orientations = set()
    for _ in range(40):
        volume, target = turned[1]
        base, base_target = plain[1]
        assert torch.equal(target, base_target)
        matches = [i for i in range(SYMMETRIES)
                   if np.array_equal(volume.numpy(), symmetry(base.numpy(), i))]
        assert matches, "an augmented crop is not a rotation or reflection of the stored one"
        orientations.add(matches[0])
    assert len(orientations) > 10  # drawn at random, not one fixed turn
    evaluation = open_dataset("cosmo", "eval", path=tmp_path / "data", params=params)
    untouched = open_dataset("cosmo", "eval", path=tmp_path / "data")
    for i in range(len(evaluation)):
        assert torch.equal(evaluation[i][0], untouched[i][0])
    with pytest.raises(InvalidInput, match="augment 'flips'"):
        open_dataset("cosmo", "train", path=tmp_path / "data", params={"augment": "flips"})


def test_cosmo_standardization_uses_the_training_universes_for_both_splits(tmp_path):
    data = tmp_path / "data"
    generate("cosmo", data / "train.h5", samples=6, size="8", seed=4, options={"mean_count": 64.0})
    # the eval universes are much denser: statistics of their own would differ clearly
    generate("cosmo", data / "eval.h5", samples=3, size="8", seed=4, split="eval", options={"mean_count": 512.0})
    params = {"standardize": "log1p"}
    train = open_dataset("cosmo", "train", path=data, params=params)
    evaluation = open_dataset("cosmo", "eval", path=data, params=params)
    with h5py.File(data / "train.h5", "r") as h5:
        logs = np.log1p(h5["full"][()].astype(np.float64))  # (N, D, D, D, C)
    mean, std = logs.mean(axis=(0, 1, 2, 3)), logs.std(axis=(0, 1, 2, 3))
    # The loader takes log1p in float32 (numpy validates float32 log1p to 2 ulp: relative r = 4 u32
    # on every x86 code path) and sums in float64; the reference is float64 throughout.  Values
    # perturbed by at most r |y| (y >= 0) move the mean by <= r mean(y) and the std (1-Lipschitz in
    # the perturbation's rms) by <= r max(y); float64's own sums add gamma_n(u64) terms (the std's
    # E[y^2] - mean^2 cancellation: 3 gamma_n rms^2 / std).
    u32, n = 2.0**-24, logs[..., 0].size
    r = 4 * u32
    gamma = n * 2.0**-53 / (1 - n * 2.0**-53)
    mean_err = r * mean + 2 * gamma * mean
    std_err = r * logs.max(axis=(0, 1, 2, 3)) + 2 * 3 * gamma * (mean**2 + std**2) / std
    for ds in (train, evaluation):
        assert np.all(np.abs(np.array(ds.info["input_mean"]) - mean) <= mean_err)
        assert np.all(np.abs(np.array(ds.info["input_std"]) - std) <= std_err)
    with h5py.File(data / "eval.h5", "r") as h5:
        counts = h5["full"][1]
    y = np.log1p(np.moveaxis(counts, -1, 0).astype(np.float64))
    m, s = mean[:, None, None, None], std[:, None, None, None]
    expected = (y - m) / s
    # (log1p_f32(y) - f32(mean')) * f32(1 / std'), with mean', std' the loader's statistics (off by
    # mean_err, std_err above): log1p's r y, mean's rounding u m and mean_err, the subtraction's
    # u |y - m|, all over s; then 1/std's two roundings, the product's, and std_err / s, relative.
    bound = (r * y + u32 * m + mean_err[:, None, None, None] + u32 * np.abs(y - m)) / s \
        + (3 * u32 + std_err[:, None, None, None] / s) * np.abs(expected)
    assert np.all(np.abs(evaluation[1][0].numpy() - expected) <= 1.01 * bound)  # 1.01: second-order terms
    assert abs(float(evaluation[1][0].mean())) > 0.5  # denser eval universes stay off-centre
    # an eval-only path cannot standardise: the training statistics are not in it
    with pytest.raises(InvalidInput, match="standardize: log1p takes its statistics from the training"):
        open_dataset("cosmo", "eval", path=data / "eval.h5", params=params)
