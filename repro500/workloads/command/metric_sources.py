"""Read a wrapped command's declared metrics from what the script already produced.

A recipe's ``metrics:`` section declares each metric a command workload reports, and where it
comes from (docs/command.md)::

    accuracy: {regex: 'Acc@1 ([0-9.]+)', take: last, scale: 0.01}   # a line of stdout/stderr
    loss: {source: mlflow}                                           # the script's mlflow.log_metric
    eval_accuracy: {source: mllog, key: eval_accuracy}               # MLPerf :::MLLOG lines
    f1: {source: json, key: scores.f1}                               # the $REPRO500_METRICS file
    top5: {}                                                         # mlflow, then mllog, then json

Every reader here is a pure function of text, a file or an MLflow run: testable without a
subprocess.  A metric the script did not produce raises :class:`MetricMissing` with one
sentence naming the source that was read; it is never a silent zero.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput, RunFailed

Regex = Any  # what untrusted.pattern compiles: an RE2 pattern, with re.Pattern's methods

SOURCES = ("auto", "mlflow", "mllog", "regex", "json")
# The order of preference for a declaration without a source: what the script logs to
# MLflow itself, then MLPerf lines, then the JSON file.  A regex is never guessed.
AUTO_ORDER = ("mlflow", "mllog", "json")
TAKES = ("last", "first", "max", "min", "mean")
STREAMS = ("stdout", "stderr")
_KEYS = {"source", "key", "regex", "stream", "take", "scale", "file"}


class MetricMissing(RunFailed):
    """A declared metric the script did not produce (the repeat failed; the sentence says why)."""


@dataclass(frozen=True)
class MetricDecl:
    """One entry of the recipe's ``metrics:`` section."""

    name: str
    source: str = "auto"
    key: str = ""  # the name in the source; empty: the metric's own name
    regex: str | None = None
    stream: str = "stdout"
    take: str = "last"
    scale: float = 1.0
    file: str | None = None  # mllog only: a log file (repeat dir, else workdir) besides the streams

    @property
    def lookup(self) -> str:
        return self.key or self.name

    def label(self) -> str:
        """How the summary's ``metric_sources`` names where the value came from."""
        return f"regex:{self.stream}" if self.source == "regex" else self.source

    @classmethod
    def parse(cls, name: str, raw: Any, *, where: str) -> MetricDecl:
        """Validate one declaration; *where* prefixes every error (``recipe.yaml: metrics.accuracy``)."""
        if raw is None:
            raw = {}
        if isinstance(raw, str):  # ``loss: mlflow`` is shorthand for ``loss: {source: mlflow}``
            raw = {"source": raw}
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"{where}: expected a mapping such as {{regex: 'Acc@1 ([0-9.]+)'}}, got {type(raw).__name__}")
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise InvalidInput(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_KEYS))}")
        regex = raw.get("regex")
        source = raw.get("source", "regex" if regex is not None else "auto")
        if source not in SOURCES:
            raise InvalidInput(f"{where}: source must be one of {', '.join(SOURCES[1:])} (or left out), not {source!r}")
        if source == "regex" and regex is None:
            raise InvalidInput(f"{where}: source regex needs a regex key, e.g. regex: 'Acc@1 ([0-9.]+)'")
        if regex is not None and source != "regex":
            raise InvalidInput(f"{where}: a regex is read from stdout or stderr; drop either regex or source: {source}")
        key = raw.get("key", "")
        if not isinstance(key, str) or (source == "regex" and key):
            raise InvalidInput(f"{where}: key must be a string naming the metric in its source (not used with regex)")
        stream = raw.get("stream", "stdout")
        if stream not in STREAMS or ("stream" in raw and source != "regex"):
            raise InvalidInput(f"{where}: stream is stdout or stderr, and only goes with a regex")
        file = raw.get("file")
        if file is not None and (source != "mllog" or not isinstance(file, str) or not file):
            raise InvalidInput(f"{where}: file names an MLPerf log file and only goes with source: mllog")
        decl = cls(name=name, source=source, key=key, regex=regex, stream=stream,
                   take=raw.get("take", "last"), scale=raw.get("scale", 1.0), file=file)
        decl.validate(where)
        return decl

    def validate(self, where: str) -> None:
        """The checks a pre-flight repeats on a declaration built by hand (one sentence each)."""
        if self.take not in TAKES:
            raise InvalidInput(f"{where}: take must be one of {', '.join(TAKES)}, not {self.take!r}")
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale):
            raise InvalidInput(f"{where}: scale must be a finite number, not {self.scale!r}")
        if self.source == "regex":
            compile_regex(self.regex, where)


