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
* **Names printed** on a terminal: control characters escaped (:func:`shown`), so a metric named
  with an OSC 52 sequence cannot write the clipboard or the window title.
* **Code**: ``reproduce`` without ``--run-code`` starts its rerun with :data:`CODE_ENV` set to
  ``refuse``; then no recipe key may name a ``module:callable`` and no directory of the
  publication is put on ``sys.path`` (:func:`code_refused`; the plug-in door asks it).  Names
  registered by installed distributions stay allowed: they are the reproducer's own software.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from repro500.errors import InvalidInput

if TYPE_CHECKING:
    import yaml

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
CODE_ENV = "REPRO500_FOREIGN_CODE"  # "refuse": no import path, no search path (reproduce without --run-code)

# the recipe keys whose value may name code to import (module:callable), everywhere a recipe has one
_IMPORT_KEYS = (("fixed", "model"), ("fixed", "dataset", "entry"), ("fixed", "dataset", "name"), ("fixed", "evaluate"),
                ("fixed", "system", "model"), ("fixed", "system", "dataset", "entry"),
                ("fixed", "system", "dataset", "name"))


def open_regular(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES) -> BinaryIO:
    """``path`` opened for reading when it is a regular file of at most ``cap`` bytes (``what``
    names it in errors); FileNotFoundError passes through, anything else is InvalidInput."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; checked just below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as err:
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


def read_bytes(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`)."""
    with open_regular(path, what, cap) as handle:
        data = handle.read(cap + 1)
    if len(data) > cap:  # grew while being read
        raise InvalidInput(f"{path} is over the {cap:,}-byte cap for {what}: refused")
    return data


def read_text(path: str | Path, what: str, cap: int = MAX_DOCUMENT_BYTES) -> str:
    try:
        return read_bytes(path, what, cap).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text: {what} is refused") from None


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


def path_depth_ok(parts: tuple[str, ...] | list[str]) -> bool:
    return len(parts) <= MAX_PATH_DEPTH


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(text: Any) -> str:
    """``text`` safe to print: control characters (ESC, BEL, C1 ...) as ``\\xNN`` escapes and
    rich markup brackets escaped, so a name from a run cannot drive the reader's terminal."""
    from rich.markup import escape

    return escape(plain(text))


def plain(text: Any) -> str:
    """``text`` with control characters escaped, and the bytes of a file name that is not UTF-8
    (Python's surrogate escapes) as ``\\xNN`` (for output that is not rich markup)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", encodable(str(text)))


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
_TERMINAL_UNSAFE = re.compile(r"\x1b(?!\[[0-9;?]*[ -/]*[@-~])|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` as the CLI writes it to stdout/stderr (see :data:`_TERMINAL_UNSAFE`)."""
    return _TERMINAL_UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}", encodable(text))


def code_refused() -> bool:
    """Whether this process may import code that no installed distribution registered."""
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
