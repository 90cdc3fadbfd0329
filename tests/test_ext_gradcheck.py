"""The gradient checker (Deep500 level 0) on plain torch ops and the repro500 operators."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import fixtures

from repro500.ext import reference
from repro500.ext.gradcheck import check_gradients

native = fixtures.native


def test_plain_torch_ops_pass():
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    # float64 central differences, step h = 1e-6: matmul is linear (no truncation error), each output
    # rounds by <= gamma_4 sum|x||w| < 2e-15 in any kernel order and x +- h by u|x|: ~2e-9 in the
    # quotient (3e-10 measured), atol 1e-7 is 50x that; tanh (atol 1e-6, rtol 1e-4 by default):
    # truncation h^2 max|tanh'''| / 6 = 3e-13, rounding u / h ~ 1e-10
    report = check_gradients(torch.matmul, (x, w), atol=1e-7, rtol=1e-5)
    assert report.passed, report.summary()
    assert [item.index for item in report.inputs] == [0, 1]
    assert check_gradients(torch.tanh, (x,)).passed


class _WrongSin(torch.autograd.Function):
    """sin with a backward that is 1% off: the checker must notice."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.cos() * 1.01


def test_a_wrong_backward_fails_with_its_error_reported():
    x = torch.linspace(-1, 1, 9)
    report = check_gradients(_WrongSin.apply, (x,), atol=1e-6, rtol=1e-4)
    assert not report.passed
    # the numerical cos is exact to ~1e-10 (u / step) against cos >= 0.54: the 1 % error reads as
    # 0.01 to ~2e-8 relative; 1e-3 of it still tells 1 % from 1.1 %
    assert report.inputs[0].max_rel_error == pytest.approx(0.01, rel=1e-3)
    assert "FAIL" in report.summary()
    json.dumps(report.as_dict())  # recordable as is


def test_custom_op_gradients(native):
    x = torch.randn(40, generator=torch.Generator().manual_seed(2))
    codes, scales = native.stochastic_quantize(x, 7, 8, False, 1)
    packed, scale = native.sign_pack(x)
    for op, inputs in [
        (native.stochastic_dequantize, (codes, scales, 7, 8)),
        (native.sign_unpack, (packed, scale, 40)),
        (native.topk_threshold, (x, 5)),
        (reference.stochastic_dequantize, (codes, scales, 7, 8)),
        (reference.topk, (x, 5)),
    ]:
        # linear (piecewise, away from ties) in float64 inputs: no truncation error, rounding
        # u |f| / step ~ 1e-10 |f|; an op that worked in float32 inside would be off by u32 / step ~ 0.06
        report = check_gradients(op, inputs, atol=1e-6, rtol=1e-4)
        assert report.passed, report.summary()


def test_inputs_without_floating_tensors_are_rejected():
    with pytest.raises(ValueError, match="no floating tensor input"):
        check_gradients(torch.neg, (torch.arange(3),))