def compile_regex(pattern: Any, where: str) -> Regex:
    """A metric regex: it compiles (with RE2, :func:`repro500.untrusted.pattern`: a recipe may come
    from a publication, and verify replays it over every line of the output) and has exactly one
    group, or a named group ``value``."""
    compiled = untrusted.pattern(pattern, where)
    if "value" not in compiled.groupindex and compiled.groups != 1:
        raise InvalidInput(
            f"{where}: regex {pattern!r} has {compiled.groups} groups; it needs exactly one group "
            "around the number, or a named group (?P<value>...)"
        )
    return compiled


def reduce(values: list[float], take: str) -> float:
    """One number from all the values a source reported, in the order reported."""
    if take == "last":
        return values[-1]
    if take == "first":
        return values[0]
    if take == "max":
        return max(values)
    if take == "min":
        return min(values)
    return statistics.fmean(values)


def _number(text: Any) -> float | None:
    if isinstance(text, bool):
        return None
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


# ----- regular expressions over stdout / stderr -----------------------------------------------
def regex_values(lines: Iterable[str], pattern: Regex) -> tuple[list[float], list[str]]:
    """Every match on every line: (numbers, captured texts that are not numbers)."""
    values: list[float] = []
    bad: list[str] = []
    group: int | str = "value" if "value" in pattern.groupindex else 1
    for line in lines:
        for match in pattern.finditer(line):
            captured = match.group(group)
            number = _number(captured)
            if number is None:
                bad.append(captured or "")
            else:
                values.append(number)
    return values, bad


def read_regex(decl: MetricDecl, lines: Iterable[str]) -> float:
    """The metric from the lines of the stream its regex reads (per line, ReFrame style)."""
    pattern = compile_regex(decl.regex, f"metric {decl.name}")
    values, bad = regex_values(lines, pattern)
    if not values:
        if bad:
            raise MetricMissing(
                f"metric {decl.name}: regex {decl.regex!r} matched {bad[-1]!r} on {decl.stream}, which is not a number"
            )
        raise MetricMissing(f"metric {decl.name}: no line of {decl.stream} matched regex {decl.regex!r}")
    return reduce(values, decl.take) * decl.scale


# ----- MLPerf :::MLLOG lines ------------------------------------------------------------------
def mllog_values(lines: Iterable[str], key: str) -> list[float]:
    """The numeric values logged under *key*, in time order.

    The line format is mlperf-logging's own parser (the compliance checker's newest ruleset):
    it finds ``:::MLLOG`` after any prefix an MPI launcher adds (``[1,0]<stdout>:``) and reads the
    JSON after it.  It is fed line by line because it lets a line without ``metadata`` escape as a
    KeyError that would end the whole parse; such a line is skipped like any other unparsable one.
    """
    from mlperf_logging.compliance_checker.mlp_parser import ruleset_610 as mlp

    found: list[tuple[float, int, float]] = []
    for index, line in enumerate(mlp.strip_and_dedup(lines)):
        try:
            record = mlp.string_to_logline(index, line.strip())
        except (ValueError, KeyError, TypeError):
            continue
        if record.key != key:
            continue
        value = record.value.get("value") if isinstance(record.value, dict) else None
        number = _number(value)
        if number is not None:
            found.append((record.timestamp, index, number))
    # stdout and stderr (and a log file) are read one after the other; time_ms puts them back in order.
    return [number for _, _, number in sorted(found)]


def read_mllog(decl: MetricDecl, lines: Iterable[str], where: str) -> float:
    values = mllog_values(lines, decl.lookup)
    if not values:
        raise MetricMissing(f"metric {decl.name}: no :::MLLOG line in {where} has key {decl.lookup!r} with a numeric value")
    return reduce(values, decl.take) * decl.scale


