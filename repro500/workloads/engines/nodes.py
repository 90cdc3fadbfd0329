"""How the nodes of a multi-node run talk to each other, outside the ranks' own collectives.

torchrun's rendezvous store lives only as long as one repeat's launch, and the ranks only see
each other once training starts.  Three things need the nodes before that and after it:

- **agreement**: every node states what it is about to run (recipe, options, code and data
  digests); node 0 compares them and every node stops with the same sentence if they differ,
  before the first step;
- **the repeats to run**: node 0 owns the run directory, so on ``--resume`` it alone knows which
  repeats are missing; the other nodes run exactly those;
- **the rank to blame**: when a repeat fails, each node's launcher only knows its own ranks (a
  node whose peer died sees its own ranks fail with a lost connection).  Each node reports how its
  ranks ended; every node names the same culprit, and node 0 keeps every node's whole launcher
  log (sent in chunks of LOG_CHUNK_BYTES, so a long run's log is not one huge store value).

Node 0 hosts a small key-value store (torch's ``TCPStore``) for the whole run, on a port the OS
picks.  The rendezvous port is the only one the nodes are told, and torchrun's own store needs it
during every repeat, so node 0 serves it only until the nodes have agreed: just long enough to
tell every node where the run's store listens.  One port is then enough to name and to keep free.
"""

from __future__ import annotations

import json
import re
import signal
from contextlib import suppress
from datetime import timedelta
from typing import Any

from repro500.errors import InvalidInput, UsageError

STORE_PORT_KEY = "repro500/nodes-store-port"  # what node 0 publishes on the rendezvous port
START_WAIT_S = 600  # nodes are started by hand, one after the other: wait this long for the rest
REPORT_WAIT_S = 30  # after a failure, how long a node waits for the other nodes' reports
LOG_CHUNK_BYTES = 4 * 1024 * 1024  # a node's launcher log travels to node 0 whole, in store values of this size
# A node that cannot run the repeat (it checked itself against what the head planned, or cannot
# read the run) still joins the agreement, stating only this key: every node stops with its
# sentence at once instead of waiting START_WAIT_S for a node that never states its fingerprint.
REFUSED = "refused"
_GONE = (InvalidInput, RuntimeError, OSError)  # the store's server went away or a wait timed out
_LOST_PEER = re.compile(r"connection (closed|reset)|broken pipe|timed out|timeout|socket|peer|gloo|nccl", re.I)


