"""Running the installer into the new venv ``OUT/env``: every pin resolved against its index
without installing (``--dry-run``: a distribution no index serves is named in one sentence, exit 4,
with ``--env current`` and ``--find-links DIR`` as the two ways on), then the pins installed
(``--no-deps``: the lock is the whole closure), the experiment's own package from ``OUT/source``,
and — for a built-in recipe, which runs inside repro500 — the repro500 running now."""

from __future__ import annotations

import json
import re
import shutil
import sys
from importlib import metadata
from pathlib import Path

from repro500.capture.env import DIRECT_URL
from repro500.errors import InvalidInput
from repro500.publish.rebuild.installer import installer, uv_binary
from repro500.publish.rebuild.lock import Pins
from repro500.publish.rebuild.serving import Serving
from repro500.publish.rebuild.sizing import Download
from repro500.publish.rebuild.watch import Watch
from repro500.redact import redact_url

# beside OUT/env: the installs' own download cache, the wheel of the repro500 running now, and the
# sandboxed installs' scratch copy of the source snapshot
CACHE_DIR = "env-cache"
_MISSING = re.compile(r"(?:No matching distribution found for|Because|because)\s+([A-Za-z0-9._-]+)\s*(?:==|was not found)")
_HASH_MISMATCH = re.compile(r"do not match the hashes|hash mismatch", re.IGNORECASE)


def tool_requirement() -> tuple[list[str], str]:
    """How to install the repro500 running now: from its directory when installed from one (an
    editable checkout), else its release from the index."""
    # run from a source checkout (python -m repro500.cli), the checkout's own repro500.egg-info comes
    # first on sys.path and has no install record: the installed one, which says where it came from, wins
    found = list(metadata.distributions(name="repro500"))
    dist = next((d for d in found if d.read_text(DIRECT_URL)), found[0] if found else metadata.distribution("repro500"))
    try:
        info = json.loads(dist.read_text(DIRECT_URL) or "{}")
    except json.JSONDecodeError:
        info = {}
    url = str(info.get("url") or "")
    if url.startswith("file://") and "dir_info" in info:
        from urllib.parse import unquote, urlparse

        folder = unquote(urlparse(url).path)
        return (["-e", folder] if (info.get("dir_info") or {}).get("editable") else [folder]), f"repro500 from {folder}"
    return [f"repro500=={dist.version}"], f"repro500 {dist.version}"


def _mismatch_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = next((line for line in lines if "==" in line or "Hash mismatch" in line), lines[-1] if lines else "")
    return named[:300]


def _missing(stderr: str) -> str | None:
    found = _MISSING.search(stderr)
    return found.group(1) if found else None


def install_pins(base: list[str], pins: Pins, env: Path, served: Serving, download: Download, watch: Watch) -> None:
    """The pinned releases into *env*: first checked with ``--dry-run`` (a pin no index serves, or a
    file that no longer matches its recorded hash, leaves nothing behind), then installed."""
    req = env / "requirements.repro500.txt"
    hashed = pins.hashed_requirements()
    req.write_text("\n".join(hashed or pins.requirements) + "\n", encoding="utf-8")
    tool, count = installer(), len(pins.requirements)
    checked = watch.run([*base, "--dry-run", "-r", str(req)], tool=tool, total=count,
                        doing=f"checking that the indexes serve all {count} pinned distributions ({tool} --dry-run)",
                        done="every pin is served", waiting="checking that the indexes serve every pin")
    if checked.returncode != 0:
        shutil.rmtree(env, ignore_errors=True)
        if _HASH_MISMATCH.search(checked.stderr):
            raise InvalidInput(f"a file the index serves now does not match the hashes recorded when the "
                               f"publication was made ({installer()}: {_mismatch_line(checked.stderr)}): it "
                               "changed since; reproduce with --env current (nothing was installed)")
        name = _missing(checked.stderr) or "a locked distribution"
        asked = ", ".join(redact_url(u) for u in served.asked())
        lock = (f", or name the lock's index with --index {redact_url(served.unused[0])}"
                f"{' (or another it names)' if len(served.unused) > 1 else ''}" if served.unused else "")
        raise InvalidInput(f"{name} (pinned by the publication's lock) is served by no index reachable here "
                           f"({asked}): reproduce with --env current, or provide it with --find-links DIR{lock} "
                           f"(nothing was installed)")
    indexes = ", ".join(redact_url(u) for u in served.asked()) or "no index"
    done = watch.run([*base, "-r", str(req)], tool=tool, total=count, done=f"installed {count} distributions",
                     doing=f"installing {count} distributions with {tool} from {indexes} ({download.brief()})",
                     waiting="installing")
    if done.returncode != 0 and _HASH_MISMATCH.search(done.stderr):
        raise InvalidInput(f"a file the index serves now does not match the hashes recorded when the publication "
                           f"was made ({installer()}: {_mismatch_line(done.stderr)}): it changed since; "
                           f"{env} is left unfinished and will be rebuilt next time; or reproduce with --env current")
    if done.returncode != 0:
        raise InvalidInput(f"installing the locked environment failed ({installer()}: "
                           f"{done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else 'no message'}); "
                           f"{env} is left unfinished and will be rebuilt next time; or reproduce with --env current")


def install_own(base: list[str], pins: Pins, watch: Watch) -> None:
    """The experiment's own packages, from the publication's ``source/`` (editable if they were)."""
    for name, folder in pins.own:
        args = ["-e", str(folder)] if name in pins.editable else [str(folder)]
        done = watch.run([*base, *args], tool=installer(), done=f"installed {name}", waiting=f"installing {name}",
                         doing=f"installing the experiment's own {name} from {folder}")
        if done.returncode != 0:
            raise InvalidInput(f"installing the experiment's own package {name} from {folder} failed: "
                               f"{done.stderr.strip()[-300:]}")


def install_tool(base: list[str], tool: tuple[list[str], str], env: Path, watch: Watch) -> None:
    """The repro500 running now (*tool*: :func:`tool_requirement`), for a built-in recipe, which runs
    inside repro500."""
    args, label = tool
    done = watch.run([*base, *args], tool=installer(), doing=f"installing {label}", done=f"installed {label}",
                     waiting=f"installing {label}")
    if done.returncode != 0:
        raise InvalidInput(f"installing {label} into {env} failed: {done.stderr.strip()[-300:]}")


def tool_wheel(tool: tuple[list[str], str], out: Path, watch: Watch) -> tuple[list[str], str]:
    """*tool* (:func:`tool_requirement`) as a wheel built in *out*, when it is a checkout's folder.
    The installs run in the sandbox, where the checkout is read-only, and its build backend
    (setuptools) writes beside the sources it builds; the checkout is the reproducer's own code, so
    its wheel is built here, outside, and the sandboxed install takes the wheel."""
    args, label = tool
    folder = next((a for a in args if a.startswith("/")), None)
    if folder is None:  # a release from the index: nothing is built here
        return tool
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = ([uv_binary() or "uv", "build", "--wheel", "--quiet", "--python", sys.executable, "--out-dir", str(out), folder]
           if installer() == "uv" else
           [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(out), folder])
    done = watch.run(cmd, tool=installer(), doing=f"building the wheel of {label}", done=f"built {label}",
                     waiting=f"building {label}")
    wheels = sorted(out.glob("repro500-*.whl"))
    if done.returncode != 0 or not wheels:
        raise InvalidInput(f"building the wheel of {label} failed: {done.stderr.strip()[-300:] or 'no wheel made'}")
    return [str(wheels[0])], label
