"""A CosmoFlow-style 3D CNN that regresses cosmological parameters from matter-density volumes.

The shape follows the MLPerf HPC CosmoFlow reference model (Mathuriya et al., SC'18):
``depth`` blocks of [Conv3d ("same" padding) -> LeakyReLU(0.3) -> MaxPool3d(2)] whose
channel count doubles from ``base_channels``, then Dense(fc1) -> Dense(fc2) -> Dense(outputs),
with optional dropout, and an output of ``1.2 * tanh`` so targets normalised to [-1, 1]
(or [0, 1]) are reachable without saturating.  Defaults are the reference's (16 channels,
kernel 2, 5 blocks, 128 and 64 hidden units, 128^3 crops); ``base_channels=8, depth=3,
crop_size=32`` trains on a CPU.

Options beyond the reference, for small synthetic universes (docs/data.md, "cosmo"):

* ``head="covariance"``: instead of flattening the last block, the dense layers read, for
  every block, the global mean of each channel of its convolution (before the activation) and
  the covariance of every pair of those channels over the whole volume (second-order, or
  bilinear, pooling), whitened with running statistics of the training batches
  (``RunningWhitening``).  A convolution's output covariance is a linear function of the
  input's autocovariance at the kernel's lags, so the dense layers can combine the lags that
  carry the shape of the power spectrum (n_s and H_0) and cancel the Poisson noise, which
  lives at lag zero only; averaged over the whole volume it does not depend on where
  structures are, so the head cannot memorise a universe's layout.
* ``freeze_convolutions=True``: the convolutions keep their random initial weights (random
  features; the dense layers alone learn).  With the covariance head this learns n_s and H_0
  in a few epochs where trained convolutions take many: every step that moves a filter
  moves all the features the dense layers are fitting to (docs/data.md, "cosmo").
* ``padding="circular"``: convolutions wrap around, as a periodic simulation box does
  (for crops as large as the universe); ``pool="avg"``: average instead of max pooling.
"""

from __future__ import annotations

import torch
from torch import nn

from repro500.errors import UsageError

LEAKY_RELU_SLOPE = 0.3  # Keras' LeakyReLU default, used by the reference model
OUTPUT_SCALE = 1.2  # the reference's scale on tanh, so +-1 targets are not at saturation
OUTPUT_ACTIVATIONS = ("scaled_tanh", "none")
HEADS = ("flatten", "covariance")
PADDINGS = ("zeros", "circular")
POOLS = ("max", "avg")
WHITENING_MOMENTUM = 0.01  # running statistics follow about the last 100 training batches
WHITENING_SHRINKAGE = 1e-3  # added to the correlation matrix's eigenvalues before the inverse root
WHITENING_EPS = 1e-12  # a constant feature is left unscaled rather than divided by zero


def _same_conv3d(in_channels: int, out_channels: int, kernel_size: int, padding: str = "zeros") -> nn.Sequential:
    """A "same"-padded convolution; even kernels pad one more at the end, as Keras does.

    torch's ``padding="same"`` also works for even kernels but copies the input on every
    call and warns each time; an explicit pad layer says what happens.  ``padding="circular"``
    wraps around instead of padding with zeros.
    """
    before, after = (kernel_size - 1) // 2, kernel_size // 2
    conv = nn.Conv3d(in_channels, out_channels, kernel_size)
    if before == after == 0:
        return nn.Sequential(conv)
    pad = nn.CircularPad3d((before, after) * 3) if padding == "circular" else nn.ConstantPad3d((before, after) * 3, 0.0)
    return nn.Sequential(pad, conv)


class RunningWhitening(nn.Module):
    """Features decorrelated and scaled to unit variance with running statistics (ZCA).

    Training batches update a running mean and covariance (a cumulative average over the
    first ``1 / momentum`` batches, an exponential one after), without gradients; the output
    is ``(x - mean) @ W`` with ``W = diag(1/std) (R + shrinkage I)^(-1/2)``, R the features'
    correlation matrix.  Unlike BatchNorm a batch is never standardised with its own mean:
    that batch-to-batch shift would be noise far larger than the differences n_s and H_0
    make.  Whitening matters because the pooled covariances move almost together (σ_8 scales
    them all): what tells n_s from H_0 lies in directions of tiny variance that dense layers on
    merely standardised features take thousands of steps to find.  ``shrinkage`` keeps the
    noisiest of those directions from being blown up.  Evaluation uses only what training saw.
    """

    def __init__(self, features: int, momentum: float = WHITENING_MOMENTUM,
                 shrinkage: float = WHITENING_SHRINKAGE) -> None:
        super().__init__()
        self.momentum, self.shrinkage = momentum, shrinkage
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_cov", torch.eye(features))
        self.register_buffer("transform", torch.eye(features))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _at_least_float32(x)
        if self.training:
            with torch.no_grad():
                self._update(x.detach().double())
        with torch.autocast(x.device.type, enabled=False):  # bf16 would lose what it whitens for
            return (x - self.running_mean) @ self.transform

    def _update(self, batch: torch.Tensor) -> None:
        first = int(self.batches) == 0
        rate = max(self.momentum, 1.0 / float(int(self.batches) + 1))
        mean = batch.mean(dim=0)
        # the spread around the running mean, so a drifting mean widens rather than hides
        centred = batch - (mean if first else self.running_mean.double())
        cov = centred.T @ centred / batch.shape[0]
        running_mean = self.running_mean.double().lerp(mean, rate)
        running_cov = self.running_cov.double().lerp(cov, rate)
        std = running_cov.diagonal().clamp_min(WHITENING_EPS).sqrt()
        corr = running_cov / std[:, None] / std[None, :]
        values, vectors = torch.linalg.eigh(corr)
        inv_sqrt = (vectors * (values.clamp_min(0.0) + self.shrinkage).rsqrt()) @ vectors.T
        self.running_mean.copy_(running_mean)
        self.running_cov.copy_(running_cov)
        self.transform.copy_(inv_sqrt / std[:, None])
        self.batches += 1


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """float32 for anything narrower (bf16/fp16 under autocast); float64 stays float64, so the
    model run in double precision computes its statistics in double precision too."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _mean_and_covariance(x: torch.Tensor) -> torch.Tensor:
    """(batch, C, D, H, W) -> (batch, C + C (C + 1) / 2): channel means, then the upper
    triangle of the channels' covariance over all voxels."""
    flat = _at_least_float32(x.flatten(2))  # not in bf16 under autocast: small differences matter here
    mean = flat.mean(dim=2)
    centred = flat - mean.unsqueeze(2)
    cov = torch.einsum("bip,bjp->bij", centred, centred) / flat.shape[2]
    rows, cols = torch.triu_indices(x.shape[1], x.shape[1], device=x.device)
    return torch.cat([mean, cov[:, rows, cols]], dim=1)


