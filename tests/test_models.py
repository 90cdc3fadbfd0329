"""The model factory: every model builds without downloads, trains a step on CPU, rejects bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from repro500.errors import EXIT_USAGE, UsageError
from repro500.workloads.models import build_model, model_names, model_options, model_task


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The test machine's cores are shared: one intra-op thread avoids oversubscription stalls.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _sgd_steps(model, inputs, labels, steps: int, lr: float = 0.05) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(
    ("name", "millions"), [("resnet20", 0.27), ("resnet44", 0.66), ("resnet56", 0.85)]
)
def test_cifar_resnets_have_the_papers_parameter_counts(name, millions):
    model = build_model(name)
    assert round(_param_count(model) / 1e6, 2) == millions
    # 6n + 2 weighted layers: the stem, 2 convolutions per block, the classifier.
    depth = int(name.removeprefix("resnet"))
    weighted = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    assert len(weighted) == depth


def test_resnet20_learns_a_fixed_batch():
    torch.manual_seed(0)
    model = build_model("resnet20", num_classes=10)
    inputs, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    losses = _sgd_steps(model, inputs, labels, steps=3)
    assert all(map(torch.isfinite, torch.tensor(losses)))
    assert losses[-1] < losses[0]


def test_cifar_resnet_takes_other_channel_and_class_counts():
    model = build_model("resnet44", num_classes=7, in_channels=16)
    assert model(torch.randn(2, 16, 32, 32)).shape == (2, 7)


def test_cifar_resnet_depth_must_be_6n_plus_2():
    from repro500.workloads.models.cifar_resnet import cifar_resnet

    with pytest.raises(UsageError, match="6n\\+2"):
        cifar_resnet(21)


@pytest.mark.parametrize(
    ("name", "options", "shape"),
    [
        ("resnet18", {"small_input": True}, (2, 3, 16, 16)),
        ("resnet50", {"in_channels": 1, "num_classes": 10}, (2, 1, 32, 32)),
    ],
)
def test_torchvision_resnets_train_a_step(name, options, shape):
    torch.manual_seed(0)
    model = build_model(name, **options)
    before = [p.detach().clone() for p in model.parameters()]
    labels = torch.randint(0, model.fc.out_features, (shape[0],))
    (loss,) = _sgd_steps(model, torch.randn(shape), labels, steps=1)
    assert torch.isfinite(torch.tensor(loss))
    assert all(p.grad is not None for p in model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_torchvision_resnet_stems():
    plain = build_model("resnet18")
    assert plain.conv1.kernel_size == (7, 7) and plain.fc.out_features == 1000
    multi = build_model("resnet18", in_channels=16)
    assert multi.conv1.in_channels == 16 and multi.conv1.kernel_size == (7, 7)
    small = build_model("resnet18", small_input=True, num_classes=10)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, torch.nn.Identity)
    # The small stem keeps a 16x16 input at 16x16 into the first stage (the 7x7/2 stem + pool: 4x4).
    assert (
        small.layer1(small.relu(small.bn1(small.conv1(torch.randn(1, 3, 16, 16))))).shape[-1] == 16
    )


SMALL_DETECTION = {
    "min_size": 64,
    "max_size": 96,
    "rpn_pre_nms_top_n": 100,
    "rpn_post_nms_top_n": 50,
    "rpn_batch_size_per_image": 64,
    "box_batch_size_per_image": 64,
    "box_detections_per_img": 20,
}


def _detection_batch():
    images = [torch.randn(16, 64, 96), torch.randn(16, 64, 96)]
    targets = [
        {
            "boxes": torch.tensor([[10.0, 10.0, 30.0, 25.0], [40.0, 20.0, 70.0, 50.0]]),
            "labels": torch.tensor([1, 3]),
        },
        {"boxes": torch.tensor([[5.0, 5.0, 20.0, 20.0]]), "labels": torch.tensor([4])},
    ]
    return images, targets


@pytest.mark.parametrize(
    ("name", "anchor_sizes"),
    [
        ("fasterrcnn_resnet18_fpn", [8, 16, 32, 64, 128]),
        ("fasterrcnn_resnet50_fpn", [8, 16, 32, 64, 128]),
        ("fasterrcnn_mobilenet_v3_fpn", [8, 16, 32]),
    ],
)
def test_faster_rcnn_on_16_channel_fields(name, anchor_sizes):
    torch.manual_seed(0)
    model = build_model(
        name, num_classes=5, in_channels=16, anchor_sizes=anchor_sizes, **SMALL_DETECTION
    )
    assert model_task(name) == "detection"
    assert len(model.transform.image_mean) == 16 and set(model.transform.image_mean) == {0.0}
    assert set(model.transform.image_std) == {1.0}
    assert model.roi_heads.box_predictor.cls_score.out_features == 5
    images, targets = _detection_batch()

    # Native size is kept: the transform neither rescales nor renormalises the fields.
    model.eval()
    transformed, _ = model.transform(images)
    assert transformed.image_sizes == [(64, 96), (64, 96)]
    assert torch.allclose(transformed.tensors[0, :, :64, :96], images[0])

    model.train()
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9
    )
    losses = model(images, targets)
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    total = sum(losses.values())
    assert torch.isfinite(total)
    optimizer.zero_grad()
    total.backward()
    optimizer.step()
    assert all(p.requires_grad for p in model.parameters()), (
        "an untrained backbone must train every layer"
    )

    model.eval()
    with torch.no_grad():
        detections = model(images)
    assert len(detections) == 2
    for found in detections:
        assert set(found) == {"boxes", "labels", "scores"}
        assert (
            found["boxes"].shape[1] == 4
            and len(found["boxes"]) <= SMALL_DETECTION["box_detections_per_img"]
        )
        assert ((found["labels"] >= 1) & (found["labels"] <= 4)).all()


def test_faster_rcnn_first_convolution_takes_16_channels():
    resnet = build_model(
        "fasterrcnn_resnet18_fpn", **SMALL_DETECTION, anchor_sizes=[8, 16, 32, 64, 128]
    )
    assert resnet.backbone.body.conv1.in_channels == 16
    mobile = build_model("fasterrcnn_mobilenet_v3_fpn", **SMALL_DETECTION)
    assert mobile.backbone.body["0"][0].in_channels == 16


def test_faster_rcnn_rejects_wrong_anchor_count():
    with pytest.raises(UsageError, match="5 anchor_sizes"):
        build_model("fasterrcnn_resnet18_fpn", anchor_sizes=[8, 16, 32])


def test_cosmoflow_regresses_four_parameters():
    torch.manual_seed(0)
    model = build_model(
        "cosmoflow", crop_size=16, base_channels=4, depth=2, fc1_size=32, fc2_size=16
    )
    assert model_task("cosmoflow") == "regression"
    volumes, targets = torch.randn(4, 4, 16, 16, 16), torch.rand(4, 4) * 2 - 1
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        predictions = model(volumes)
        assert predictions.shape == (4, 4) and predictions.abs().max() <= 1.2
        loss = F.mse_loss(predictions, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_cosmoflow_odd_kernel_and_linear_output():
    model = build_model(
        "cosmoflow", crop_size=8, base_channels=2, depth=1, kernel_size=3, output_activation="none"
    )
    assert model(torch.randn(1, 4, 8, 8, 8)).shape == (1, 4)


def test_cosmoflow_rejects_crop_too_small_for_depth():
    with pytest.raises(UsageError, match="crop_size 16 is too small for depth 5"):
        build_model("cosmoflow", crop_size=16, depth=5)


def test_every_name_has_a_task():
    assert {model_task(name) for name in model_names()} == {
        "classification",
        "detection",
        "regression",
    }
    assert model_task("resnet56") == "classification"


def test_unknown_model_is_a_usage_error_listing_valid_names():
    with pytest.raises(UsageError) as caught:
        build_model("vgg16")
    assert caught.value.exit_code == EXIT_USAGE
    assert "resnet20" in str(caught.value) and "cosmoflow" in str(caught.value)
    with pytest.raises(UsageError, match="unknown model 'vgg16'"):
        model_task("vgg16")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"dropout_rate": 0.1},
            "has no option 'dropout_rate'; its options are: small_input, zero_init_residual",
        ),
        ({"small_input": "yes"}, "option 'small_input' must be bool"),
        ({"num_classes": 0}, "num_classes must be a positive integer"),
    ],
)
def test_bad_model_options_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        build_model("resnet18", **options)


def test_model_options_lists_defaults():
    assert model_options("cosmoflow")["base_channels"] == 16
    assert model_options("fasterrcnn_resnet50_fpn")["min_size"] == 768
    assert model_options("resnet20") == {}


def test_a_plugin_builder_written_with_ordinary_defaults_takes_its_options(tmp_path, monkeypatch):
    # the way most people write a builder: positional-or-keyword parameters with defaults
    (tmp_path / "labnet.py").write_text(
        "import torch\n"
        "def build(num_classes=4, in_channels=3, width=16):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(width), torch.nn.Linear(width, num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert model_options("labnet:build") == {"width": 16}
    model = build_model("labnet:build", num_classes=3, width=8)
    assert model[2].in_features == 8 and model[2].out_features == 3
    with pytest.raises(UsageError, match="has no option 'depth'; its options are: width"):
        build_model("labnet:build", depth=2)


def test_nothing_is_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    build_model("resnet18")
    build_model("fasterrcnn_mobilenet_v3_fpn", **SMALL_DETECTION)
    assert list(tmp_path.iterdir()) == []


def test_importing_the_factory_does_not_import_torch():
    # Asking a model's task loads its builder (an entry point: a plug-in's task is its own), so
    # only importing the package is promised to be cheap.
    code = "import sys, repro500.workloads.models as m; m.model_names(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_cosmoflow_covariance_head_sees_statistics_not_positions():
    torch.manual_seed(0)
    model = build_model("cosmoflow", crop_size=16, base_channels=4, depth=2, kernel_size=3,
                        head="covariance", padding="circular", pool="avg", fc1_size=16, fc2_size=8)
    volumes = torch.randn(6, 4, 16, 16, 16)
    model.train()
    model(volumes)  # one training batch sets the running statistics
    model.eval()
    assert model(volumes).shape == (6, 4)
    # A periodic box shifted by whole pooling cells is the same universe: in exact arithmetic the
    # same prediction.  Only the order of the sums over voxels changes, so the check runs in float64
    # (float32's rounding, amplified by the whitening of near-collinear statistics, reaches 1e-4
    # and differs between CPUs' kernels).  The tolerance is the worst-case error of a sum of P terms
    # in any order, gamma_P = P u / (1 - P u) with u float64's unit roundoff, on features of the
    # size seen, times the head's gain (spectral norms of the whitening and dense layers, tanh' <= 1).
    model = model.double()
    seen = []
    model.standardize.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    out = model(volumes.double())
    shifted = torch.roll(volumes, shifts=(4, -2, 6), dims=(2, 3, 4))
    voxels = 16**3
    unit = torch.finfo(torch.float64).eps / 2
    gamma = voxels * unit / (1 - voxels * unit)
    with torch.no_grad():
        features = seen[0].abs()
        gain = torch.linalg.matrix_norm(model.standardize.transform, ord=2)
        for layer in model.head:
            if isinstance(layer, torch.nn.Linear):
                gain = gain * torch.linalg.matrix_norm(layer.weight, ord=2)
    tolerance = float(2 * gamma * features.max() * gain * 1.2)  # 2: centring, then the products' sum
    torch.testing.assert_close(model(shifted.double()), out, rtol=0, atol=tolerance)
    assert tolerance < 1e-6  # still far below what reading positions changes (next check)
    # whereas the reference head reads positions
    flat = build_model("cosmoflow", crop_size=16, base_channels=4, depth=2, kernel_size=3, padding="circular")
    assert not torch.allclose(flat(shifted), flat(volumes), atol=1e-4)
    # frozen convolutions: only the dense layers (and no buffer) are trained
    frozen = build_model("cosmoflow", crop_size=16, base_channels=4, depth=2, kernel_size=3,
                         head="covariance", freeze_convolutions=True)
    trained = {name for name, p in frozen.named_parameters() if p.requires_grad}
    assert trained and all(name.startswith("head.") for name in trained)
    before = [p.clone() for p in frozen.convs.parameters()]
    optimizer = torch.optim.Adam(frozen.parameters(), lr=0.1)
    frozen(volumes).square().mean().backward()
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, frozen.convs.parameters(), strict=True))
    with pytest.raises(UsageError, match="head 'gram' is not one of flatten, covariance"):
        build_model("cosmoflow", crop_size=16, depth=2, head="gram")


def test_running_whitening_decorrelates_with_training_statistics_only():
    from repro500.workloads.models.cosmo_cnn import RunningWhitening

    torch.manual_seed(0)
    whiten = RunningWhitening(3, momentum=0.05, shrinkage=1e-6)
    mix = torch.tensor([[1.0, 0.0, 0.0], [0.99, 0.14, 0.0], [2.0, 0.0, 0.5]])  # strongly correlated features
    data = (torch.randn(4000, 3) @ mix.T) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([5.0, -3.0, 0.0])
    for batch in data.split(40):
        whiten(batch)
    assert int(whiten.batches) == 100
    whiten.eval()
    with torch.no_grad():
        fresh = (torch.randn(4000, 3) @ mix.T) * torch.tensor([1.0, 10.0, 0.1]) + torch.tensor([5.0, -3.0, 0.0])
        out = whiten(fresh)
        # statistical, not rounding: 4000 fresh samples give the mean a standard error 1/sqrt(4000)
        # = 0.016 (atol 0.1: 6 sigma) and each covariance entry about sqrt(2/4000) = 0.022, plus the
        # running estimate's own error (momentum 0.05: about 20 batches of 40 samples, ~0.05): 0.15 is 3 sigma
        torch.testing.assert_close(out.mean(dim=0), torch.zeros(3), atol=0.1, rtol=0)
        torch.testing.assert_close(torch.cov(out.T), torch.eye(3), atol=0.15, rtol=0)
        # evaluation leaves the statistics alone, and a sample's output does not depend on its batch
        kept = whiten.running_cov.clone()
        assert torch.equal(whiten(fresh[:1]), whiten(fresh[:50])[:1])
        assert torch.equal(kept, whiten.running_cov)
    # training: a batch moves the statistics by at most `momentum` of the way (BatchNorm would
    # standardise it with its own mean: a lone sample would come out as zeros)
    whiten.train()
    assert whiten(data[:1] + 100.0).abs().max() > 1.0
