"""Reading what somebody else wrote, and whether their code may run: the one rule.

A publication, a packed run, a git repository or an MLflow run handed to ``reproduce`` or
``verify`` is untrusted input (docs/publish.md, "What a publication cannot do to you").  Every
reader of such files goes through this module, so that a new reader cannot forget a bound:

* **Files**: only regular files are read (a FIFO, a device or a link to one is refused before it
  is opened for reading, so nothing blocks or streams forever), each up to a size cap.
* **YAML**: safe constructors only, and aliases expanded to at most :data:`MAX_YAML_NODES` nodes
  (a "billion laughs" document of a few hundred bytes would otherwise expand to gigabytes when it
  is walked).  The expanded size is counted on the composed graph, before anything is built.
* **JSON**: a document nested deeper than Python's recursion limit is a sentence, not a
  RecursionError.
* **Paths** inside archives and git trees: at most :data:`MAX_PATH_DEPTH` components.
* **Strings printed** on a terminal: every string a run chose reaches it through :func:`shown`
  (rich) or :func:`plain` (click), one line with control characters (ESC, CSI, OSC, C1, newlines)
  and bidi overrides escaped, whitespace runs collapsed, cut to :data:`FIELD_CHARS` (a sentence
  of repro500's own that quotes fields, to :data:`SENTENCE_CHARS`) and rich markup shown as text,
  so a metric named with an OSC 52 sequence cannot write the clipboard, and a run id cannot move
  the cursor, nor pad a fake verdict onto a line of its own.
* **Patterns**: a regular expression a record carries (a command run's ``regex:`` metric, replayed
  by verify over every line of its output) is compiled by :func:`pattern` with RE2, whose matching
  time is linear in the line; Python's ``re`` backtracks, and ``(a|a)*b`` over a line of 4,000
  ``a`` would never end.  A pattern RE2 cannot compile (a backreference, a lookaround) is refused.
* **Code**: whether code a publication or a packed run chose may run is :func:`consent`'s one
  decision (``--run-code``), asked by every path that would run it: reproduce's rerun, the
  environment ``reproduce --env venv`` builds, locate's replays.  Without it, the child starts
  with :data:`CODE_ENV` set to ``refuse``; then no recipe key may name a ``module:callable`` and
  no directory of the publication is put on ``sys.path`` (:func:`code_refused`; the plug-in door
  asks it).  Names registered by installed distributions stay allowed: they are the reproducer's
  own software.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import re2

from repro500.errors import InvalidInput, UsageError

if TYPE_CHECKING:
    import yaml
    from rich.console import Console

MAX_DOCUMENT_BYTES = 64 * 2**20  # a manifest, a recipe, a verdict: far below this
MAX_LOG_BYTES = 4 * 2**30  # a repeat's metrics log, read line by line
MAX_YAML_NODES = 100_000  # nodes after alias expansion; a recipe has a few hundred
MAX_PATH_DEPTH = 64  # directories deep, in an archive or a git tree
# A packed run is summaries, logs and digests: far below these; an archive above them is refused
# before extraction, whatever it claims (REPRO500_MAX_UNPACK_BYTES raises the size cap).
MAX_UNPACK_BYTES = 4 * 2**30
MAX_MEMBERS = 100_000
# A run's files are JSON, logs and checkpoints: gzip shrinks them a few times (metrics logs ~10x,
# checkpoints barely).  Content declaring more than this many times the archive's own size is a
# decompression bomb (a gigabyte of zeros packs into a megabyte), refused before it is extracted;
# below BOMB_FLOOR the ratio is not asked, as such an archive cannot fill a disk.
MAX_RATIO = 200
BOMB_FLOOR = 64 * 2**20
# Files of a commit extracted for `dvc pull` (a research repository's code and DVC files; its data
# lives in the DVC remote), and entries walked looking for a publication (a tree may list one
# subtree many times over).
MAX_TREE_FILES = 20_000
MAX_TREE_ENTRIES = 200_000
MAX_LINK_HOPS = 40  # links followed inside an archive, as the kernel's ELOOP limit
MAX_LINE_CHARS = 4096  # a command's output line longer than this is cut before a pattern reads it
MAX_HOOK_BYTES = 8 * 2**20  # a command's interpreter record: a sys.path of thousands of packages is far below
MAX_WHEEL_TAGS = 256  # a wheel's Tag lines: a handful, a few dozen for a wide manylinux/macOS build
MAX_INDEX_PAGE_BYTES = 64 * 2**20  # a package index page (torch's, every release's files with hashes, is a few MB)
# Repeats a record may say a run planned (run.json, summary.json, chain.jsonl, recipe.yaml, a
# sequential design's max_repeats): a recipe asks for a handful, --until-decided for tens, a --vary
# grid for hundreds.  Readers build sets and lists of that many indices (and verify lists the
# missing ones), so a count of 10^9 in a record must stop here, not in a MemoryError.
MAX_REPEATS = 100_000
# Nodes a record may say one repeat ran on (run.json's nnodes): a rerun asks SLURM for that many,
# so it is bounded before it is used; more than the largest clusters have.
MAX_RUN_NODES = 100_000
UNPACK_ENV = "REPRO500_MAX_UNPACK_BYTES"  # raises (or lowers) MAX_UNPACK_BYTES
CODE_ENV = "REPRO500_FOREIGN_CODE"  # "refuse": no import path, no search path (reproduce without --run-code)

# the recipe keys whose value may name code to import (module:callable), everywhere a recipe has one
_IMPORT_KEYS = (("fixed", "model"), ("fixed", "dataset", "entry"), ("fixed", "dataset", "name"), ("fixed", "evaluate"),
                ("fixed", "system", "model"), ("fixed", "system", "dataset", "entry"),
                ("fixed", "system", "dataset", "name"))


def open_regular(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES, *, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading when it is a regular file of at most ``cap`` bytes (``what``
    names it in errors); FileNotFoundError passes through, anything else is InvalidInput.  With
    ``follow=False`` a link is refused too (a publication's own file is a file, never a link)."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; checked just below
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as err:
        if not follow and os.path.islink(path):
            raise InvalidInput(f"{path} is a link, not a file: {what} is refused") from None
        raise InvalidInput(f"{path} cannot be read ({err.strerror or err.__class__.__name__}): {what}") from None
    handle = os.fdopen(fd, "rb")
    info = os.fstat(handle.fileno())
    if not stat.S_ISREG(info.st_mode):
        handle.close()
        raise InvalidInput(f"{path} is not a regular file ({_kind(info.st_mode)}): {what} is refused")
    if info.st_size > cap:
        handle.close()
        raise InvalidInput(f"{path} is {info.st_size:,} bytes, over the {cap:,}-byte cap for {what}: refused")
    return handle


def read_bytes(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES, *, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`)."""
    with open_regular(path, what, cap, follow=follow) as handle:
        data = _read_upto(handle, cap + 1)
    if len(data) > cap:  # grew while being read
        raise InvalidInput(f"{path} is over the {cap:,}-byte cap for {what}: refused")
    return data


