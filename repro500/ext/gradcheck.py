"""Gradient checker for operators (Deep500 level 0): analytic vs numerical, in float64.

    report = check_gradients(torch.ops.repro500.stochastic_dequantize,
                             (codes, scales, 127, 512), atol=1e-6, rtol=1e-4)
    assert report.passed, report.summary()

Every floating tensor input is copied to float64 and differentiated; every floating output
is differentiated (the others, such as int32 indices, are ignored).  For each such input
the full Jacobian is built two ways:

- analytic: one backward pass per output element (``torch.autograd.grad``), i.e. whatever
  backward formula the operator registered;
- numerical: central differences, (f(x + eps·e_j) − f(x − eps·e_j)) / (2·eps), per element j.

An element passes when |analytic − numerical| <= atol + rtol·|numerical| (the rule of
``torch.allclose``).  The report gives, per input, the largest absolute and relative error
and whether it passed.  Jacobians cost O(outputs × inputs) evaluations: use small inputs.

torch.autograd.gradcheck answers only pass/raise; this returns the per-input errors a
benchmark report records (and also works for custom ops whose outputs mix dtypes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from repro500.statuses import FAIL, PASS


@dataclass
class InputReport:
    index: int
    shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float
    passed: bool


@dataclass
class GradcheckReport:
    atol: float
    rtol: float
    eps: float
    inputs: list[InputReport] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.inputs) and all(item.passed for item in self.inputs)

    def summary(self) -> str:
        verdict = PASS if self.passed else FAIL
        lines = [f"gradcheck atol={self.atol:g} rtol={self.rtol:g} eps={self.eps:g}: {verdict}"]
        for item in self.inputs:
            lines.append(
                f"  input {item.index} {list(item.shape)}: max abs error {item.max_abs_error:.3g}, "
                f"max rel error {item.max_rel_error:.3g} {'ok' if item.passed else FAIL}"
            )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "eps": self.eps,
            "passed": self.passed,
            "inputs": [vars(item) for item in self.inputs],
        }


def _floating_outputs(result: Any) -> list[torch.Tensor]:
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _flat_outputs(op: Callable[..., Any], args: Sequence[Any]) -> torch.Tensor:
    outputs = _floating_outputs(op(*args))
    if not outputs:
        raise ValueError("the operator returned no floating tensor to differentiate")
    return torch.cat([o.reshape(-1) for o in outputs])


def check_gradients(
    op: Callable[..., Any],
    inputs: Sequence[Any],
    atol: float = 1e-6,
    rtol: float = 1e-4,
    eps: float = 1e-6,
) -> GradcheckReport:
    """Compare *op*'s analytic gradients with central differences at *inputs* (float64)."""
    args = [
        t.detach().to(torch.float64).requires_grad_(True)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
        else t
        for t in inputs
    ]
    targets = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not targets:
        raise ValueError("no floating tensor input to differentiate")
    report = GradcheckReport(atol=atol, rtol=rtol, eps=eps)

    out = _flat_outputs(op, args)
    for index in targets:
        x = args[index]
        analytic = torch.zeros(out.numel(), x.numel(), dtype=torch.float64)
        for row in range(out.numel()):
            (grad,) = torch.autograd.grad(out[row], x, retain_graph=True, allow_unused=True)
            if grad is not None:
                analytic[row] = grad.reshape(-1)
        numerical = torch.zeros_like(analytic)
        with torch.no_grad():
            flat = x.detach().reshape(-1)
            for col in range(x.numel()):
                shifted = list(args)
                plus, minus = flat.clone(), flat.clone()
                plus[col] += eps
                minus[col] -= eps
                shifted[index] = plus.view_as(x)
                f_plus = _flat_outputs(op, shifted)
                shifted[index] = minus.view_as(x)
                f_minus = _flat_outputs(op, shifted)
                numerical[:, col] = (f_plus - f_minus) / (2 * eps)
        abs_error = (analytic - numerical).abs()
        rel_error = abs_error / numerical.abs().clamp_min(torch.finfo(torch.float64).tiny)
        ok = bool((abs_error <= atol + rtol * numerical.abs()).all())
        report.inputs.append(
            InputReport(
                index=index,
                shape=tuple(x.shape),
                max_abs_error=float(abs_error.max()) if abs_error.numel() else 0.0,
                # relative error where the numerical gradient is not ~0 (else it is meaningless)
                max_rel_error=float(rel_error[numerical.abs() > atol].max())
                if (numerical.abs() > atol).any()
                else 0.0,
                passed=ok,
            )
        )
    return report
