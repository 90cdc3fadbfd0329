"""A team's MLflow server for real: PostgreSQL (Debian's package, in a data directory and on a port
of its own) and ``mlflow server`` on it, set up by running the commands docs/team.md gives.

Used by tests/test_team_postgres.py and bench/team_postgres.py.  The doc's commands are read from
docs/team.md itself (section 1's ``bash`` blocks) and only its example names are replaced
(:data:`DOC_NAMES`): host names, ports, the artifact directory, the recipe, the password.  So the
commands tested are the commands documented.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers.ports import free_port

ROOT = Path(__file__).resolve().parents[2]  # tests/helpers/ -> the repository
TEAM_DOC = ROOT / "docs" / "team.md"
SERVER_USER = "postgres"  # the account PostgreSQL runs as when the tests run as root (it refuses root)


def pg_bindir() -> Path | None:
    """Where initdb and pg_ctl are: REPRO500_PG_BIN, else Debian's newest /usr/lib/postgresql/<v>/bin,
    else the directory of an initdb on PATH."""
    if os.environ.get("REPRO500_PG_BIN"):
        return Path(os.environ["REPRO500_PG_BIN"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def missing() -> str | None:
    """Why a PostgreSQL server cannot be started here, or None."""
    bindir = pg_bindir()
    if bindir is None or not (bindir / "pg_ctl").is_file():
        return "no PostgreSQL server binaries (Debian: apt-get install postgresql)"
    if shutil.which("createuser") is None and not (bindir / "createuser").is_file():
        return "no createuser (Debian: apt-get install postgresql-client)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} account to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root and there is no runuser to start PostgreSQL as another user"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[test]')"
    return None


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass
class Postgres:
    """One PostgreSQL cluster under a fresh directory: superuser ``postgres`` trusted over its own
    Unix socket only (as Debian's peer authentication lets the postgres account in), password
    (SCRAM) authentication over TCP on 127.0.0.1:port."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="repro500-pg-")))

    def __post_init__(self) -> None:
        # Not under pytest's tmp_path: its directories are 0700 root's, and the server runs as postgres.
        if os.geteuid() == 0:
            shutil.chown(self.root, SERVER_USER, SERVER_USER)
        self.bindir = pg_bindir()
        self.data = self.root / "data"

    def start(self) -> None:
        def run(*cmd: str) -> None:
            done = subprocess.run(_as_server_user([str(self.bindir / cmd[0]), *cmd[1:]]), capture_output=True,
                                  text=True, timeout=120)
            if done.returncode:
                raise RuntimeError(f"{cmd[0]} failed: {(done.stderr or done.stdout)[-1500:]}")

        run("initdb", "-D", str(self.data), "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256",
            "-E", "UTF8", "--locale=C.UTF-8")
        run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        subprocess.run(_as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                                        "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def admin_env(self) -> dict[str, str]:
        """libpq's variables for the superuser on the database machine (createuser, createdb)."""
        return {"PGHOST": str(self.root), "PGPORT": str(self.port), "PGUSER": "postgres"}

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text(errors="replace")[-3000:]
        return ""


def doc_commands(section: str = "## 1.") -> list[str]:
    """The shell commands of one section of docs/team.md, in order: each fenced ``bash`` block's
    lines, continuation lines joined, comments and blank lines dropped."""
    text = TEAM_DOC.read_text(encoding="utf-8")
    start = text.index(section)
    end = text.find("\n## ", start + 1)
    body = text[start:end if end > 0 else None]
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", body, flags=re.DOTALL):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            line = re.sub(r"(^|\s+)#.*$", "", line).strip()  # a comment ("#" starting a word)
            if line:
                commands.append(line)
    return commands


def localise(command: str, names: dict[str, str]) -> str:
    """*command* with docs/team.md's example names replaced by this machine's: in one pass, longest
    name first, so a replacement (a port, a password) is never itself replaced."""
    pattern = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    return re.sub(pattern, lambda m: names[m.group(0)], command)


@dataclass
class TeamServer:
    """PostgreSQL plus ``mlflow server`` on it, started with docs/team.md's server-side commands."""

    work: Path
    password: str = field(default_factory=lambda: "pw-" + secrets.token_hex(12))
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.pg = Postgres()
        self.artifacts = self.work / "artifacts"
        self.home = self.work / "server-home"  # the server account's home: its ~/.pgpass
        self.home.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = self.work / "mlflow-server.log"

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def db_uri(self, password: str | None = None, port: int | None = None) -> str:
        """The database itself, as a client would name it with the password in the URI."""
        return (f"postgresql+psycopg2://mlflow:{password or self.password}@127.0.0.1:"
                f"{port or self.pg.port}/mlflow")

    def names(self) -> dict[str, str]:
        """docs/team.md's example names -> this machine's."""
        return {
            "db.example.org": "127.0.0.1", "5432": str(self.pg.port), "PASSWORD": self.password,
            "/srv/mlflow-artifacts": str(self.artifacts), "0.0.0.0": "127.0.0.1", "5000": str(self.port),
            "https://mlflow.example.org": self.uri, "mlflow.example.org": f"127.0.0.1:{self.port}",
        }

    def start(self, timeout_s: float = 180.0) -> None:
        self.pg.start()
        env = dict(os.environ, HOME=str(self.home), **self.pg.admin_env())
        env.pop("PGPASSWORD", None)  # the server finds the role's password in ~/.pgpass, as documented
        # the server's own Python environment: mlflow and psycopg2 from the interpreter running this
        env["PATH"] = f"{Path(sys.executable).parent}:{self.pg.bindir}:{env.get('PATH', '')}"
        server_side = doc_commands("## 1.")
        server_side = server_side[:next(i for i, c in enumerate(server_side) if c.startswith("export MLFLOW_TRACKING_URI"))]
        for command in server_side:
            command = localise(command, self.names())
            if command.startswith("pip install"):
                continue  # the test environment has these already (pyproject's test extra)
            if command.startswith("mlflow server"):
                with open(self.log_path, "w") as log:  # the child keeps its own copy of the descriptor
                    self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], env=env, text=True, stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True)
                continue
            # createuser --pwprompt reads the password from stdin when there is no terminal (a new session)
            done = subprocess.run(["bash", "-c", command], env=env, input=f"{self.password}\n{self.password}\n",
                                  capture_output=True, text=True, timeout=60, start_new_session=True)
            if done.returncode:
                raise RuntimeError(f"docs/team.md's {command.split()[0]} failed: {done.stderr[-1500:]}\n{self.pg.log()}")
        if self.proc is None:
            raise RuntimeError("docs/team.md section 1 starts no `mlflow server`")
        self._wait_healthy(timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({self.proc.returncode}): {self.server_log()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer /health in {timeout_s:.0f} s: {self.server_log()}")

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # the server's workers share its process group (start_new_session above)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.pg.stop()


@contextlib.contextmanager
def team_server(work: Path) -> Iterator[TeamServer]:
    server = TeamServer(work)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def client_commands() -> list[str]:
    """docs/team.md section 1's commands for every machine that runs benchmarks (after the server's)."""
    commands = doc_commands("## 1.")
    return commands[next(i for i, c in enumerate(commands) if c.startswith("export MLFLOW_TRACKING_URI")):]
