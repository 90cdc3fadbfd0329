# The README's quickstart is exactly `make demo` and `make test`; both work on a fresh machine:
# they create .venv if absent and install the package with its dependencies first.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
R      := $(VENV)/bin/repro500
STAMP  := $(VENV)/.repro500-installed
export DVC_NO_ANALYTICS := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
# The tests and the demo start hundreds of Python processes that import repro500: where the
# environment sets PYTHONDONTWRITEBYTECODE (some images do), each recompiled the package's sources
# (1.2-1.5 s more per process here), so the bytecode cache is written as Python normally does.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install demo test fuzz test-slow test-heavy test-online test-horovod install-horovod ops lint bench clean

# The install: uv where it is on PATH, else bootstrapped into the new venv with pip (it is a test
# dependency anyway); pip where uv cannot be had or fails. REPRO500_INSTALLER=pip forces pip.
# uv reads no pip.conf, so PIP_TO_UV hands it what pip is configured with (`pip config list`: the
# environment over [install] over [global]): the index, extra indexes with pip's way of choosing
# among them (the best version from any), find-links, constraints, certificate; a UV_* setting of
# the user's own wins. --compile-bytecode as pip does: without .pyc files (and where
# PYTHONDONTWRITEBYTECODE is set) every process of the demo compiled torch's and MLflow's sources
# again, 2.6x the CPU time of `import torch, mlflow`. Fresh clone, 2 cores: README.md, "Quickstart".
define PIP_TO_UV
import ast, os, shlex, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
rank, conf = {"global": 1, "install": 2, ":env:": 3}, {}
for line in listed.splitlines():
    key, _, value = line.partition("=")
    where, _, name = key.rpartition(".")
    if where in rank and rank[where] >= conf.get(name, (0, ""))[0]:
        conf[name] = (rank[where], " ".join(ast.literal_eval(value).split()))
def hand(name, var, *theirs, sep=" "):
    value = conf.get(name, (0, ""))[1]
    if value and not any(os.environ.get(v) for v in (var, *theirs)):
        print(f"export {var}={shlex.quote(sep.join(value.split()))}")
        return True
hand("index-url", "UV_DEFAULT_INDEX", "UV_INDEX_URL")
if hand("extra-index-url", "UV_INDEX", "UV_EXTRA_INDEX_URL") and not os.environ.get("UV_INDEX_STRATEGY"):
    print("export UV_INDEX_STRATEGY=unsafe-best-match")
hand("find-links", "UV_FIND_LINKS", sep=",")
hand("constraint", "UV_CONSTRAINT")
hand("cert", "SSL_CERT_FILE")
if conf.get("no-index", (0, ""))[1].lower() in ("1", "true", "yes", "on"):
    print("export UV_NO_INDEX=1")