# ----- the $REPRO500_METRICS JSON file --------------------------------------------------------
def load_json_file(path: Path) -> dict[str, Any]:
    """The script's metrics file; MetricMissing when it was not written or is not a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MetricMissing(f"$REPRO500_METRICS ({path}) was not written") from None
    except (OSError, UnicodeDecodeError) as err:
        raise MetricMissing(f"$REPRO500_METRICS ({path}) cannot be read ({err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise MetricMissing(f"$REPRO500_METRICS ({path}) is not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, dict):
        raise MetricMissing(f"$REPRO500_METRICS ({path}) holds a JSON {type(data).__name__}, not an object")
    return data


def dotted(data: Mapping[str, Any], key: str) -> Any:
    """``scores.f1`` -> ``data["scores"]["f1"]``; a key that itself contains the dots wins."""
    if key in data:
        return data[key]
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def read_json(decl: MetricDecl, data: Mapping[str, Any], path: Path) -> float:
    """The metric from the parsed metrics file; a list of numbers goes through ``take``."""
    try:
        value = dotted(data, decl.lookup)
    except KeyError:
        raise MetricMissing(f"metric {decl.name}: $REPRO500_METRICS ({path}) has no key {decl.lookup!r}") from None
    values = value if isinstance(value, list) and value else [value]
    numbers = [_number(v) if not isinstance(v, str) else None for v in values]
    if any(n is None for n in numbers):
        raise MetricMissing(f"metric {decl.name}: $REPRO500_METRICS ({path}) key {decl.lookup!r} is not a number or a list of numbers")
    return reduce([n for n in numbers if n is not None], decl.take) * decl.scale


def json_param_digest(data: Mapping[str, Any]) -> str | None:
    """A parameter digest the script reported itself (``"param_digest": "<hex>"``), if any."""
    value = data.get("param_digest")
    return value if isinstance(value, str) and value else None


# ----- the script's own MLflow runs -------------------------------------------------------------
@dataclass(frozen=True)
class ScriptRuns:
    """Where the MLflow runs a script started in one repeat are: the store, and the tags repro500's
    run-context provider put on them (repro500.tracking.context)."""

    uri: str
    run_id: str  # the repro500 run's id
    repeat: int
    wait: Callable[[], None] | None = None  # until repro500 has the store open (it opens it beside the repeat)


def script_run_metrics(runs: ScriptRuns) -> list[tuple[str, dict[str, float]]]:
    """(MLflow run id, latest value of every metric) of each run the script started, oldest first."""
    from mlflow.tracking import MlflowClient

    from repro500.tracking.client import script_runs

    if runs.wait is not None:
        runs.wait()
    found = script_runs(MlflowClient(runs.uri), runs.run_id, runs.repeat)
    return [(run.info.run_id, dict(run.data.metrics)) for run in found]


def mlflow_history(tracking_uri: str, run_id: str, key: str) -> list[float]:
    """Every value logged under *key*, ordered by step, then time."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
    return [m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))]


def read_mlflow(decl: MetricDecl, tracking_uri: str, runs: list[tuple[str, dict[str, float]]]) -> float:
    """The metric from the script's runs: the last-started run that logged it (a final evaluation
    run after the training run, autologging's run after the script's own: the latest word wins)."""
    having = [(run_id, latest) for run_id, latest in runs if decl.lookup in latest]
    if not runs:
        raise MetricMissing(f"metric {decl.name}: the script started no MLflow run in this repeat "
                            f"(mlflow.start_run, or a log call that starts one), so nothing logged {decl.lookup!r}")
    if not having:
        raise MetricMissing(f"metric {decl.name}: none of the {len(runs)} MLflow run(s) the script started in this "
                            f"repeat logged {decl.lookup!r}")
    run_id, latest = having[-1]
    if decl.take == "last":
        return float(latest[decl.lookup]) * decl.scale
    return reduce(mlflow_history(tracking_uri, run_id, decl.lookup), decl.take) * decl.scale


# ----- a value against the band it is judged by ------------------------------------------------
# A band inside [0, 1] is a fraction; a value above this is almost surely a percentage, which
# would pass a "higher" band by a factor of a hundred (93.3 >= 0.88).
FRACTION_CEILING = 1.5


def implausible(name: str, value: float, band: Mapping[str, Any]) -> str | None:
    """One sentence when *value* cannot be on the scale of its acceptance *band*, else None.

    Only the case that reads as a unit mix-up is named: a band of fractions (its target in
    [0, 1], its tolerance at most 1) and a value past :data:`FRACTION_CEILING` (a percentage, as
    torchvision's reference prints ``Acc@1 93.3``).  A warning, not a failure: the verdict
    stays the statistics'.
    """
    try:
        target, tolerance = float(band.get("target")), abs(float(band.get("tolerance") or 0.0))
    except (TypeError, ValueError):
        return None
    if not (0.0 <= target <= 1.0 and tolerance <= 1.0) or not value > FRACTION_CEILING:
        return None
    op = "<=" if band.get("direction") == "lower" else ">="
    return (f"metric {name} measured {value:g}, but its acceptance band ({op} {target:g} ± {tolerance:g}) is one "
            f"of fractions in [0, 1]; if the command reports a percentage, scale it: --scale {name}=0.01 "
            f"(scale: 0.01 in a recipe's metrics)")


