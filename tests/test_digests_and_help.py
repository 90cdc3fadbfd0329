"""What the help and the printed digests say matches what the commands do: the digest
``verify --expect-sums`` takes is the one ``publish`` labels for it, the exit codes include 130,
and a rebuild's refusal names the part of a wheel's tag that does not fit."""

from __future__ import annotations

import re
import sys

import pytest
from click.testing import CliRunner
from helpers.runs import repro500
from packaging.tags import sys_tags

from repro500.cli import cli
from repro500.errors import InvalidInput
from repro500.publish import rebuild


@pytest.mark.slow
def test_publish_labels_the_digest_expect_sums_takes(in_tmp):
    (in_tmp / "s.py").write_text("print('Acc@1 93.3')\n")
    ran = repro500("run", "--no-tracking", "--run-id", "r", "-n", "2", "--command",
                   "--metric", "accuracy=regex:Acc@1 ([0-9.]+)", "--scale", "accuracy=0.01",
                   "--accept", "accuracy>=0.9±0.05", "--", sys.executable, "s.py", cwd=in_tmp)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    published = repro500("publish", "runs/r", "--out", "pub", cwd=in_tmp)
    assert published.returncode == 0, published.stdout + published.stderr
    digests = dict(re.findall(r"^(run SHA256SUMS|archive|publication SHA256SUMS) sha256: ([0-9a-f]{64})",
                              published.stdout, re.MULTILINE))
    assert set(digests) == {"run SHA256SUMS", "archive", "publication SHA256SUMS"}, published.stdout
    archive = next((in_tmp / "pub").glob("*.tar.gz"))
    assert f"repro500 verify {archive.name} --expect-sums {digests['run SHA256SUMS']}" in published.stdout
    for where in (archive, in_tmp / "pub"):
        ok = repro500("verify", str(where), "--no-write", "--expect-sums", digests["run SHA256SUMS"], cwd=in_tmp)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    other = repro500("verify", str(archive), "--no-write", "--expect-sums", digests["archive"], cwd=in_tmp)
    assert other.returncode == 4 and "not the expected" in " ".join(other.stdout.split()), other.stdout


def test_the_help_says_which_digest_expect_sums_takes_and_every_exit_code():
    runner = CliRunner()
    verify = " ".join(runner.invoke(cli, ["verify", "--help"]).output.split())
    assert "run's own SHA256SUMS" in verify and "not the archive's sha256" in verify
    top = runner.invoke(cli, ["--help"]).output
    assert "130 interrupted" in " ".join(top.split())
    reproduce = " ".join(runner.invoke(cli, ["reproduce", "--help"]).output.split())
    assert "[default: 10]" not in reproduce and "80% power needs against the publication's spread" in reproduce


def test_a_rebuild_in_another_python_names_the_python_tag_not_the_platform():
    here = next(iter(sys_tags())).platform  # a platform this machine installs
    pins = rebuild.Pins("3.11.7", ["numpy==1.26.4"], None, [], [], set(), [], "d",
                        wheel_tags={"numpy": [f"cp311-cp311-{here}"]})
    try:
        rebuild.check_fit(pins, rebuild.target_tags("3.12"))
    except InvalidInput as err:
        assert "numpy (cp311-cp311)" in str(err) and here not in str(err).split(": ", 1)[1]
    else:
        raise AssertionError("cp311 wheels fit a Python 3.12 rebuild")
