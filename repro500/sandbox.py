"""Code a reproducer consented to runs in a sandbox: bubblewrap, granted only what the rerun needs.

The one owner of the sandbox (docs/trust.md, "The sandbox"): what code of somebody else's may
read and write, whether it has the network, and which environment variables reach it.  Every
path that runs a publisher's code with ``--run-code`` (reproduce's rerun, the installs of
``--env venv``, locate's replays) asks :func:`wrap` for the argv prefix and :func:`record` for
what its records say; ``repro500 run --sandbox`` asks the same for one's own code.

bubblewrap (``bwrap``, the sandbox Flatpak runs applications in) needs no daemon and no image:
it builds the sandbox's file system from bind mounts in new namespaces.  repro500 writes no
sandbox of its own (seccomp filters, mount code): bwrap is well kept and audited, and the
grants are what repro500 decides.

Granted: the system's trees read-only (``/usr``, ``/bin``, ``/lib*``, ``/sbin``, ``/etc`` with
its secrets masked, ``/sys``); the interpreter's trees read-only (this Python's prefix and base
prefix, repro500's own package); the paths the caller names read-only (the source snapshot, the
publication, the checked data, ``--sandbox-ro``); the paths it names writable (the rerun's own
directory); a fresh ``/proc`` and ``/dev``, a private empty ``/tmp`` and an empty ``HOME`` in it;
GPUs (``/dev/nvidia*``, ``/dev/dri``, the CUDA tree) when present.  Denied: everything else of
the machine (the reproducer's home, ``~/.ssh``, ``~/.aws``, other projects), the network unless
granted (a network namespace of its own), every environment variable outside :data:`ALLOWED`
and :data:`ALLOWED_PREFIXES` and every secret-named one (:func:`repro500.redact.is_secret_name`),
the terminal (a session of its own: no ``TIOCSTI`` into the reproducer's shell), and processes
outliving the rerun (a PID namespace ending with it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.errors import InvalidInput, UsageError
from repro500.redact import env_value_kept, is_secret_name, redact_url
from repro500.untrusted import shown

PACKAGE = "bubblewrap"
# the bwrap to run (tests point it at a missing one); default: bwrap on PATH
BWRAP_ENV = "REPRO500_BWRAP"
# set for a run started in (or consciously outside) the sandbox: what its manifest records
RECORD_ENV = "REPRO500_SANDBOX"
# where the sandboxed code's HOME is: empty, inside the private /tmp
HOME = "/tmp/home"

# the system's trees, read-only where they exist (a merged-/usr link such as /bin -> usr/bin is
# made as the same link)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
SYSTEM_SHOWN = tuple(p for p in SYSTEM if Path(p).is_dir() and not Path(p).is_symlink())
# what of /etc holds secrets a process of the reproducer's may read: hidden (an empty file or
# directory in its place); the rest of /etc (ld.so.cache, resolv.conf, ssl certificates,
# alternatives, passwd) is what programs need
MASKED = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
          "/etc/ssh", "/etc/ssl/private", "/etc/munge", "/etc/krb5.keytab", "/etc/security/opasswd",
          "/etc/machine-id", "/etc/.pwd.lock")
# variables naming the certificate authorities a TLS client trusts: passed, and their files readable
CA_FILES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NIX_SSL_CERT_FILE",
            "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS")
# the environment that reaches the sandboxed code: these names, names with these prefixes and those
# whose values a manifest records (redact.env_value_kept), unless secret-named or holding a URL with
# credentials
ALLOWED = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES",
    "PYTHONPATH", "PYTHONSAFEPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
    "PYTHONWARNINGS", "PYTHONIOENCODING", "VIRTUAL_ENV", "PYENV_ROOT", "PYENV_VERSION",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_HOME", "CUDA_PATH",
    "LD_LIBRARY_PATH", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "DVC_NO_ANALYTICS", "SOURCE_DATE_EPOCH",
    # the network, where granted, as the reproducer reaches it: its proxies and certificate authorities
    *CA_FILES, "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "all_proxy",
})
ALLOWED_PREFIXES = ("REPRO500_", "LC_", "MLFLOW_", "UV_", "PIP_")
# allowed by prefix, still kept out: a key file the publisher's code must not sign with
DENIED = frozenset({"REPRO500_SIGNING_KEY"})


@dataclass(frozen=True)
class Grants:
    """What sandboxed code may use besides the system and the interpreter (read-only)."""

    read: tuple[Path, ...] = ()  # read-only: the source snapshot, the publication, the checked data
    write: tuple[Path, ...] = ()  # writable: the rerun's own directory
    network: bool = False
    extra: tuple[Path, ...] = ()  # read-only, named by the reproducer (--sandbox-ro)
    # variables set inside besides the allowed ones of the environment given to wrap()
    setenv: Mapping[str, str] = field(default_factory=dict)
    # (path, copy): the path looks writable inside, but what is written lands in the copy, a throwaway
    # made by the caller; the original is never written.  A build backend that writes beside the
    # sources it builds (setuptools' egg-info) builds a read-only tree this way; bubblewrap 0.8, the
    # Debian release, has no overlay mounts.
    scratch: tuple[tuple[Path, Path], ...] = ()

    def widened(self, *, read: Iterable[Path] = (), write: Iterable[Path] = (), network: bool | None = None,
                setenv: Mapping[str, str] | None = None) -> Grants:
        return Grants(read=(*self.read, *read), write=(*self.write, *write),
                      network=self.network if network is None else network, extra=self.extra,
                      setenv={**self.setenv, **(setenv or {})}, scratch=self.scratch)


@dataclass(frozen=True)
class Choice:
    """The sandbox options, checked: ``confined`` False when the code runs as it is (no ``--run-code``, or
    ``--no-sandbox``, then named in ``consent``)."""

    confined: bool
    network: bool = False
    extra: tuple[Path, ...] = ()
    consent: str | None = None  # "--no-sandbox" when the reproducer chose to run unconfined

    def record(self, grants: Grants | None, environ: Mapping[str, str]) -> dict[str, Any]:
        return record(grants if self.confined else None, environ, consent=self.consent)


def choose(run_code: bool, no_sandbox: bool, network: bool, read_only: Iterable[str | Path]) -> Choice:
    """The options checked, and bwrap asked whether it can sandbox here, before anything is written:
    UsageError for an option that needs another; InvalidInput (exit 4) naming the package to install
    when code would run and cannot be confined, unless ``--no-sandbox``."""
    extra = tuple(Path(p) for p in read_only)
    if not run_code:
        given = [flag for flag, on in (("--no-sandbox", no_sandbox), ("--network", network),
                                       ("--sandbox-ro", bool(extra))) if on]
        if given:
            raise UsageError(f"{given[0]} sets the sandbox of the code a publication or a packed run chose, which "
                             "runs only with --run-code: pass --run-code too, or leave it out")
        return Choice(confined=False)
    if no_sandbox:
        if network or extra:
            raise UsageError(f"{'--network' if network else '--sandbox-ro'} widens the sandbox, and --no-sandbox "
                             "runs the code without one: choose one of them")
        return Choice(confined=False, consent="--no-sandbox")
    check_extra(extra)
    why = unavailable()
    if why is not None:
        raise InvalidInput(why)
    return Choice(confined=True, network=network, extra=tuple(p.absolute() for p in extra))


def check_extra(extra: Iterable[Path]) -> None:
    """Each ``--sandbox-ro`` path exists (a grant of nothing is a typo)."""
    for path in extra:
        if not os.path.lexists(path):
            raise UsageError(f"--sandbox-ro {shown(path)} does not exist: name a file or directory to "
                             "grant the code read access to")


def bwrap() -> str | None:
    """The bwrap executable, or None when it is not here."""
    named = os.environ.get(BWRAP_ENV)
    if named:
        return named if os.access(named, os.X_OK) and Path(named).is_file() else None
    return shutil.which("bwrap")


@functools.cache
def _probe(exe: str) -> str | None:
    """Why *exe* cannot make a sandbox here (user namespaces off, seccomp, an old bwrap), or None:
    asked by running it once with the namespaces a rerun gets, the answer kept for the process."""
    try:
        done = subprocess.run([exe, "--ro-bind", "/", "/", "--unshare-all", "--unshare-pid", "--die-with-parent",
                               "--new-session", "--", "true"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit {done.returncode}")


def unavailable(asked: str = "running a publication's code with --run-code confines it in bubblewrap",
                otherwise: str = "pass --no-sandbox to run it unconfined with your user's rights") -> str | None:
    """One sentence naming why code cannot be sandboxed here and what to install, or None; *asked*:
    what needed the sandbox, *otherwise*: the way on without it."""
    exe = bwrap()
    if exe is None:
        return (f"{asked}, and bwrap is not installed here: install the {PACKAGE} package (apt-get install "
                f"{PACKAGE}, dnf install {PACKAGE}), or {otherwise}")
    why = _probe(exe)
    if why is None:
        return None
    return (f"{asked}, and {exe} cannot make a sandbox here ({why[:200]}; unprivileged user namespaces may be "
            f"disabled: sysctl kernel.unprivileged_userns_clone=1, or install the setuid {PACKAGE} package): "
            f"enable them, or {otherwise}")


def interpreter_trees() -> list[Path]:
    """What this Python needs to start and import repro500: its prefixes (a venv and the Python
    it was made from, which may lie in the reproducer's home: pyenv, uv) and repro500's package
    (an editable install lies in its checkout)."""
    found = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix),
             Path(sys.executable).resolve().parent.parent, Path(__file__).resolve().parent]
    return _unique(p for p in found if p.exists())


def programs(environ: Mapping[str, str]) -> tuple[list[Path], dict[str, str]]:
    """(trees, variables) that let code run what it names on its ``PATH`` as it would outside: every
    directory on ``PATH`` (programs, not the rest of a home they may lie in), the tree of the Python
    each ``python`` there is (a venv's links lead to it), and the pyenv whose shims are on ``PATH``
    (with ``PYENV_ROOT``: its default lies in the reproducer's HOME, which the code does not get)."""
    folders = [Path(p) for p in environ.get("PATH", "").split(os.pathsep) if p.startswith("/") and Path(p).is_dir()]
    # those under the system's trees are there already
    trees, variables = [f for f in folders if not any(f.is_relative_to(top) for top in SYSTEM)], {}
    for folder in folders:
        if folder.name == "shims" and (folder.parent / "libexec").is_dir() and (folder.parent / "versions").is_dir():
            trees.append(folder.parent)
            variables["PYENV_ROOT"] = str(folder.parent)
    for name in ("python", "python3"):
        found = shutil.which(name, path=os.pathsep.join(map(str, folders)))
        prefix = Path(found).resolve().parent.parent if found else None
        if prefix is not None and (prefix / "lib").is_dir():
            trees.append(prefix)
    return _unique(trees), variables


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of *environ* that reach sandboxed code (:data:`ALLOWED`): none secret-named,
    no URL holding credentials."""
    kept = {}
    for name, value in environ.items():
        if name in DENIED or is_secret_name(name):
            continue
        # the variables whose values a manifest records (they choose kernels: OMP_*, MKL_*, NCCL_*, TORCH_*,
        # CUDA_*, ...) pass too, so a confined rerun runs and records the environment an unconfined one does
        if name in ALLOWED or name.startswith(ALLOWED_PREFIXES) or env_value_kept(name):
            if "://" in value and redact_url(value) != value:
                continue  # a tracking or index URL with a password in it
            kept[name] = value
    return kept


def _unique(paths: Iterable[Path]) -> list[Path]:
    seen: dict[str, Path] = {}
    for path in paths:
        seen.setdefault(str(path), path)
    return list(seen.values())


def _system() -> list[str]:
    args = []
    for top in SYSTEM:
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    for secret in MASKED:
        path = Path(secret)
        if path.is_symlink() or not path.exists():
            continue
        args += ["--tmpfs", secret, "--remount-ro", secret] if path.is_dir() else ["--ro-bind", "/dev/null", secret]
    return args


def gpu_paths() -> tuple[list[str], list[str]]:
    """(devices, read-only trees) of the GPUs here: /dev/nvidia*, /dev/dri, the CUDA tree."""
    devices = sorted(str(p) for p in Path("/dev").glob("nvidia*")) + (["/dev/dri"] if Path("/dev/dri").exists() else [])
    trees = []
    if devices:
        for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/opt/cuda", "/run/nvidia-persistenced"):
            if candidate and Path(candidate).exists():
                trees.append(str(Path(candidate).resolve()))
    return devices, trees


def _resolver(network: bool) -> list[str]:
    """The directory /etc/resolv.conf links to (systemd-resolved's /run/...), for DNS with the network."""
    conf = Path("/etc/resolv.conf")
    if not network or not conf.is_symlink():
        return []
    target = conf.resolve().parent
    return ["--ro-bind", str(target), str(target)] if target.is_dir() and not str(target).startswith("/etc") else []


def _binds(grants: Grants) -> list[str]:
    """The granted paths, parents before children (a read-only source inside the writable rerun
    tree stays read-only), a path given twice taking its narrower grant.  A granted link is granted
    as the file or directory it leads to, at that place, and made as the same link where no other
    grant holds it (inside one, it is there already)."""
    wanted = [(p, False, None) for p in interpreter_trees()]
    wanted += [(Path(p), False, None) for p in (*grants.read, *grants.extra)]
    wanted += [(Path(p), True, None) for p in grants.write]
    wanted += [(Path(at), True, Path(copy)) for at, copy in grants.scratch]
    binds, links = {}, []
    for path, writable, copy in wanted:
        absolute = Path(os.path.abspath(path))
        if not absolute.exists():
            continue
        real = absolute.resolve()
        if real != absolute:
            links.append(absolute)
        # a scratch copy is mounted last at its depth: it stands in for the path whatever else grants it
        key = (len(real.parts), 0 if copy is None and writable else 1 if copy is None else 2, str(real))
        binds[key] = (writable, os.path.abspath(copy) if copy is not None else str(real))
    args = []
    for (_, _, path), (writable, source) in sorted(binds.items()):
        args += ["--bind" if writable else "--ro-bind", source, path]
    held = [Path(path) for _, _, path in binds]
    for link in links:
        if not any(link.is_relative_to(h) for h in held) and not any(link.is_relative_to(t) for t in SYSTEM):
            args += ["--symlink", str(link.resolve()), str(link)]
    return args


def effective(grants: Grants, environ: Mapping[str, str]) -> Grants:
    """*grants* with what running programs needs of *environ*: the trees of the programs on its
    ``PATH`` (:func:`programs`) and, with the network, the certificate authorities it names."""
    cas = [Path(environ[name]) for name in CA_FILES if environ.get(name, "").startswith("/")] if grants.network else []
    trees, variables = programs(environment(environ))
    return grants.widened(read=[*trees, *cas], setenv=variables)


def wrap(grants: Grants, environ: Mapping[str, str], cwd: Path | str | None = None) -> list[str]:
    """The argv prefix that runs a command inside bubblewrap with *grants* (the command follows it);
    *environ*: the environment the command would have had, of which only :func:`environment`
    passes; *cwd*: where it starts (one of the granted paths)."""
    exe = bwrap() or "bwrap"
    devices, gpu_trees = gpu_paths()
    args = [exe, "--unshare-all", "--unshare-pid", *(["--share-net"] if grants.network else []),
            "--die-with-parent", "--new-session", *_system(), "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--dir", HOME]
    for device in devices:
        args += ["--dev-bind", device, device]
    for tree in gpu_trees:
        args += ["--ro-bind", tree, tree]
    grants = effective(grants, environ)
    args += _resolver(grants.network) + _binds(grants)
    args += ["--clearenv", "--setenv", "HOME", HOME, "--setenv", "TMPDIR", "/tmp"]
    # what the caller sets itself passes unless secret-named (a replay's recorded thread settings)
    setenv = {name: value for name, value in grants.setenv.items() if not is_secret_name(name)}
    for name, value in sorted({**environment(environ), **setenv}.items()):
        args += ["--setenv", name, value]
    if cwd is not None:
        args += ["--chdir", os.path.abspath(cwd)]
    return [*args, "--"]


def record(grants: Grants | None, environ: Mapping[str, str], *, consent: str | None = None) -> dict[str, Any]:
    """What the run's manifest records of its confinement (the ``sandbox`` facet): sandboxed or
    not, and with which grants."""
    if grants is None:
        return {"sandboxed": False, **({"consent": consent} if consent else {})}
    devices, gpu_trees = gpu_paths()
    grants = effective(grants, environ)
    return {"sandboxed": True, "tool": PACKAGE, "network": grants.network,
            "read_only": sorted({*SYSTEM_SHOWN, *(str(p) for p in interpreter_trees()), *gpu_trees,
                                 *(os.path.abspath(p) for p in (*grants.read, *grants.extra) if os.path.lexists(p))}),
            "writable": sorted(os.path.abspath(p) for p in grants.write) + ["/tmp (private, empty)"]
            + [f"{os.path.abspath(at)} (writes go to a throwaway copy)" for at, _ in grants.scratch],
            "home": f"{HOME} (empty)", "devices": devices,
            "environment": sorted({*environment(environ), *(n for n in grants.setenv if not is_secret_name(n)),
                                   "HOME", "TMPDIR"})}


def encoded(entry: Mapping[str, Any]) -> str:
    """*entry* (:func:`record`) as the value of :data:`RECORD_ENV` the run reads back."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def recorded(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What :data:`RECORD_ENV` says of this run's confinement; a run started without it was not
    sandboxed (one's own ``repro500 run``)."""
    text = (environ if environ is not None else os.environ).get(RECORD_ENV)
    if not text:
        return {"sandboxed": False}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {"sandboxed": False, "note": f"{RECORD_ENV} could not be read"}
    return value if isinstance(value, dict) else {"sandboxed": False}


def plan_line(grants: Grants | None, labels: Mapping[str, str] | None = None) -> str:
    """The plan line: what the code may read and write and whether it has the network.  *labels*
    name the granted paths for the reader (``OUT/source``: "the source snapshot")."""
    if grants is None:
        return ("sandbox: none (--no-sandbox): the publication's code runs with your user's rights: your files, "
                "your environment, the network")
    labels = labels or {}

    def named(paths: Iterable[Path]) -> str:
        shown = _unique(Path(os.path.abspath(p)) for p in paths if os.path.lexists(p))
        return ", ".join(labels.get(str(p), str(p)) for p in shown) or "nothing more"

    net = "with the network (--network)" if grants.network else "no network (--network grants it)"
    extra = f"; also read-only: {named(grants.extra)} (--sandbox-ro)" if grants.extra else ""
    return (f"sandbox: bubblewrap; the code may read the system, its interpreter and {named(grants.read)}"
            f"{extra}; write only {named(grants.write)} and a private /tmp; an empty HOME; {net}; the environment "
            "cleared to a documented list (docs/trust.md)")


def pass_signal(pid: int, signum: int) -> None:
    """Pass *signum* to the code a ``wrap``-ped process *pid* (bwrap) runs: bwrap's init inside holds
    the sandbox's session and process group (``--new-session``), so the group gets it as a
    process group of its own would (Ctrl-C reaches a rerun once, which closes its records), not
    bwrap, whose end would kill it at once.  SIGKILL, or a sandbox not yet started, goes to *pid*'s
    group (bwrap's end takes everything in the sandbox with it)."""
    import signal

    inner = None
    if signum != signal.SIGKILL:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii").split()
            inner = int(children[0]) if children else None
        except (OSError, ValueError):
            inner = None
    try:
        os.killpg(inner if inner is not None else pid, signum)
    except ProcessLookupError:
        if inner is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signum)


def wait_passing_signals(proc: subprocess.Popen[bytes], sandboxed: bool = False) -> int:
    """The rerun's exit status.  It runs in a process group of its own, so Ctrl-C (or SIGTERM) here
    reaches it once, passed on by this process, and is waited for: the rerun keeps its finished
    repeats and closes its run.json before it exits 130 (a third Ctrl-C kills it)."""
    import signal
    import threading

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupt) if main else None
    passed = 0
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                passed += 1
                with contextlib.suppress(ProcessLookupError):
                    if sandboxed:  # to the rerun inside, not to bwrap, whose end would kill it at once
                        pass_signal(proc.pid, signal.SIGKILL if passed > 2 else signal.SIGINT)
                    else:
                        os.killpg(proc.pid, signal.SIGKILL if passed > 2 else signal.SIGINT)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