endef
export PIP_TO_UV

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ "$$REPRO500_INSTALLER" != pip ] \
		&& { uv=$$(command -v uv) || { $(PY) -m pip install --quiet --quiet uv && uv=$(VENV)/bin/uv; }; } \
		&& uvconf=$$($(PY) -c "$$PIP_TO_UV") && eval "$$uvconf" \
		&& $$uv pip install --compile-bytecode --python $(PY) -e '.[test]'; then :; \
	else \
		[ "$$REPRO500_INSTALLER" = pip ] || echo "make: uv could not install; installing with pip"; \
		$(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --quiet -e '.[test]'; \
	fi
	@touch $(STAMP)

install: $(STAMP)

# The embedded default, end to end: generate -> run (3 repeats, MLflow in ./mlflow.db) -> verify -> report.
demo: $(STAMP)
	$(R) data generate classification --out data/quickstart-train.h5 --samples 2048 --seed 500 --noise 0.04 --force
	$(R) data generate classification --out data/quickstart-eval.h5 --samples 512 --seed 500 --noise 0.04 --split eval --force
	@id=demo-$$(date -u +%Y%m%d-%H%M%S); rc=0; \
	$(R) run experiments/quickstart.yaml --run-id $$id || rc=$$?; \
	test -f runs/$$id/SHA256SUMS || exit $$rc; \
	$(R) verify runs/$$id > /dev/null || true; \
	$(R) report runs/$$id || rc=$$?; \
	echo; echo "Run directory: runs/$$id   (repro500 verify runs/$$id)"; \
	echo "Report:        runs/$$id/report.html"; \
	echo "MLflow UI:     $(R) ui   then open the address it prints (the runs table)"; \
	exit $$rc

# The suite runs in TEST_WORKERS pytest-xdist workers: one more than the cores, at most 5
# (`make test TEST_WORKERS=8` on a larger machine). With one per core the CPU sat idle 18 % of the
# time (tests wait on SQLite's and git's fsyncs, on pipes, on a child's exit); on 2 cores a third
# worker filled it: 758 s -> 598 s. --dist loadfile keeps a test file on one worker, so a
# module-scoped fixture (a real run that several tests read) is made once, not once per worker.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); n=$$((n + 1)); [ $$n -gt 5 ] && n=5; echo $$n)

# --durations: the slowest tests and their seconds, for whoever next keeps the suites' time
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

# The record fuzzer for longer than make test's fixed-seed slice (docs/trust.md, "The record
# fuzzer"): FUZZ_EXAMPLES cases, a fresh random seed, each case printed as it is tried.
FUZZ_EXAMPLES ?= 200
fuzz: $(STAMP)
	REPRO500_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -s -p no:cacheprovider --timeout 0 tests/test_fuzz_records.py

# Long tests: the CUDA sources' compile, top-k on the full quickstart, the quickstart's verdict, two-rank runs, the examples end to end,
# a team's PostgreSQL-backed MLflow server with four runs at once (tests/test_team_postgres.py: needs Debian's postgresql),
# examples/slurm_ddp.sbatch on a real two-node SLURM started by the test (tests/test_slurm.py: Debian's slurm-wlm and munge, root).
# Those that measure this machine (marked `measures`: bandwidth, energy, Gloo collectives' timings) run
# first and one at a time, since they would measure each other; the rest in TEST_WORKERS workers as
# make test does (one at a time they took 22 of CI's minutes on a Zen 4, most of it waiting on children).
test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow and measures"
	$(PY) -m pytest -q -m "slow and not measures and not online and not heavy" -n $(TEST_WORKERS) --dist loadfile --durations=15

# Long tests of minutes of CPU each that CI's 50 minutes do not hold (with them make test-slow took
# 32 minutes on a 2-core Zen 3): the full quickstart verified (what make demo shows), top-k and
# PowerSGD training it on two ranks, the CUDA sources compiled from a fresh cache (needs nvcc), and
# end-to-end paths whose parts other slow tests cover in CI (the mlflow_script example published
# and reproduced, README's MLflow-metrics example under DVC, a two-node run's killed rank resumed,
# the SLURM two-node job stopped and resubmitted, the project's dvc.yaml from a fresh clone, locate
# naming oneDNN's convolution); each test says which cover it. Run them before a change to those
# parts lands.
test-heavy: $(STAMP)
	$(PY) -m pytest -q -m "heavy" -n $(TEST_WORKERS) --dist loadfile --durations=15

# Long tests that download large distributions from the package index (a rebuilt venv with torch and
# its CUDA libraries, about 2 GB): minutes of network the CI budget does not hold.
test-online: $(STAMP)
	$(PY) -m pytest -q -m online

# Horovod 0.28.1 built from its sdist with the C++20 fix (docs/distributed.md), then its tests:
# the adapter's inside 2 horovodrun ranks, then `repro500 run --set engine=horovod` end to end
# once, outside horovodrun (each of those runs starts its own horovodrun).
install-horovod: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH scripts/build_horovod.sh

test-horovod: install-horovod
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH horovodrun -np 2 -H localhost:2 --gloo $(PY) -m pytest -q -p no:cacheprovider -m horovod tests/test_horovod.py
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q -p no:cacheprovider -m horovod tests/test_horovod_run.py

# Compile the C++ operators ahead of their first use (add --cuda where nvcc is present).
ops: $(STAMP)
	$(PY) -m repro500.ext.build

lint: $(STAMP)
	$(VENV)/bin/ruff check repro500 tests bench
	$(VENV)/bin/lint-imports --no-cache  # the layers in .importlinter (docs/contracts.md, "Layers")
	$(PY) -m pytest -q -p no:cacheprovider tests/test_owners.py tests/test_dead_code.py tests/test_docs_map.py  # one owner per name, no dead code, the map matches the tree

# Every benchmark in bench/ runs (a new one joins by being there) and prints its own PASS/MISS, even
# after one misses; the target fails at the end, naming those that missed. `make bench BENCHES="a.py b.py"`
# runs a few.
BENCHES ?= $(sort $(filter-out _%,$(notdir $(wildcard bench/*.py)))) "overhead.py --plugin"
bench: $(STAMP)
	@missed=""; for b in $(BENCHES); do \
		echo "== bench/$$b"; $(PY) bench/$$b || missed="$$missed; $$b (exit $$?)"; \
	done; \
	if [ -n "$$missed" ]; then echo "make bench: MISSED in $${missed#; }"; exit 1; fi; \
	echo "make bench: every benchmark met its target"

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache
