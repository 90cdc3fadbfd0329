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

.PHONY: install demo test test-slow test-horovod install-horovod ops lint bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
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
	echo "MLflow UI:     $(R) ui   then open http://127.0.0.1:5000"; \
	exit $$rc

test: $(STAMP)
	$(PY) -m pytest -q

# Long tests: the CUDA sources' compile, top-k on the full quickstart, the quickstart's verdict, two-rank runs, the examples end to end,
# a team's PostgreSQL-backed MLflow server with four runs at once (tests/test_team_postgres.py: needs Debian's postgresql),
# examples/slurm_ddp.sbatch on a real two-node SLURM started by the test (tests/test_slurm.py: Debian's slurm-wlm and munge, root).
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

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

# Every benchmark runs and prints its own PASS/MISS, even after one misses; the target fails at
# the end, naming those that missed.
BENCHES := capture.py hashing.py datagen.py loader.py overhead.py "overhead.py --plugin" command_overhead.py \
	observe_inputs.py attest.py compress.py wire_bytes.py verdict_calibration.py variance_attribution.py quickstart.py \
	ops_gemm.py roofline_bandwidth.py energy_overhead.py variants.py mlflow_overhead.py team_postgres.py
bench: $(STAMP)
	@missed=""; for b in $(BENCHES); do \
		echo "== bench/$$b"; $(PY) bench/$$b || missed="$$missed; $$b (exit $$?)"; \
	done; \
	if [ -n "$$missed" ]; then echo "make bench: MISSED in $${missed#; }"; exit 1; fi; \
	echo "make bench: every benchmark met its target"

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache
