"""Replay a repeat under an operator-recording mode, and find the first operator where two
replays part.

A replay trains one recorded repeat again from its recorded seeds, exactly as ``train.py`` does
(the same :class:`~repro500.workloads.trainer.repeat.Repeat`: start, epochs, evaluations), into a
scratch directory, and stops after a given step: the cost is bounded by the first divergent step
the records show (``repro500.verify.divergence``).  Only the training steps are recorded, under
:class:`OpRecorder`, a ``TorchDispatchMode`` that hashes every operator's output bit for bit.  It
reaches them through hooks, and replaces nothing: a watcher of the repeat's ``Step`` (its
``register_watcher``) puts the mode and torch's global module forward hooks (the module path) on
for each step, the optimizer's step pre- and post-hooks mark its phase, and the repeat's
``on_step`` callback checks each step record and ends the replay; all come off when it ends.

* each record (:class:`OpRecord`) is ``[step, phase, op, path, hashes]``; the phase is forward,
  backward or optimizer; the module path is the state_dict name of the module the operator ran
  in (``layer1.0.conv1``), in backward the one whose forward made the autograd node (matched by
  the node's sequence number), ``""`` for the model itself;
* before the operators of a step come what enters it from outside them: the batch and torch's
  RNG state; before the first step, every tensor of the model's state.  A difference that enters
  from outside the operators is named as what it is (a batch, an initial parameter);
* view operators share their input's bytes and are not hashed; operators that return
  uninitialised memory (``empty``) are recorded without a hash, their bytes are no result.

A tensor's hash is a linear one over its bits (each element's integer view times a fixed odd
64-bit weight of its position, summed modulo 2**64): any single changed bit changes it, and two
different tensors collide with probability about 2**-64.

:func:`locate_operator` runs the replays of two repeats, each in its own process and environment
(:class:`Side`): A recorded; B compared with A's log as it goes, stopping at the first operator
whose output differs; then both again up to that operator, saving its inputs and outputs, each
checked against its own first replay (an operator that gives two outputs for the same inputs in
the same environment is non-deterministic, whatever else differs).  The answer is the first
operator whose inputs agree and whose output does not, with the largest absolute and relative
difference of its output; where the inputs already differ, the difference entered from outside
the recorded operators, and the answer says which input.

Run one replay from the shell (what :func:`locate_operator` does in each subprocess)::

    python -m repro500.workloads.trainer.replay --run RUN --repeat K --steps N --out DIR \\
        [--expect OTHER/ops.jsonl] [--save-at INDEX]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from repro500 import sandbox
from repro500.capture import seeds as seeding
from repro500.capture.source import DIR as SOURCE_DIR
from repro500.errors import InvalidInput, ReproError
from repro500.recipe import load as recipes
from repro500.rundir import layout
from repro500.workloads.trainer.workload import TrainedWorkload
from repro500.workloads.workload import Progress

OPS_LOG = "ops.jsonl"
REPLAY_JSON = "replay.json"
SAVED = "saved.pt"
# operators whose output is memory nobody wrote yet: its bytes are not a result
_UNINITIALISED = frozenset({"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like", "resize_",
                            "empty_permuted", "_empty_affine_quantized"})
_RANDOM = frozenset({"randn", "rand", "randint", "randperm", "normal", "normal_", "uniform_", "bernoulli", "bernoulli_",
                     "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "multinomial",
                     "native_dropout", "rand_like", "randn_like", "randint_like", "poisson"})
_BLOCK = 1 << 20  # words hashed a chunk at a time (4 MiB of weights and of scratch)


class StopReplay(Exception):
    """Raised inside the recording mode once the replay has what it came for."""


class OpRecord(NamedTuple):
    """One record of the recording mode: a line of ``ops.jsonl``, where it is a JSON list of
    these fields in this order (a NamedTuple is written as one), as it was before they had names."""

    step: int
    phase: str  # "init", "data", "forward", "backward" or "optimizer"
    op: str  # the operator ("aten.addmm.default"), or what entered from outside them ("(batch)")
    path: str  # the module or parameter it worked on, its state_dict name; "" for the model itself
    hashes: list[Any]  # per output: its hash, None (bytes nobody wrote) or repr() of a number


# ----- hashing ----------------------------------------------------------------------------------------
class Hasher:
    """Bitwise hashes of tensors (module docstring); weights and scratch cached per device.

    The bytes are read as 32-bit words, in chunks of ``_BLOCK`` words: each word times an odd
    32-bit weight of its place in the chunk, summed, all modulo 2**32 (one vectorised pass into a
    scratch buffer kept between calls: a fresh buffer per call costs more in page faults than the
    arithmetic); the chunk sums are weighted by odd 64-bit weights modulo 2**64.  An odd weight
    times a non-zero change is never zero modulo 2**32, so any single changed word changes the
    hash."""

    def __init__(self) -> None:
        self._columns: dict[Any, Any] = {}
        self._scratch: dict[Any, Any] = {}
        self._rows: list[int] = []

    def _row_weight(self, i: int) -> int:
        import random

        if i >= len(self._rows):
            draw = random.Random(0xC0DE)  # fixed: two processes must hash alike
            self._rows = [draw.getrandbits(64) | 1 for _ in range(max(2 * i + 2, 64))]
        return self._rows[i]

    def _buffers(self, device: Any) -> tuple[Any, Any]:
        import torch

        if device not in self._columns:
            gen = torch.Generator().manual_seed(0x5EED)
            odd = torch.randint(-(2**30), 2**30, (_BLOCK,), dtype=torch.int32, generator=gen) * 2 + 1
            self._columns[device] = odd.to(device)
            self._scratch[device] = torch.empty(_BLOCK, dtype=torch.int32, device=device)
        return self._columns[device], self._scratch[device]

    def __call__(self, tensor: Any) -> int | None:
        import torch

        t = tensor.detach()
        if t.is_quantized or t.layout != torch.strided or t.device.type == "meta":
            return None
        if t.numel() == 0:
            return 0
        if t.is_complex():
            t = torch.view_as_real(t)
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        n = raw.numel()
        words = raw[:n - n % 4].view(torch.int32)
        if n % 4:  # the last bytes of a tensor whose size is not a multiple of 4, a word each
            words = torch.cat([words, raw[n - n % 4:].to(torch.int32)])
        columns, scratch = self._buffers(t.device)
        total = n
        for i, start in enumerate(range(0, words.numel(), _BLOCK)):
            chunk = words[start:start + _BLOCK]
            m = chunk.numel()
            torch.mul(chunk, columns[:m], out=scratch[:m])  # wraps modulo 2**32
            total += (int(scratch[:m].sum()) & 0xFFFFFFFF) * self._row_weight(i)
        return total & 0xFFFFFFFFFFFFFFFF


# ----- the recording mode -------------------------------------------------------------------------
def _leaves(value: Any) -> list[Any]:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(value)[0]


class OpRecorder:
    """Records every operator of the training steps (module docstring).  Use :meth:`step` around
    each training step and :meth:`optimizer_phase` once; ``records`` holds their :class:`OpRecord`.
    The optimizer's hooks stay until :meth:`close` (or the end of a ``with`` block)."""

    def __init__(self, model: Any, *, expect: Any = None, save_at: int | None = None,
                 save_to: Path | None = None, sink: Any = None) -> None:
        """*expect*: the other replay's records (:class:`OpRecord`), in order (any iterable: a log read as it goes);
        *sink*: where each record is written as it is made (a text file), instead of ``records``."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        self.model = model
        self.names = {mod: name for name, mod in model.named_modules()}
        self.param_owner = {id(p): name.rpartition(".")[0] for name, p in model.named_parameters()}
        self.records: list[OpRecord] = []  # kept when there is no sink
        self.count = 0
        self.sink = sink
        self.hashed = 0
        self.expect = iter(expect) if expect is not None else None
        self.save_at, self.save_to = save_at, save_to
        self.stop: dict[str, Any] | None = None
        self.current_step = 0
        self.phase = "forward"
        self._stack: list[str] = []
        self._by_node: dict[int, str] = {}
        self._owners: dict[int, str] = {}
        self._hash = Hasher()
        self._hooks: list[Any] = []  # handles of the optimizer's step hooks, removed by close()
        recorder = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
                return recorder._dispatch(func, args, kwargs or {})

        self._mode_type = Mode
        self._torch = torch

    def close(self) -> None:
        """Take the hooks :meth:`optimizer_phase` put on the optimizer off it again."""
        while self._hooks:
            self._hooks.pop().remove()

    def __enter__(self) -> OpRecorder:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # what enters a step from outside the operators
    def pseudo(self, op: str, phase: str, tensors: list[Any], path: str = "") -> None:
        index = self.count
        hashes = [self._hash(t) for t in tensors]
        self._append(index, OpRecord(self.current_step, phase, op, path, hashes), tensors, tensors)

    def begin(self, step: int, batch: Any) -> None:
        torch = self._torch
        self.current_step = step
        self._by_node.clear()
        self._stack.clear()
        self.pseudo("(batch)", "data", [t for t in _leaves(batch) if isinstance(t, torch.Tensor)])
        states = [torch.get_rng_state()] + ([torch.cuda.get_rng_state()] if torch.cuda.is_initialized() else [])
        self.pseudo("(torch RNG state)", "data", states)

    def initial_state(self) -> None:
        for name, tensor in self.model.state_dict().items():
            self.pseudo("(initial state)", "init", [tensor], path=name)

    def step(self) -> Any:
        """The context of one training step: module hooks on, the mode pushed."""
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        recorder = self

        @contextlib.contextmanager
        def scope() -> Any:
            def push(mod: Any, _inputs: Any) -> None:
                recorder._stack.append(recorder.names.get(mod, type(mod).__name__))

            def pop(_mod: Any, _inputs: Any, _output: Any) -> None:
                if recorder._stack:
                    recorder._stack.pop()

            hooks = [register_module_forward_pre_hook(push), register_module_forward_hook(pop)]
            recorder.phase = "forward"
            try:
                with recorder._mode_type():
                    yield
            finally:
                for hook in hooks:
                    hook.remove()
                # a stop raised in the optimizer's step skips its post-hook: the phase ends here too
                recorder.phase = "forward"
        return scope()

    def optimizer_phase(self, optimizer: Any) -> None:
        """Mark the optimizer's step as its own phase, through its step pre- and post-hooks
        (``torch.optim.Optimizer.register_step_pre_hook``), until :meth:`close`."""

        def enter(opt: Any, _args: Any, _kwargs: Any) -> None:
            self.phase = "optimizer"
            self._owners = self._optimizer_owners(opt)

        def leave(_opt: Any, _args: Any, _kwargs: Any) -> None:
            self.phase = "forward"
        self._hooks += [optimizer.register_step_pre_hook(enter), optimizer.register_step_post_hook(leave)]

    def _optimizer_owners(self, optimizer: Any) -> dict[int, str]:
        """The storage of each parameter, its gradient and its optimizer state, by the parameter's name:
        an optimizer's operator is named by the parameter it works on."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        owners: dict[int, str] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                name = names.get(id(p))
                if name is None:
                    continue
                tensors = [p, p.grad, *[v for v in optimizer.state.get(p, {}).values()
                                        if isinstance(v, self._torch.Tensor)]]
                for t in tensors:
                    if t is not None and t.numel():
                        owners.setdefault(t.data_ptr(), name)
        return owners

    def _where(self) -> tuple[str, str]:
        torch = self._torch
        if torch._C._current_graph_task_id() != -1:
            node = torch._C._current_autograd_node()
            if node is None:
                return "backward", ""
            variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter it accumulates into
            if variable is not None and id(variable) in self.param_owner:
                return "backward", self.param_owner[id(variable)]
            return "backward", self._by_node.get(node._sequence_nr(), "")
        path = self._stack[-1] if self._stack else ""
        if self.phase == "forward":
            # the autograd node this operator made (if any) took the last sequence number
            self._by_node.setdefault(torch._C._autograd._get_sequence_nr() - 1, path)
        return self.phase, path

    def _dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if func.namespace == "profiler" or func.is_view:
            return func(*args, **kwargs)
        phase, path = self._where()
        if phase == "optimizer":
            path = next((self._owners[t.data_ptr()] for t in _leaves((args, kwargs))
                         if isinstance(t, self._torch.Tensor) and t.numel() and t.data_ptr() in self._owners), "")
        index = self.count
        saving = self.save_at == index
        inputs = [t.clone() if isinstance(t, self._torch.Tensor) else t
                  for t in _leaves((args, kwargs))] if saving else None
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        outputs = _leaves(out)
        hashes: list[Any] = []
        for value in outputs:
            if isinstance(value, self._torch.Tensor):
                hashes.append(None if name in _UNINITIALISED else self._hash(value))
            elif isinstance(value, (int, float, bool)):
                hashes.append(repr(value))
        self.hashed += 1
        self._append(index, OpRecord(self.current_step, phase, str(func), path, hashes), inputs, outputs)
        return out

    def _append(self, index: int, record: OpRecord, inputs: Any, outputs: Any) -> None:
        self.count += 1
        if self.sink is not None:
            self.sink.write(json.dumps(record) + "\n")
        else:
            self.records.append(record)
        if self.save_at == index and self.save_to is not None:
            self._save(index, record, inputs, outputs)
        if self.expect is not None:
            self._compare(index, record)
        if self.save_at == index:
            self.stop = self.stop or {"reason": "saved", "index": index}
            raise StopReplay

    def _compare(self, index: int, record: OpRecord) -> None:
        other = next(self.expect, None)
        if other is None:
            self.stop = {"reason": "other ended", "index": index}
            raise StopReplay
        if other.op != record.op or other.path != record.path:
            self.stop = {"reason": "different operator", "index": index, "other": other.op, "other_path": other.path}
        elif other.hashes != record.hashes:
            self.stop = {"reason": "different output", "index": index}
        if self.stop is not None and (self.save_at is None or index < self.save_at):
            raise StopReplay
        if self.stop is not None:  # at the operator to save: whether it differs too is the answer
            self.stop = {**self.stop, "reason": "saved", "self_differs": True}

    def _save(self, index: int, record: OpRecord, inputs: Any, outputs: Any) -> None:
        torch = self._torch

        def keep(values: Any) -> list[Any]:
            return [v.detach().clone().cpu() if isinstance(v, torch.Tensor) else v for v in (values or [])]
        # the record as the plain list it is in the log: the file needs no class of this module to load
        torch.save({"index": index, "record": list(record), "inputs": keep(inputs), "outputs": keep(outputs)},
                   self.save_to)


# ----- one replay ---------------------------------------------------------------------------------
def _spec_and_seeds(run_dir: Path, k: int) -> tuple[Any, Any]:
    recipe = recipes.from_run_dir(run_dir)
    if recipe.is_command or recipe.kind != "trained":
        raise InvalidInput(f"{run_dir} ran a {'command' if recipe.is_command else recipe.kind} workload: only "
                           "repro500's trainer can be replayed operator by operator")
    summary = layout.read_json(layout.RunDir(run_dir).repeat(k) / layout.REPEAT_SUMMARY, f"repeat {k}'s summary")
    recorded = summary.get("seeds") or {}
    try:
        seeds = seeding.Seeds(**{name: int(recorded[name]) for name in
                                 ("master", "repeat", "rank", *seeding.SEED_NAMES)})
    except (KeyError, TypeError, ValueError):
        raise InvalidInput(f"{run_dir}: repeat {k}'s summary records no complete seeds: it cannot be replayed") from None
    device = recipe.mutable.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    source = Path(run_dir) / SOURCE_DIR  # the run's own plug-in modules, as it kept them
    work = TrainedWorkload(recipe, device=device, engine="local",
                           search_paths=[str(source)] if source.is_dir() else [])
    spec = work.spec()
    if int(recipe.mutable.get("nproc", 1)) > 1 or recipe.mutable.get("engine", "local") != "local":
        raise InvalidInput(f"{run_dir} trained on {recipe.mutable.get('nproc')} processes "
                           f"({recipe.mutable.get('engine')}): only one-process runs can be replayed")
    return spec, seeds


def replay(run_dir: str | Path, k: int, steps: int, out: str | Path, *, expect: str | Path | None = None,
           save_at: int | None = None) -> dict[str, Any]:
    """Replay repeat *k* of *run_dir* up to *steps* steps, recording its operators into *out*.

    The loop is the trainer's own (``train.train_one_epoch`` and the repeat's epoch ends, as
    ``train.train_repeat`` runs them); the replay only watches it, through the hooks the trainer
    and torch offer: a watcher of the repeat's step (``Step.register_watcher``: the step
    recorded), the optimizer's step hooks (its phase), and the repeat's ``on_step`` callback (each
    step record checked against what the run recorded, and the end after *steps*).  The hooks come
    off when the replay ends, however it ends."""
    import torch

    from repro500.workloads.trainer import train

    run_dir, out = Path(run_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    spec, seeds = _spec_and_seeds(run_dir, k)
    check = StepCheck(_recorded_steps(run_dir, k), steps)
    step_s: list[float] = []
    recorder: OpRecorder | None = None
    with (tempfile.TemporaryDirectory(prefix="repro500-replay-") as scratch,
          open(out / OPS_LOG, "w", encoding="utf-8") as sink,
          contextlib.ExitStack() as stack):
        # the other replay's log is read as this one goes, and this one's written as it goes: a
        # long replay holds one record at a time, not every operator of every step
        expected = _read_log(stack.enter_context(open(expect, encoding="utf-8"))) if expect else None  # noqa: SIM115
        r = train.RepeatState(spec, k, seeds, Path(scratch), train.Dist(), Progress(on_step=check.see))
        try:
            r.start()
            recorder = stack.enter_context(OpRecorder(r.model, expect=expected, save_at=save_at,
                                                      save_to=out / SAVED, sink=sink))
            recorder.optimizer_phase(r.optimizer)
            recorder.initial_state()
            stack.enter_context(r.step.register_watcher(_recording(r, recorder, step_s)))
            for epoch in range(1, spec.epochs + 1):
                if r.end_epoch(epoch, train.train_one_epoch(r, epoch)):
                    break
        except StopReplay:
            pass
        except Exception:
            if recorder is None or recorder.stop is None:
                raise
            # the recorder's stop, raised inside the autograd engine and re-raised under another type
        finally:
            r.close()
    summary = {"run": str(run_dir), "repeat": k, "steps": recorder.current_step if recorder else 0,
               "ops": recorder.count if recorder else 0, "hashed": recorder.hashed if recorder else 0,
               "seconds": time.perf_counter() - started, "step_seconds": sum(step_s),
               "stop": recorder.stop if recorder else None, "records_match_until": check.matches_until,
               "first_record_difference": check.first_difference, "threads": torch.get_num_threads()}
    (out / REPLAY_JSON).write_text(json.dumps(summary, allow_nan=False), encoding="utf-8")
    return summary


def _recorded_steps(run_dir: Path, k: int) -> dict[int, dict[str, Any]]:
    """The step records repeat *k* of the run wrote, by step."""
    return {r["step"]: r for r in layout.metric_records(layout.RunDir(run_dir).repeat(k) / layout.METRICS)[0]
            if r.get("kind") == "step"}


def _recording(r: Any, recorder: OpRecorder, step_s: list[float]) -> Any:
    """The watcher of the repeat's step: what enters the step, then every operator of it, recorded;
    the time of the step itself kept in *step_s*."""

    @contextlib.contextmanager
    def watch(inputs: Any, targets: Any) -> Any:
        recorder.begin(r.global_step + 1, (inputs, targets))
        t0 = time.perf_counter()
        with recorder.step():
            yield
        step_s.append(time.perf_counter() - t0)
    return watch


@dataclass
class StepCheck:
    """The replay's step records against the run's own (``metrics.jsonl``), as the repeat passes
    each to its ``on_step`` callback, :meth:`see`; that ends the replay after *steps* steps."""

    recorded: dict[int, dict[str, Any]]  # the run's step records, by step
    steps: int
    matches_until: int = 0  # the last step up to which every record agreed
    first_difference: dict[str, Any] | None = None  # the first that did not: its step and both losses

    def see(self, record: dict[str, Any]) -> None:
        mine, theirs = _compared(record), _compared(self.recorded.get(record["step"]) or {})
        if self.first_difference is None and mine == theirs:
            self.matches_until = record["step"]
        elif self.first_difference is None:
            self.first_difference = {"step": record["step"], "replayed": mine.get("loss"),
                                     "recorded": theirs.get("loss")}
        if record["step"] >= self.steps:
            raise StopReplay


def _compared(record: dict[str, Any]) -> dict[str, Any]:
    """The computed quantities of a step record (the verdict's rule: repro500.verify.divergence)."""
    skip = {"kind", "repeat", "epoch", "step", "rank", "wall_s", "peak_memory_bytes", "backward_end"}
    return {k: v for k, v in record.items() if k not in skip and not k.startswith(("time_", "wire_"))
            and not k.endswith(("_time_s", "_per_s")) and (v is None or isinstance(v, (int, float, bool)))}


def _read_log(handle: Any) -> Iterator[OpRecord]:
    """The records of an ``ops.jsonl`` as it is read, one a line (blank lines are none)."""
    for line in handle:
        if line.strip():
            yield OpRecord(*json.loads(line))


def _record_at(path: Path, index: int) -> OpRecord:
    with open(path, encoding="utf-8") as fh:
        for i, record in enumerate(_read_log(fh)):
            if i == index:
                return record
    raise IndexError(index)


# ----- two replays, the first operator where they part -------------------------------------------------
@dataclass
class Side:
    """One repeat to replay, and the environment it runs in."""

    run_dir: Path
    repeat: int
    env: dict[str, str | None] = field(default_factory=dict)  # variables to set (None: unset) for its replay
    python: str = sys.executable
    label: str = "A"
    # the sandbox a replay of code the reproducer consented to runs in (locate --run-code), None: as it is;
    # the run's directory, the replay's own output and the log it is held against are added to it
    grants: sandbox.Grants | None = None


@dataclass
class OperatorFinding:
    """Where two replays part, operator by operator (module docstring)."""

    found: bool
    reason: str  # "different output" | "different operator" | "no difference" | "not reproduced"
    index: int | None = None
    step: int | None = None
    phase: str | None = None
    op: str | None = None
    module: str | None = None
    other_op: str | None = None
    inputs_agree: bool | None = None
    differing_inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)  # per differing output: shape, dtype, max_abs, max_rel
    max_abs: float | None = None
    max_rel: float | None = None
    random_op: bool = False
    self_consistent: dict[str, bool | None] = field(default_factory=dict)  # per side: same output in two replays
    replays: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    ops_hashed: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _run(side: Side, steps: int, out: Path, expect: Path | None = None, save_at: int | None = None,
         timeout_s: float | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    for name, value in side.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    # the replay imports the run's plug-ins from its sealed source/: a __pycache__ written there
    # would be a file its SHA256SUMS does not list, and the run would no longer verify
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [side.python, "-m", "repro500.workloads.trainer.replay", "--run", str(side.run_dir), "--repeat",
           str(side.repeat), "--steps", str(steps), "--out", str(out)]
    if expect is not None:
        cmd += ["--expect", str(expect)]
    if save_at is not None:
        cmd += ["--save-at", str(save_at)]
    if side.grants is not None:
        out.mkdir(parents=True, exist_ok=True)
        granted = side.grants.widened(read=[side.run_dir, *([expect] if expect is not None else [])], write=[out])
        cmd, env = [*sandbox.wrap(granted, env), *cmd], sandbox.environment(env)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise InvalidInput(f"the replay of {side.label} ({side.run_dir}, repeat {side.repeat}) took longer than "
                           f"{timeout_s:g} s: give fewer --steps or a longer --timeout") from None
    except OSError as err:
        raise InvalidInput(f"cannot start {side.python} for the replay of {side.label}: {err.strerror}") from None
    if done.returncode != 0 or not (out / REPLAY_JSON).is_file():
        lines = [line for line in (done.stderr or "").strip().splitlines() if line.strip()]
        said = lines[-1].removeprefix("repro500: error: ") if lines else f"exit {done.returncode}"
        raise InvalidInput(f"the replay of {side.label} ({side.run_dir}, repeat {side.repeat}) failed: {said}")
    return json.loads((out / REPLAY_JSON).read_text(encoding="utf-8"))


def _int_view(t: Any) -> Any:
    import torch

    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def bitwise_equal(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_int_view(a), _int_view(b))
    return a == b


def difference(a: Any, b: Any) -> dict[str, Any]:
    """Largest absolute and relative (``|a - b| / max(|a|, |b|)``, elementwise) difference of two
    tensors of one shape; for integers and booleans, the number of elements that differ."""
    import torch

    out: dict[str, Any] = {"shape": list(a.shape), "dtype": str(a.dtype).removeprefix("torch."),
                           "elements": a.numel()}
    if a.shape != b.shape:
        out.update(other_shape=list(b.shape))
        return out
    if a.is_floating_point() or a.is_complex():
        x, y = a.double(), b.double()
        diff = (x - y).abs()
        scale = torch.maximum(x.abs(), y.abs())
        both_nan = torch.isnan(x) & torch.isnan(y)
        diff = torch.where(both_nan, torch.zeros_like(diff), diff)
        rel = torch.where(scale > 0, diff / scale, torch.zeros_like(diff))
        out.update(max_abs=float(diff.max()) if diff.numel() else 0.0, max_rel=float(rel.max()) if rel.numel() else 0.0,
                   differing=int((_int_view(a) != _int_view(b)).sum()))
    else:
        out.update(differing=int((a != b).sum()))
    return out


def locate_operator(a: Side, b: Side, steps: int, *, timeout_s: float | None = None,
                    keep: Path | None = None) -> OperatorFinding:
    """The first operator where the replays of *a* and *b* part, within *steps* steps (module docstring)."""
    import torch

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="repro500-locate-") as tmp:
        root = keep or Path(tmp)
        dirs = {name: root / name for name in ("a", "b", "a-again", "b-again")}
        first_a = _run(a, steps, dirs["a"], timeout_s=timeout_s)
        first_b = _run(b, steps, dirs["b"], expect=dirs["a"] / OPS_LOG, timeout_s=timeout_s)
        replays = [{"side": a.label, **first_a}, {"side": b.label, **first_b}]
        finding = OperatorFinding(found=False, reason="no difference", replays=replays)
        stop = first_b.get("stop") or {}
        if stop.get("reason") not in ("different output", "different operator"):
            finding.steps = max(first_a["steps"], first_b["steps"])
            finding.ops_hashed = first_a["hashed"] + first_b["hashed"]
            finding.seconds = time.perf_counter() - started
            return finding
        index = int(stop["index"])
        again_a = _run(a, steps, dirs["a-again"], expect=dirs["a"] / OPS_LOG, save_at=index, timeout_s=timeout_s)
        again_b = _run(b, steps, dirs["b-again"], expect=dirs["b"] / OPS_LOG, save_at=index, timeout_s=timeout_s)
        replays += [{"side": f"{a.label} again", **again_a}, {"side": f"{b.label} again", **again_b}]
        finding.replays = replays
        finding.ops_hashed = sum(r["hashed"] for r in replays)
        finding.steps = max(r["steps"] for r in replays)
        for side, again in ((a.label, again_a), (b.label, again_b)):
            s = again.get("stop") or {}
            finding.self_consistent[side] = not (s.get("self_differs") or s.get("reason") in (
                "different output", "different operator"))
        early = [(side, again["stop"]) for side, again in ((a.label, again_a), (b.label, again_b))
                 if (again.get("stop") or {}).get("reason") in ("different output", "different operator")]
        if early:  # a side parted from its own first replay before the operator: that is the first divergence
            side, s = min(early, key=lambda item: item[1]["index"])
            finding.found, finding.reason, finding.index = True, "not reproducible", s["index"]
            _place(finding, _record_at(dirs["a-again" if side == a.label else "b-again"] / OPS_LOG, s["index"]))
            finding.seconds = time.perf_counter() - started
            return finding
        finding.found, finding.reason, finding.index = True, stop["reason"], index
        _compare_saved(finding, torch.load(dirs["a-again"] / SAVED, weights_only=False),
                       torch.load(dirs["b-again"] / SAVED, weights_only=False))
        finding.seconds = time.perf_counter() - started
        return finding


def _compare_saved(finding: OperatorFinding, saved_a: dict[str, Any], saved_b: dict[str, Any]) -> None:
    """The operator both replays saved: where it ran, whether its inputs agree, how its outputs differ."""
    import torch

    _place(finding, OpRecord(*saved_a["record"]))
    if finding.reason == "different operator":
        finding.other_op = OpRecord(*saved_b["record"]).op

    def tensors(saved: dict[str, Any], key: str) -> list[Any]:
        return [v for v in saved[key] if isinstance(v, torch.Tensor)]

    inputs_a, inputs_b = tensors(saved_a, "inputs"), tensors(saved_b, "inputs")
    finding.inputs_agree = len(inputs_a) == len(inputs_b) and all(
        bitwise_equal(x, y) for x, y in zip(inputs_a, inputs_b, strict=True))
    if not finding.inputs_agree:
        finding.differing_inputs = [{"input": i, **difference(x, y)}
                                    for i, (x, y) in enumerate(zip(inputs_a, inputs_b, strict=False))
                                    if not bitwise_equal(x, y)]
    for i, (x, y) in enumerate(zip(tensors(saved_a, "outputs"), tensors(saved_b, "outputs"), strict=False)):
        if not bitwise_equal(x, y):
            finding.outputs.append({"output": i, **difference(x, y)})
    numbers = [o for o in finding.outputs if o.get("max_abs") is not None]
    if numbers:
        finding.max_abs = max(o["max_abs"] for o in numbers)
        finding.max_rel = max(o["max_rel"] for o in numbers)


def _place(finding: OperatorFinding, record: OpRecord) -> None:
    """Where the operator of *record* ran, and whether it draws random numbers."""
    finding.step, finding.phase, finding.op, finding.module = record.step, record.phase, record.op, record.path
    finding.random_op = _is_random(record.op)


def _is_random(op: str) -> bool:
    name = op.split(".")[1] if op.count(".") >= 1 else op
    return name in _RANDOM


# ----- the replay process ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro500.workloads.trainer.replay")
    parser.add_argument("--run", required=True)
    parser.add_argument("--repeat", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--expect")
    parser.add_argument("--save-at", type=int)
    args = parser.parse_args(argv)
    try:
        replay(args.run, args.repeat, args.steps, args.out, expect=args.expect, save_at=args.save_at)
    except ReproError as err:
        print(f"repro500: error: {' '.join(str(err).split())}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":  # pragma: no cover - the replay process
    sys.exit(main())
