# ruff: noqa: UP031, UP032, SIM105, SIM102 - runs first in any Python a command uses: plain syntax, os and sys only
"""repro500's hook in a wrapped command's Python processes (docs/command.md, "The data a command reads").

Python imports ``sitecustomize`` at start-up from the first ``sys.path`` entry that has one, and
repro500 puts this directory first on the command's ``PYTHONPATH``, so every Python process the
command starts (``python``, ``python -m``, ``torchrun``'s workers, a shell script's ``python``,
DataLoader workers by fork) runs this once, before the user's code, without any change to it:

1. with ``REPRO500_OBSERVE_DIR`` set, an audit hook (PEP 578) appends each distinct file the
   process opens to ``opened-<pid>.txt`` there, one ``r``/``w`` line per path (past 2,000 paths
   read, one ``D`` line per directory instead), after a header naming the interpreter's own
   trees (reads that are never data, byte code and shared libraries, the interpreter's trees,
   site-packages and system trees, are not logged, nor counted); a Python source file opened by the import system, ``runpy`` or ``linecache`` (a
   warning's or a traceback's source line) is code, not data, and gets a ``c`` line (an editable
   install's modules lie outside site-packages); repro500 reads, filters and hashes them after
   the repeat;
2. with ``REPRO500_MLFLOW_READY`` set, ``import mlflow`` waits until that file exists: repro500
   opens (and on first use creates) the tracking store while the command starts, and the two
   must not create or migrate one store at the same time;
3. with ``REPRO500_INTERPRETER_DIR`` set, the first process of each interpreter (its executable
   and prefix) writes ``python-<key>.txt`` there: the executable, version and prefixes, and the
   ``*.dist-info``/``*.egg-info`` directories on its ``sys.path`` in order (listed, not read: repro500
   reads their metadata after the repeat, so the command pays one ``listdir`` per path entry) —
   the environment that actually ran (repro500.capture.interpreters);
4. it then takes its directory off ``sys.path`` and loads the ``sitecustomize`` it shadowed.

Only ``os`` and ``sys`` are used, and every step is guarded: this must never stop the user's
program, whatever Python runs it.  A process started with ``-I`` or ``-E`` ignores
``PYTHONPATH`` and is not observed.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_WAIT_S = 600.0
_PATHS_PER_PROCESS = 2000
_SOURCE_SUFFIXES = (".py", ".pyw", ".pyi")
# Reads repro500 never takes for data (capture/inputs.py drops them too: keep this a subset of its
# rules), left out of the log so that importing a large library (thousands of byte-code files)
# neither fills it nor spends the per-process budget before the script reads its data.
_COMPILED_SUFFIXES = (".pyc", ".so", ".dylib")
_SYSTEM_PREFIXES = ("/proc/", "/sys/", "/dev/", "/usr/", "/lib/", "/lib64/", "/etc/", "/bin/", "/sbin/")
_PACKAGE_DIRS = ("/site-packages/", "/dist-packages/")
# Who opens a source file to run or show it: the import system (frozen), runpy (``python -m``,
# run_path), and tokenize/linecache (a warning's or a traceback's source line, inspect).  The
# caller of ``open`` itself is asked, so a script's own ``open("x.py")`` stays a read.
_CODE_READERS = ("<frozen importlib._bootstrap", os.sep + "linecache.py", os.sep + "tokenize.py",
                 os.sep + "runpy.py")


def _read_as_code():
    try:
        frame = sys._getframe(3)  # _read_as_code <- record <- hook <- the code that opened the file
    except ValueError:  # opened from C with no Python caller (the interpreter reading the main script)
        return False
    name = frame.f_code.co_filename
    return any(name.startswith(reader) or name.endswith(reader) for reader in _CODE_READERS)


def _start_log(state, directory):
    """This process's own log (a forked child's too), headed by its interpreter's trees."""
    pid = os.getpid()
    state["pid"], state["seen"], state["dirs"], state["fd"], state["reads"] = pid, set(), set(), -1, 0
    state["busy"] = True  # os.open below raises the audit event being handled
    try:
        trees = set([sys.prefix, sys.base_prefix, sys.exec_prefix, getattr(sys, "base_exec_prefix", "")])
        state["trees"] = tuple(p.rstrip(os.sep) + os.sep for p in trees if p)
        fd = os.open(os.path.join(directory, "opened-%d.txt" % pid),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
        header = "".join("prefix\t%s\n" % p for p in sorted(trees) if p)
        os.write(fd, ("executable\t%s\n" % sys.executable + header).encode("utf-8", "surrogateescape"))
        state["fd"] = fd
    except OSError:
        pass
    finally:
        state["busy"] = False


def _never_data(path, trees):
    """A read that is never data: byte code, a shared library, a system tree, the interpreter's own."""
    return (path.endswith(_COMPILED_SUFFIXES) or path.startswith(_SYSTEM_PREFIXES)
            or path.startswith(trees) or _PACKAGE_DIRS[0] in path or _PACKAGE_DIRS[1] in path)


def _log_line(state, kind, path, relative=False):
    """The line to log for this open, or None for one already logged (its path, or past the
    per-process budget its directory); a path the command gave relative to its working directory
    gets a third field, ``rel``."""
    key = kind + path
    if key in state["seen"]:
        return None
    if kind == "r" and state["reads"] >= _PATHS_PER_PROCESS:
        # Past this many, a directory once for all the files read in it: DataLoader workers
        # forked anew each epoch would otherwise log a whole data set again every epoch.
        folder = os.path.dirname(path)
        if folder in state["dirs"]:
            return None
        state["dirs"].add(folder)
        return "D\t%s\n" % folder
    state["seen"].add(key)
    state["reads"] += kind == "r"
    return "%s\t%s%s\n" % (kind, path, "\trel" if relative else "")


def _observer(directory):
    state = {"pid": None, "fd": -1, "seen": set(), "dirs": set(), "busy": False, "reads": 0, "trees": ()}

    def record(path, flags):
        if state["busy"] or isinstance(path, int):  # an int: an already-open descriptor
            return
        try:
            path = os.fsdecode(os.fspath(path))
            relative = not os.path.isabs(path)  # the command addressed it from where it ran
            if relative:
                path = os.path.join(os.getcwd(), path)  # now: the script may change directory later
        except (TypeError, OSError):
            return
        if state["pid"] != os.getpid():
            _start_log(state, directory)
        kind = "w" if (flags or 0) & 3 else "r"  # O_ACCMODE: O_RDONLY is 0
        if kind == "r":
            if _never_data(path, state["trees"]):
                return
            # called from here, not from a helper: it counts the frames above it
            if path.endswith(_SOURCE_SUFFIXES) and _read_as_code():
                kind = "c"
        line = _log_line(state, kind, path, relative)
        if line is not None and state["fd"] >= 0:
            try:
                os.write(state["fd"], line.encode("utf-8", "surrogateescape"))
            except OSError:
                pass

    return record


def _waiter(ready):
    state = {"done": False}

    def wait():
        if state["done"]:
            return
        state["done"] = True
        import time

        deadline = time.monotonic() + _WAIT_S
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.02)

    return wait