def _read_upto(handle: BinaryIO, limit: int) -> bytes:
    """At most ``limit`` bytes of ``handle``, buffers sized by what the file holds: ``read(limit)``
    allocates ``limit`` bytes before it reads one (4 GiB for a log's cap, whatever the file's size)."""
    size = os.fstat(handle.fileno()).st_size
    parts = [handle.read(min(size, limit - 1) + 1)]  # one read for a file that does not grow
    total = len(parts[0])
    while total < limit and len(parts[-1]) > 0 and total > size:  # it grew while being read
        parts.append(handle.read(min(2**20, limit - total)))
        total += len(parts[-1])
    return b"".join(parts)


def read_text(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES) -> str:
    try:
        return read_bytes(path, what, cap).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text: {what} is refused") from None


def read_json(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES) -> Any:
    """The JSON document in the regular file ``path`` (:func:`read_bytes`, :func:`load_json`);
    FileNotFoundError passes through, anything else wrong is InvalidInput."""
    return load_json(read_bytes(path, what, cap), str(path))


def read_yaml(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES) -> Any:
    """The YAML document in the regular file ``path`` (:func:`read_text`, :func:`load_yaml`)."""
    return load_yaml(read_text(path, what, cap), str(path))


def json_record(line: str | bytes) -> dict[str, Any] | None:
    """The JSON object on one line of a log (metrics, digests, a chain), or None when the line is
    not one: malformed, cut short by a crash, nested too deeply, or another JSON value.  A log is
    read tolerantly line by line; its size is bounded by the reader that opened it."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def log_lines(path: str | Path, what: str, cap: int = MAX_LOG_BYTES) -> Iterator[str]:
    """The lines of the regular file ``path`` (a metrics log, a params log), opened now: a FIFO, a
    device or a file over ``cap`` raises here, FileNotFoundError passes through.  Undecodable bytes
    are replaced; a line longer than :data:`MAX_DOCUMENT_BYTES` is skipped, never held whole."""
    handle = io.TextIOWrapper(open_regular(path, what, cap), encoding="utf-8", errors="replace")
    return _bounded_lines(handle)


def _bounded_lines(handle: io.TextIOWrapper) -> Iterator[str]:
    with handle:
        while line := handle.readline(MAX_DOCUMENT_BYTES):
            if len(line) >= MAX_DOCUMENT_BYTES and not line.endswith("\n"):
                while line and not line.endswith("\n"):  # the rest of an absurd line, dropped
                    line = handle.readline(MAX_DOCUMENT_BYTES)
                continue
            yield line


def unpack_cap() -> int:
    """What a packed run (or a git commit extracted for ``dvc pull``, or a sealed run downloaded
    from MLflow) may hold: :data:`MAX_UNPACK_BYTES`, or ``$REPRO500_MAX_UNPACK_BYTES``."""
    raw = os.environ.get(UNPACK_ENV)
    if raw is None:
        return MAX_UNPACK_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"{UNPACK_ENV}={raw!r} is not a positive number of bytes")
    return value


def regular_file(path: str | Path) -> bool:
    """Whether ``path`` is a regular file itself (not a link, FIFO or device)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a plain file"