def _read_lines(path: Path) -> Iterator[str]:
    # Line by line: a script's output can be far larger than memory wants to hold at once.
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        for line in fh:
            yield line.rstrip("\r\n")


# ----- one repeat's products, read lazily and at most once ------------------------------------
class Produced:
    """What one run of the script left behind: its streams, its metrics file, its MLflow run."""

    def __init__(self, *, stdout: Path, stderr: Path, metrics_file: Path, search: list[Path],
                 mlflow: ScriptRuns | None = None) -> None:
        self.streams = {"stdout": stdout, "stderr": stderr}
        self.metrics_file = metrics_file
        self.search = search  # where a relative file name is looked up: repeat dir, then workdir
        self.mlflow = mlflow
        self._json: dict[str, Any] | MetricMissing | None = None
        self._runs: list[tuple[str, dict[str, float]]] | MetricMissing | None = None

    def lines(self, stream: str) -> Iterator[str]:
        return _read_lines(self.streams[stream])

    def find(self, name: str) -> Path | None:
        for base in self.search:
            if (base / name).is_file():
                return base / name
        return None

    def json(self) -> dict[str, Any]:
        if self._json is None:
            try:
                self._json = load_json_file(self.metrics_file)
            except MetricMissing as err:
                self._json = err
        if isinstance(self._json, MetricMissing):
            raise MetricMissing(str(self._json))
        return self._json

    def param_digest(self) -> str | None:
        try:
            return json_param_digest(self.json())
        except MetricMissing:
            return None

    def script_runs(self) -> list[tuple[str, dict[str, float]]]:
        if self.mlflow is None:
            raise MetricMissing("this run is not tracked in MLflow (--no-tracking), so the script's MLflow metrics cannot be read")
        if self._runs is None:
            try:
                self._runs = script_run_metrics(self.mlflow)
            except Exception as err:  # noqa: BLE001 - any store failure is the same sentence
                reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
                self._runs = MetricMissing(f"the MLflow store could not be read ({reason})")
        if isinstance(self._runs, MetricMissing):
            raise MetricMissing(str(self._runs))
        return self._runs

    def _mllog_lines(self, decl: MetricDecl) -> tuple[Iterator[str], str]:
        paths = list(self.streams.values())
        where = "stdout or stderr"
        if decl.file:
            path = self.find(decl.file)
            if path is None:
                raise MetricMissing(f"metric {decl.name}: MLPerf log {decl.file} was not written")
            paths.append(path)
            where = f"stdout, stderr or {decl.file}"
        return (line for path in paths for line in _read_lines(path)), where

    def read_from(self, decl: MetricDecl, source: str) -> float:
        if source == "regex":
            return read_regex(decl, self.lines(decl.stream))
        if source == "json":
            return read_json(decl, self.json(), self.metrics_file)
        if source == "mllog":
            lines, where = self._mllog_lines(decl)
            return read_mllog(decl, lines, where)
        runs = self.script_runs()
        return read_mlflow(decl, self.mlflow.uri if self.mlflow else "", runs)


def read_metric(decl: MetricDecl, produced: Produced) -> tuple[float, str]:
    """(value, source label) of one declared metric; MetricMissing names what was read.

    A metric without a source is looked for in :data:`AUTO_ORDER`; the first source that has it
    wins, and when none has it the sentence lists why each one did not.
    """
    if decl.source != "auto":
        try:
            return produced.read_from(decl, decl.source), decl.label()
        except MetricMissing as err:
            text = str(err)
            raise MetricMissing(text if text.startswith("metric ") else f"metric {decl.name}: {text}") from None
    reasons = []
    for source in AUTO_ORDER:
        try:
            return produced.read_from(decl, source), source
        except MetricMissing as err:
            reasons.append(str(err).removeprefix(f"metric {decl.name}: "))
    raise MetricMissing(f"metric {decl.name} was found in no source: " + "; ".join(reasons))