def _key(text):
    """A stable short name for one interpreter (FNV-1a: ``hash()`` is salted per process)."""
    value = 0xcbf29ce484222325
    for char in text.encode("utf-8", "surrogateescape"):
        value = ((value ^ char) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % value


def _record_interpreter(directory):
    """Once per interpreter: claim its file (O_EXCL: the first process wins, the rest only stat)."""
    executable = sys.executable or ""
    path = os.path.join(directory, "python-%s.txt" % _key(executable + "\0" + sys.prefix))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return
    try:
        lines = ["executable\t%s" % executable,
                 "version\t%s" % sys.version.split()[0],  # what platform.python_version() says
                 "implementation\t%s" % sys.implementation.name,
                 "prefix\t%s" % sys.prefix, "base_prefix\t%s" % getattr(sys, "base_prefix", sys.prefix),
                 "platform\t%s" % sys.platform, "pid\t%d" % os.getpid()]
        for entry in sys.path:
            entry = os.path.abspath(entry or ".")
            if entry == _HERE or not os.path.isdir(entry):
                continue
            lines.append("path\t%s" % entry)
            try:
                names = sorted(os.listdir(entry))
            except OSError:
                continue
            for name in names:
                if name.endswith((".dist-info", ".egg-info")):
                    lines.append("dist\t%s" % os.path.join(entry, name))
        os.write(fd, ("\n".join(lines) + "\nend\n").encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


def _install():
    interpreters = os.environ.get("REPRO500_INTERPRETER_DIR")
    if interpreters and os.path.isdir(interpreters):
        try:
            _record_interpreter(interpreters)
        except Exception:  # noqa: BLE001 - never stop the user's program
            pass
    directory = os.environ.get("REPRO500_OBSERVE_DIR")
    ready = os.environ.get("REPRO500_MLFLOW_READY")
    record = _observer(directory) if directory and os.path.isdir(directory) else None
    wait = _waiter(ready) if ready else None
    if record is None and wait is None:
        return

    def hook(event, args):
        try:
            if event == "open":
                if record is not None and args:
                    record(args[0], args[2] if len(args) > 2 else 0)
            elif event == "import" and wait is not None and args and args[0] == "mlflow":
                wait()
        except Exception:  # noqa: BLE001 - an error here would fail the user's open or import
            pass

    sys.addaudithook(hook)


def _chain():
    """Load the sitecustomize this one shadows (a distribution's or the user's own), if any."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401 - the next one on sys.path
    except Exception as err:  # noqa: BLE001 - reported as Python's own site.py reports it
        if mine is not None:
            sys.modules["sitecustomize"] = mine
        if not (isinstance(err, ImportError) and getattr(err, "name", None) == "sitecustomize"):
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
                             % (type(err).__name__, err))


try:
    if hasattr(sys, "addaudithook"):
        _install()
except Exception:  # noqa: BLE001 - never stop the user's program
    pass
try:
    _chain()
except Exception:  # noqa: BLE001
    pass