class NodeLink:
    """One node's connection to the others (node 0 serves, the others are clients)."""

    def __init__(self, rendezvous: dict[str, Any]) -> None:
        host, _, port = str(rendezvous["endpoint"]).rpartition(":")
        self.host, self.rendezvous_port = host, int(port)
        self.port: int | None = None  # the run's store, where node 0 serves it
        self.nnodes, self.node_rank = int(rendezvous["nnodes"]), int(rendezvous.get("node_rank", 0))
        self.run_dir: str | None = None  # node 0's run directory, as node 0 names it
        self._store: Any = None
        self._bootstrap: Any = None  # node 0's server on the rendezvous port, until every node found the store

    @property
    def leader(self) -> bool:
        return self.node_rank == 0

    def _connect(self, wait_s: float = START_WAIT_S) -> Any:
        if self._store is None:
            from torch.distributed import TCPStore

            timeout = timedelta(seconds=wait_s)
            rendezvous = f"{self.host}:{self.rendezvous_port}"
            if self.leader:
                try:
                    store = TCPStore(self.host, 0, self.nnodes, True, timeout, wait_for_workers=False)
                except (RuntimeError, OSError) as err:
                    raise InvalidInput(f"node 0 cannot serve the nodes' store for {rendezvous}: "
                                       f"{_first_line(err)}") from None
                try:
                    boot = TCPStore(self.host, self.rendezvous_port, self.nnodes, True, timeout, wait_for_workers=False)
                except (RuntimeError, OSError) as err:
                    raise InvalidInput(_cannot_serve(rendezvous, err)) from None
                boot.set(STORE_PORT_KEY, str(store.port))
                self._store, self._bootstrap, self.port = store, boot, int(store.port)
            else:
                try:
                    boot = TCPStore(self.host, self.rendezvous_port, self.nnodes, False, timeout)
                    self.port = int(boot.get(STORE_PORT_KEY).decode("ascii"))
                    del boot  # node 0 frees the rendezvous port for torchrun once every node has read this
                    self._store = TCPStore(self.host, self.port, self.nnodes, False, timeout)
                except (RuntimeError, OSError, ValueError) as err:
                    where = rendezvous if self.port is None else f"{self.host}:{self.port}, as node 0 published it"
                    raise InvalidInput(f"node {self.node_rank} cannot reach node 0's store at {where} within "
                                       f"{wait_s:.0f} s: {_first_line(err)}; start node 0 with the same "
                                       f"--rdzv-endpoint, and let this node reach its host") from None
        return self._store

    def _release_rendezvous_port(self) -> None:
        """Every node has found the run's store: torchrun's rendezvous needs the port from here on."""
        self._bootstrap = None

    def _get(self, key: str) -> Any:
        return json.loads(self._connect().get(key).decode("utf-8"))

    def _set(self, key: str, value: Any) -> None:
        self._connect().set(key, json.dumps(value))

    def _wait(self, keys: list[str], wait_s: float, what: str) -> None:
        try:
            self._connect().wait(keys, timedelta(seconds=wait_s))
        except (RuntimeError, OSError) as err:
            raise InvalidInput(f"node {self.node_rank} waited {wait_s:.0f} s for {what} and gave up "
                               f"({_first_line(err)})") from None

    # ----- agreement ------------------------------------------------------------------------
    def agree(self, fingerprint: dict[str, str], todo: list[int] | None = None,
              run_dir: str | None = None) -> list[int]:
        """Compare *fingerprint* across the nodes; node 0 gives the repeats to run (*todo*) and
        its run directory.  Returns the repeats to run on every node; raises UsageError with the
        same sentence on every node when they differ."""
        self._set(f"node/{self.node_rank}", fingerprint)
        if self.leader:
            self._set("plan", {"todo": todo or [], "run_dir": run_dir})
            others = [f"node/{r}" for r in range(1, self.nnodes)]
            self._wait(others, START_WAIT_S, f"the other {self.nnodes - 1} node(s) to start")
            self._release_rendezvous_port()  # each wrote its key to the run's store, so each found it
            prints = {0: fingerprint, **{r: self._get(f"node/{r}") for r in range(1, self.nnodes)}}
            problem = disagreement(prints)
            self._set("verdict", problem or "")
            if problem:
                # the store lives in this process: let the others read the verdict before it exits
                with suppress(*_GONE):
                    self._wait([f"read/{r}" for r in range(1, self.nnodes)], REPORT_WAIT_S, "the verdict")
                raise UsageError(problem)
            self.run_dir = run_dir
            return list(todo or [])
        plan = self._get("plan")
        self._wait(["verdict"], START_WAIT_S, "node 0 to compare the nodes")
        problem = self._get("verdict")
        self._set(f"read/{self.node_rank}", True)
        if problem:
            raise UsageError(problem)
        self.run_dir = plan.get("run_dir")
        return [int(k) for k in plan["todo"]]

    # ----- failures -------------------------------------------------------------------------
    def report(self, k: int, ended: dict[str, Any]) -> None:
        """How this node's ranks ended in repeat *k* (see :func:`launcher_report`)."""
        with suppress(*_GONE):  # node 0 is gone: the caller still reports its own ranks
            self._set(f"repeat/{k}/node/{self.node_rank}", {**ended, "node_rank": self.node_rank})

    def send_log(self, k: int, text: str) -> int:
        """This node's whole launcher log of repeat *k*, in chunks; returns how many."""
        data = text.encode("utf-8", "replace")
        chunks = [data[i:i + LOG_CHUNK_BYTES] for i in range(0, len(data), LOG_CHUNK_BYTES)] or [b""]
        with suppress(*_GONE):
            store = self._connect()
            for i, chunk in enumerate(chunks):
                store.set(f"repeat/{k}/node/{self.node_rank}/log/{i}", chunk)
            return len(chunks)
        return 0

    def read_log(self, k: int, node: int, chunks: int) -> str | None:
        """Node *node*'s launcher log of repeat *k* (None when it did not arrive whole)."""
        try:
            store = self._connect()
            parts = [store.get(f"repeat/{k}/node/{node}/log/{i}") for i in range(chunks)]
        except _GONE:
            return None
        return b"".join(parts).decode("utf-8", "replace")

    def reports(self, k: int) -> list[dict[str, Any]]:
        """Every node's report on repeat *k* that arrives within REPORT_WAIT_S."""
        keys = [f"repeat/{k}/node/{r}" for r in range(self.nnodes)]
        try:
            with suppress(*_GONE):
                self._wait(keys, REPORT_WAIT_S, "the other nodes' reports")
            store = self._connect()
            return [json.loads(store.get(key).decode("utf-8")) for key in keys if store.check([key])]
        except _GONE:
            return []


def _cannot_serve(rendezvous: str, err: BaseException) -> str:
    """Node 0 could not listen on the rendezvous port: most often another program holds it."""
    text = _first_line(err)
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return (f"node 0 cannot listen on the rendezvous port of {rendezvous}: another program or run on this "
                f"host holds it; give every node another port in --rdzv-endpoint")
    return f"node 0 cannot listen on the rendezvous port of {rendezvous}: {text}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def disagreement(prints: dict[int, dict[str, str]]) -> str | None:
    """One sentence naming the first keys on which the nodes' fingerprints differ, or None; a node
    that refused to run (its fingerprint is only :data:`REFUSED`, its own sentence) is said first."""
    refusals = [fp[REFUSED] for _, fp in sorted(prints.items()) if fp.get(REFUSED)]
    if refusals:
        return refusals[0]
    keys = sorted({key for fp in prints.values() for key in fp})
    differ = [key for key in keys if len({fp.get(key) for fp in prints.values()}) > 1]
    if not differ:
        return None
    shown = []
    for key in differ[:3]:
        groups: dict[str | None, list[int]] = {}
        for node, fp in sorted(prints.items()):
            groups.setdefault(fp.get(key), []).append(node)
        shown.append(f"{key} is " + " but ".join(
            f"{_short(value)} on node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))}"
            for value, nodes in groups.items()))
    more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
    return (f"the nodes disagree before the first step: {'; '.join(shown)}{more}; start every node with "
            f"the same recipe, --set options, code and data")


