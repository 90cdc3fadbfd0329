"""Cost of trust: chaining + signing a quickstart-sized run, and what `verify --trust` adds.

Targets: signing and chaining <= 1 % of `repro500 run` on the quickstart (~60 s,
docs/run.md), and <= 0.2 s added to `repro500 verify`.

The run directory is the fabricated one every verify test uses (tests/test_verify_rundir.py:
3 repeats, a valid manifest), padded to the sizes of a real quickstart run (a 32 KB manifest,
75 KB of metrics.jsonl a repeat); ``--run DIR`` measures a copy of a real run instead.

* chain: ``chain.start`` + one ``chain.append`` per repeat, in process;
* sign: a fresh process importing repro500.verify.vouching, loading the key and calling ``sign_run``
  (the whole cost a run pays at its end, imports included);
* verify: ``repro500 verify RUN --no-write`` with and without ``--trust``, fresh processes,
  interleaved rounds, medians; the in-process cost of the trust checks alone is printed too,
  since the two process times differ by less than their own noise on a loaded machine.

Run: ``python bench/attest.py [--rounds N] [--run DIR]``; exits 0 when both targets hold.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from repro500.attest import chain  # noqa: E402
from repro500.attest.attestation import ATTESTATION_NAMES  # noqa: E402
from repro500.rundir import sums as bundle  # noqa: E402

QUICKSTART_RUN_S = 60.0
SIGN_SHARE_TARGET = 0.01
VERIFY_ADDED_TARGET_S = 0.2
ENV = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DVC_NO_ANALYTICS="1")


def fabricate(parent: Path) -> Path:
    from helpers.rundirs import make_manifest, make_run

    packages = {f"package-{i:03d}": f"{i}.{i % 7}.{i % 3}" for i in range(900)}  # ~32 KB, as pip freeze
    root = make_run(parent, "quickstart", epochs=5, manifest=make_manifest(
        environment={"python": "3.11.7", "packages": packages}))
    for k in range(3):
        path = bundle.repeat_dir(root, k) / "metrics.jsonl"
        step = {"kind": "step", "repeat": k, "epoch": 5, "step": 0, "loss": 0.0123456789, "lr": 0.001234,
                "samples": 64, "time_data_s": 0.0075, "time_forward_s": 1.1267, "time_backward_s": 0.8089,
                "time_optimizer_s": 0.0163, "step_time_s": 1.9597, "time_comm_s": None, "bytes_sent": None,
                "bytes_received": None, "peak_memory_bytes": 1413644288, "wall_s": 1.9599}
        extra = "".join(json.dumps({**step, "step": 1000 + i}) + "\n" for i in range(128))
        path.write_text(path.read_text() + extra)
    bundle.write_sums(root)
    return root


def _time_s(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=ENV, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--run", type=Path, default=None, help="a real run directory (measured on a copy)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="repro500-attest-bench-") as tmp:
        tmp = Path(tmp)
        if args.run is not None:
            root = tmp / args.run.name
            shutil.copytree(args.run, root, symlinks=True)
            for name in (chain.CHAIN_NAME, *ATTESTATION_NAMES):
                (root / name).unlink(missing_ok=True)
        else:
            root = fabricate(tmp)
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        files = len(bundle.read_sums(root))
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "key")], check=True)
        trust = tmp / "allowed_signers"
        trust.write_text("bench@example.org " + " ".join((tmp / "key.pub").read_text().split()[:2]) + "\n")

        run = json.loads((root / "run.json").read_text())
        planned = int(run["repeats"])
        start = time.perf_counter()
        chain.start(root, json.loads((root / "manifest.json").read_text())["digest"]["value"], planned)
        links = 0
        for k in range(planned):
            summary = bundle.repeat_dir(root, k) / "summary.json"
            if summary.is_file():
                chain.append(root, k, summary)
                links += 1
        chain_s = time.perf_counter() - start
        bundle.write_sums(root)

        prelude = ("import sys, time; t = time.perf_counter(); from repro500.verify.vouching import sign_run; ")
        sign_cmd = [sys.executable, "-c", prelude + f"sign_run({str(root)!r}, {str(tmp / 'key')!r}, force=True); "
                    "print(time.perf_counter() - t)"]
        sign_times = [float(subprocess.run(sign_cmd, env=ENV, capture_output=True, text=True, check=True).stdout)
                      for _ in range(args.rounds)]
        sign_s = statistics.median(sign_times)

        from repro500.attest.check import check_run

        check_run(root, trust=trust)  # imports
        in_process = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            result = check_run(root, trust=trust)
            in_process.append(time.perf_counter() - start)
        assert result.ok, result.problems
        def verify_cmd(*extra: str) -> list[str]:
            argv = ["repro500", "verify", str(root), "--no-write", *extra]
            return [sys.executable, "-c", f"import sys; from repro500.cli import main; sys.argv = {argv!r}; main()"]

        # both must reach the same verdict, or they did different work
        codes = {subprocess.run(cmd, env=ENV, capture_output=True).returncode
                 for cmd in (verify_cmd(), verify_cmd("--trust", str(trust)))}
        assert len(codes) == 1, f"verify and verify --trust disagree: exit codes {codes}"
        plain, trusted = [], []
        for _ in range(args.rounds):  # interleaved, so load changes hit both alike
            plain.append(_time_s(verify_cmd()))
            trusted.append(_time_s(verify_cmd("--trust", str(trust))))
        added_s = statistics.median(trusted) - statistics.median(plain)

    share = (chain_s + sign_s) / QUICKSTART_RUN_S
    load = os.getloadavg()[0]
    print(f"run directory: {files} files, {size / 1024:.0f} KiB ({'copy of ' + str(args.run) if args.run else 'fabricated, quickstart-sized'}); "
          f"load average {load:.1f}, {args.rounds} rounds, medians")
    print(f"chain (start + {links} links)          {chain_s * 1000:8.1f} ms")
    print(f"sign (fresh process: imports, key, sign) {sign_s * 1000:8.1f} ms")
    print(f"  share of a {QUICKSTART_RUN_S:.0f} s quickstart run       {share * 100:8.2f} %   target <= {SIGN_SHARE_TARGET * 100:.0f} %  "
          f"{'OK' if share <= SIGN_SHARE_TARGET else 'MISSED'}")
    print(f"verify, plain                            {statistics.median(plain) * 1000:8.1f} ms")
    print(f"verify --trust                           {statistics.median(trusted) * 1000:8.1f} ms")
    print(f"  added by --trust (process medians)     {added_s * 1000:8.1f} ms   target <= {VERIFY_ADDED_TARGET_S * 1000:.0f} ms  "
          f"{'OK' if added_s <= VERIFY_ADDED_TARGET_S else 'MISSED'}")
    print(f"  trust checks in process (warm)         {statistics.median(in_process) * 1000:8.1f} ms")
    return 0 if share <= SIGN_SHARE_TARGET and added_s <= VERIFY_ADDED_TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