def compose_yaml(text: str, where: str) -> yaml.Node | None:
    """The YAML node graph of ``text`` with its alias expansion bounded; yaml.YAMLError passes
    through (callers say where the syntax is wrong)."""
    import yaml

    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is not None:
        expanded = _expanded_nodes(node, {})
        if expanded > MAX_YAML_NODES:
            raise InvalidInput(f"{where}: its aliases expand to over {MAX_YAML_NODES:,} nodes (a YAML bomb?): refused")
    return node


def _expanded_nodes(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many nodes ``node`` stands for once every alias is written out (a shared node counts
    each time it is referred to); the graph is walked once, however large the expansion."""
    import yaml

    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = MAX_YAML_NODES + 1  # a recursive alias expands without end
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded_nodes(k, memo) + _expanded_nodes(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded_nodes(item, memo) for item in node.value)
    else:
        total = 1
    memo[key] = min(total, MAX_YAML_NODES + 1)
    return memo[key]


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` with the expansion bound; malformed YAML is InvalidInput naming ``where``."""
    import yaml

    try:
        node = compose_yaml(text, where)
        return None if node is None else yaml.SafeLoader("").construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise InvalidInput(f"{where} is not valid YAML{line}") from None
    except RecursionError:
        raise InvalidInput(f"{where} is nested too deeply to be read: refused") from None


def load_json(text: str | bytes, where: str) -> Any:
    """``json.loads``; malformed or absurdly nested JSON is InvalidInput naming ``where``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{where} is not valid JSON (line {err.lineno}): the file is corrupt") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{where} is not UTF-8 JSON: the file is corrupt") from None
    except RecursionError:
        raise InvalidInput(f"{where} is nested too deeply to be read: refused") from None


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would write its own line to stderr; the refusal is ours
    return options


_RE2_OPTIONS = _re2_options()


def pattern(text: Any, where: str) -> re2._Regexp:
    """A regular expression somebody else wrote (a record's or a recipe's ``regex``), compiled by
    RE2 (google-re2): matching runs in time linear in the text whatever the pattern, where Python's
    ``re`` backtracks without end on ``(a|a)*b``.  The one place such a pattern is compiled; the
    project's own fixed patterns stay with ``re``.  What RE2 cannot compile (a backreference, a
    lookaround, a possessive quantifier) is InvalidInput naming ``where`` (the field and its file)."""
    if not isinstance(text, str) or not text:
        raise InvalidInput(f"{where}: regex must be a non-empty string")
    try:
        return re2.compile(text, options=_RE2_OPTIONS)
    except re2.error as err:
        detail = err.args[0].decode("utf-8", "replace") if err.args and isinstance(err.args[0], bytes) else str(err)
        raise InvalidInput(f"{where}: regex {plain(text)[:200]!r} does not compile with RE2 ({plain(detail)}); "
                           "repro500 matches a recorded pattern with RE2, in linear time, which has no "
                           "backreferences or lookarounds: refused") from None


def count(value: Any, what: str, cap: int = MAX_REPEATS, least: int = 0) -> int:
    """A count a record states (planned repeats, a design's maximum, steps, files, members) as a
    number this process may allocate from: an int (not a bool) from ``least`` to ``cap``.  Anything
    else is InvalidInput naming ``what`` (the field and its file), raised before a reader builds a
    range, a set or a list from it; a reader that collects problems (verify) keeps the sentence."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidInput(f"{what} is {plain(repr(value))[:60]}, not a count of at least {least}")
    if value > cap:
        raise InvalidInput(f"{what} is {value:,}, over the {cap:,} repro500 accepts from a record: refused")
    return value


def indices(ks: list[int]) -> str:
    """Indices (repeats a record planned) as a short list: consecutive ones as a range ("3-99999"),
    at most 20 spans, so that a sentence stays short however large a count a record states."""
    spans: list[list[int]] = []
    for k in sorted(ks):
        if spans and k == spans[-1][1] + 1:
            spans[-1][1] = k
        else:
            spans.append([k, k])
    shown_spans = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in spans]
    more = f" and {len(spans) - 20} more spans" if len(spans) > 20 else ""
    return ", ".join(shown_spans[:20]) + more