def _short(value: str | None) -> str:
    if value is None:
        return "absent"
    return value if len(value) <= 24 else value[:12] + "..."


# ----- what a launcher's output says about how its ranks ended --------------------------------
_FIELD = {
    "time": re.compile(r"^\s*time\s*:\s*(\S+)", re.M),
    "host": re.compile(r"^\s*host\s*:\s*(\S+)", re.M),
    "rank": re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.M),
    "exitcode": re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.M),
    "traceback": re.compile(r"^\s*traceback\s*:\s*(.+)$", re.M),
}


def launcher_report(output: str, returncode: int) -> dict[str, Any]:
    """How a torchrun launch ended, from its "Root Cause" block: the first rank of this node to
    fail, its local rank, pid, exit code or signal, and the launcher's own words."""
    report: dict[str, Any] = {"ok": returncode == 0, "returncode": returncode, "rank": None, "local_rank": None,
                              "pid": None, "exitcode": None, "signal": None, "time": None, "host": None,
                              "detail": ""}
    _, marker, root = output.rpartition("Root Cause")
    if returncode == 0 or not marker:
        return report
    if match := _FIELD["rank"].search(root):
        report["rank"], report["local_rank"] = int(match.group(1)), int(match.group(2))
    if match := _FIELD["exitcode"].search(root):
        code, report["pid"] = int(match.group(1)), int(match.group(2))
        report["exitcode"] = code
        if code < 0:
            report["signal"] = -code
    for name in ("time", "host"):
        if match := _FIELD[name].search(root):
            report[name] = match.group(1)
    if match := _FIELD["traceback"].search(root):
        report["detail"] = match.group(1).strip()
    if report["rank"] is not None and report["signal"] is None and report["detail"] in ("", "<N/A>", _NO_TRACEBACK):
        report["detail"] = rank_error(output, report["rank"]) or ""
    return report


_NO_TRACEBACK = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"


def rank_error(output: str, rank: int) -> str | None:
    """The last line of the exception rank *rank* printed (torchrun prefixes each of a rank's lines
    with ``[rankN]:``), its module path dropped: "InvalidInput: no eval files in ...".  torchrun's
    own report says only "To enable traceback see ..." for a worker without its error handler."""
    prefix = f"[rank{rank}]: "
    found = None
    for line in output.splitlines():
        if not line.startswith(prefix):
            continue
        text = line[len(prefix):]
        if text and not text[0].isspace() and not text.startswith("Traceback (most recent call last)") \
                and re.match(r"^[A-Za-z_][\w.]*: ", text):
            found = text
    if found is None:
        return None
    kind, _, message = found.partition(": ")
    return f"{kind.rsplit('.', 1)[-1]}: {message}"


def blame(reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The report of the rank that failed first, the same on every node: a rank killed by a
    signal before one that lost its connection to a peer, then the earliest, then the lowest node."""
    failed = [r for r in reports if not r.get("ok") and r.get("rank") is not None]
    if not failed:
        return None

    def order(r: dict[str, Any]) -> tuple[int, int, str, int]:
        lost_peer = bool(_LOST_PEER.search(str(r.get("detail") or "")))
        return (0 if r.get("signal") else 1, 1 if lost_peer else 0, str(r.get("time") or ""), int(r["node_rank"]))

    return min(failed, key=order)


def describe(culprit: dict[str, Any]) -> str:
    """"rank 3 (node 1 on host h, local rank 1, pid 1234) was killed by signal 9 (SIGKILL)"."""
    where = [f"node {culprit['node_rank']}" + (f" on host {culprit['host']}" if culprit.get("host") else ""),
             f"local rank {culprit['local_rank']}"]
    if culprit.get("pid"):
        where.append(f"pid {culprit['pid']}")
    if culprit.get("signal"):
        try:
            name = signal.Signals(int(culprit["signal"])).name
        except ValueError:
            name = "unknown signal"
        how = f"was killed by signal {culprit['signal']} ({name})"
    else:
        how = f"exited with code {culprit.get('exitcode')}"
        if culprit.get("detail") and culprit["detail"] != "<N/A>":
            how += f" ({culprit['detail'][:200]})"
    return f"rank {culprit['rank']} ({', '.join(where)}) {how}"


_links: dict[str, NodeLink] = {}


def link(rendezvous: dict[str, Any]) -> NodeLink:
    """This process's link for the run at *rendezvous* (one per process: a node runs one run)."""
    key = f"{rendezvous['endpoint']}#{rendezvous.get('node_rank', 0)}"
    if key not in _links:
        _links[key] = NodeLink(rendezvous)
    return _links[key]