class CosmoFlowNet(nn.Module):
    def __init__(
        self,
        *,
        in_channels: int = 4,
        num_outputs: int = 4,
        crop_size: int = 128,
        base_channels: int = 16,
        depth: int = 5,
        kernel_size: int = 2,
        fc1_size: int = 128,
        fc2_size: int = 64,
        dropout: float = 0.0,
        output_activation: str = "scaled_tanh",
        head: str = "flatten",
        padding: str = "zeros",
        pool: str = "max",
        freeze_convolutions: bool = False,
    ) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        channels, edge = in_channels, crop_size
        for index in range(depth):
            out_channels = base_channels * 2**index
            self.convs.append(_same_conv3d(channels, out_channels, kernel_size, padding))
            channels, edge = out_channels, edge // 2
        if freeze_convolutions:
            self.convs.requires_grad_(False)
        self.activation = nn.LeakyReLU(LEAKY_RELU_SLOPE)
        self.pool = nn.MaxPool3d(2) if pool == "max" else nn.AvgPool3d(2)
        self.covariance = head == "covariance"
        if self.covariance:
            widths = [base_channels * 2**index for index in range(depth)]
            features = sum(c + c * (c + 1) // 2 for c in widths)
            self.standardize: nn.Module = RunningWhitening(features)
        else:
            features = channels * edge**3
            self.standardize = nn.Identity()
        self.head = nn.Sequential(
            nn.Linear(features, fc1_size),
            nn.LeakyReLU(LEAKY_RELU_SLOPE),
            nn.Dropout(dropout),
            nn.Linear(fc1_size, fc2_size),
            nn.LeakyReLU(LEAKY_RELU_SLOPE),
            nn.Dropout(dropout),
            nn.Linear(fc2_size, num_outputs),
        )
        self.scaled_tanh = output_activation == "scaled_tanh"
        self.crop_size = crop_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (batch, channels, D, H, W) with D = H = W = ``crop_size``."""
        pooled = []
        last = len(self.convs) - 1
        for index, conv in enumerate(self.convs):
            x = conv(x)
            if self.covariance:
                with torch.autocast(x.device.type, enabled=False):
                    pooled.append(_mean_and_covariance(x))
                if index == last:
                    break  # the covariance head has what it needs of the last block
            x = self.pool(self.activation(x))
        out = self.head(self.standardize(torch.cat(pooled, dim=1) if self.covariance else x.flatten(1)))
        return OUTPUT_SCALE * torch.tanh(out) if self.scaled_tanh else out


def cosmoflow(
    *,
    num_classes: int = 4,
    in_channels: int = 4,
    crop_size: int = 128,
    base_channels: int = 16,
    depth: int = 5,
    kernel_size: int = 2,
    fc1_size: int = 128,
    fc2_size: int = 64,
    dropout: float = 0.0,
    output_activation: str = "scaled_tanh",
    head: str = "flatten",
    padding: str = "zeros",
    pool: str = "max",
    freeze_convolutions: bool = False,
) -> CosmoFlowNet:
    """Build the CosmoFlow CNN; ``num_classes`` is the number of regressed parameters (4)."""
    if depth < 1 or crop_size < 2**depth:
        raise UsageError(
            f"cosmoflow: crop_size {crop_size} is too small for depth {depth} "
            f"(each block halves it; need crop_size >= {2 ** max(depth, 1)})."
        )
    if output_activation not in OUTPUT_ACTIVATIONS:
        raise UsageError(
            f"cosmoflow: output_activation {output_activation!r} is not one of {', '.join(OUTPUT_ACTIVATIONS)}."
        )
    for label, value, choices in (("head", head, HEADS), ("padding", padding, PADDINGS), ("pool", pool, POOLS)):
        if value not in choices:
            raise UsageError(f"cosmoflow: {label} {value!r} is not one of {', '.join(choices)}.")
    if not 0.0 <= dropout < 1.0:
        raise UsageError(f"cosmoflow: dropout must be in [0, 1), got {dropout}.")
    return CosmoFlowNet(
        in_channels=in_channels,
        num_outputs=num_classes,
        crop_size=crop_size,
        base_channels=base_channels,
        depth=depth,
        kernel_size=kernel_size,
        fc1_size=fc1_size,
        fc2_size=fc2_size,
        dropout=dropout,
        output_activation=output_activation,
        head=head,
        padding=padding,
        pool=pool,
        freeze_convolutions=freeze_convolutions,
    )