def path_depth_ok(parts: tuple[str, ...] | list[str]) -> bool:
    return len(parts) <= MAX_PATH_DEPTH


MAX_NAME_CHARS = 200  # a file name a publication gives (run id, archive): within every file system's 255 bytes


def path_name(text: Any, what: str) -> str:
    """``text``, a name somebody else chose that becomes one file or directory name here (a run id,
    an archive's name), when it is one: a relative name of one component, no ``..``, no separator,
    no control character.  Anything else could create a file outside the directory it is joined
    to (``../../tmp/x`` as a run id), so it is refused before anything is written (InvalidInput)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{what} is {plain(repr(text))[:100]}: expected a name")
    shown_text = plain(text[:MAX_NAME_CHARS])
    if "/" in text or "\\" in text or text in (".", "..") or (len(text) > 1 and text[1] == ":"):
        raise InvalidInput(f"{what} {shown_text!r} leaves its directory: a name from a publication must be one "
                           "file name, without '/', '\\' or '..'; refusing it")
    if _CONTROL.search(text) or len(text.encode("utf-8", "surrogatepass")) > MAX_NAME_CHARS or text.startswith("-"):
        raise InvalidInput(f"{what} {shown_text!r} is not a usable file name (control characters, a leading '-' "
                           f"or more than {MAX_NAME_CHARS} bytes); refusing it")
    return text


# Characters that change how a terminal shows what follows them: C0 controls (ESC starts CSI cursor
# moves and OSC strings; newline and carriage return start a line that looks like repro500's own),
# DEL and C1 (0x9b is a one-byte CSI), and the bidi embeddings, overrides, isolates and marks that
# reorder the rest of the line (U+202E shows "DECUDORPER" as "REPRODUCED"); U+2028/U+2029 break lines.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029{_BIDI}]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# How wide a string from a run may be on the terminal, after whitespace is collapsed: a field (a
# name, an id, a benchmark, a path) FIELD_CHARS, a sentence of repro500's own that quotes fields
# (a reason, a note, an error) SENTENCE_CHARS.  Longer text is cut, ending in "…".
FIELD_CHARS = 200
SENTENCE_CHARS = 2000
_WHITESPACE = re.compile(r"\s+")


def record_console() -> Console:
    """The console a command prints through when what it prints quotes a run, a recipe or a
    publication.  Rich breaks a line that is wider than the terminal at a space, so a record's
    words could be made to land at the start of a line of their own (a value padded to put a forged
    ``REPRODUCED (exact)`` where the break falls, which the record fuzzer found); with soft wrap
    rich breaks no line itself, and :func:`shown` keeps a record's text on its line."""
    from rich.console import Console

    return Console(emoji=False, soft_wrap=True)


def shown(text: Any, width: int = FIELD_CHARS) -> str:
    """``text`` from a run (a name, an id, a reason) as one line of rich markup that shows it
    literally (see :func:`plain`), rich markup brackets escaped.  Everything repro500 prints that a
    run, a recipe or a publication chose goes through this function (into rich) or :func:`plain`
    (into click.echo), so none of it can drive the reader's terminal or forge a line of its own."""
    from rich.markup import escape

    return escape(plain(text, width))


def plain(text: Any, width: int = FIELD_CHARS) -> str:
    """``text`` on one line of at most ``width`` characters: every control character (ESC and so
    CSI and OSC, C1, newline), bidi override and isolate as a ``\\xNN`` / ``\\uNNNN`` escape, the
    bytes of a file name that is not UTF-8 (Python's surrogate escapes) as ``\\xNN``, and every run
    of whitespace (spaces, no-break and ideographic spaces) as one space, so that padding cannot
    push what follows it to the start of a wrapped terminal line; then cut to ``width`` (for output
    that is not rich markup: click.echo, an error line)."""
    line = _WHITESPACE.sub(" ", _CONTROL.sub(_escaped, encodable(str(text))))
    return line if len(line) <= width else line[: width - 1] + "…"


def encodable(text: str) -> str:
    """``text`` with the lone surrogates that stand for a non-UTF-8 file name's bytes written as
    ``\\xNN``, so that it can be encoded as UTF-8 (a report, a terminal, a JSON file)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that stands for no byte: its code point, escaped
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


# What reaches a terminal: tab, newline, carriage return and CSI sequences (colours, the progress
# bar's cursor moves) pass; every other control character is escaped, ESC starting anything but
# CSI included, so OSC (clipboard, window title), DCS and APC strings cannot be sent.
# The last safety net, not the boundary (that is shown/plain): bidi controls never belong to repro500's
# own output either.
_TERMINAL_UNSAFE = re.compile(r"\x1b(?!\[[0-9;?]*[ -/]*[@-~])|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f"
                              f"{_BIDI}]")


def terminal_safe(text: str) -> str:
    """``text`` as the CLI writes it to stdout/stderr (see :data:`_TERMINAL_UNSAFE`)."""
    return _TERMINAL_UNSAFE.sub(_escaped, encodable(text))


# ----- code: whether code that somebody else's run chose may run here (the consent) ---------------
# Where a run came from.  A run directory this machine's repro500 sealed is the user's own; a
# publication, a packed run and any other run directory (unpacked, extracted, downloaded, copied)
# are somebody else's, and what they chose to run runs only with --run-code.
OWN_RUN, PACKED_RUN, PUBLICATION, FOREIGN_RUN = "run", "bundle", "publication", "foreign run"
FOREIGN = frozenset({PACKED_RUN, PUBLICATION, FOREIGN_RUN})
_WHOSE = {PACKED_RUN: "this packed run", PUBLICATION: "this publication",
          FOREIGN_RUN: "this run directory, which repro500 on this machine did not make (unpacked, extracted, "
                       "downloaded or copied),"}
def consent(run_code: bool, runs: str | None, *, origin: str = PUBLICATION, review: str = "it",
            instead: str | None = None) -> bool:
    """The one decision whether code a publication or a packed run chose may run here.  Every path
    that would run such code asks it first: reproduce's rerun (a wrapped command, plug-ins), the
    environment ``reproduce --env venv`` builds (build backends, ``.pth`` files), locate's replays.

    ``runs`` says what would run, as the rest of a sentence whose subject is the run ("runs its
    own code (plug-in: nets.py)"); None when nothing of the run's own would run.  True: it may run
    (``--run-code`` given, or a run of this machine's own); False: nothing of the run's own would
    run, and the caller starts its child with :data:`CODE_ENV` set to ``refuse`` all the same;
    UsageError (exit 2) naming what would run, ``review`` and ``--run-code`` (and ``instead``, another
    way on) when it would run without consent: nothing has run or been written yet."""
    if runs is None:
        return False
    if run_code or origin not in FOREIGN:
        return True
    other = f", or {instead}" if instead else ""
    raise UsageError(f"{_WHOSE[origin]} {runs}; review {review} and pass --run-code to run it{other}")


def code_refused() -> bool:
    """Whether this process may import code that no installed distribution registered (the child
    side of :func:`consent`: its caller set :data:`CODE_ENV`)."""
    return os.environ.get(CODE_ENV) == "refuse"


def refuse_code(key: str, ref: str) -> InvalidInput:
    return InvalidInput(f"{key}: {plain(ref)!r} would import the publication's own code; review it and "
                        "reproduce with --run-code to run it")


def import_refs(recipe: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, value) of every recipe key that names code to import (``module:callable``), and of
    ``fixed.system.search_paths``: what ``reproduce`` refuses without ``--run-code``."""
    found = []
    for keys in _IMPORT_KEYS:
        value: Any = recipe
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and ":" in value:
            found.append((".".join(keys), value))
    system = (recipe.get("fixed") or {}).get("system") if isinstance(recipe.get("fixed"), dict) else None
    if isinstance(system, dict) and system.get("search_paths"):
        found.append(("fixed.system.search_paths", str(system["search_paths"])))
    return found
