# dfit-mlir: `make demo` and `make test` work on a fresh machine (they create .venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help venv demo test test-heavy test-all test-fast lint bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, as the CPU build: anything that depends on it would pull a CUDA one.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install dfit-mlir with its test extras

demo: $(STAMP)  ## the main job on the bundled model: tagged compile, runs, every built-in tool, a short report
	$(VENV)/bin/dfit compile examples/models/convnet.mlir --dfit-tag --mode full -o build/demo/convnet.vmfb
	$(VENV)/bin/dfit show build/demo/convnet.manifest.json
	$(VENV)/bin/dfit run build/demo/convnet.vmfb --mode none --repeat 20 --warmup 2 -o build/demo/run-none
	$(VENV)/bin/dfit run build/demo/convnet.vmfb --mode full --repeat 20 --warmup 2 -o build/demo/run
	$(VENV)/bin/dfit analyze build/demo/run --tool all --option overhead.compare=build/demo/run-none --out build/demo/analysis
	$(VENV)/bin/dfit view build/demo/run -o build/demo/view.html
	@echo
	@echo "Perfetto trace (open in ui.perfetto.dev): build/demo/run/trace.pftrace  (Chrome JSON: build/demo/run/trace.json)"
	@echo "Events: build/demo/run/events.parquet; tables: build/demo/run/*.csv, build/demo/analysis/*/*.csv"
	@echo "Roofline plot: build/demo/analysis/program-analyzer/roofline.png"
	@echo "Provenance view (open in a browser): build/demo/view.html"

test: $(STAMP)  ## the test suite (unit, golden IR, real models, browser), all but the zoo and Spark: about 20 min on 2 cores
	$(VENV)/bin/pytest -q -m "not zoo and not spark and not heavy"

test-heavy: $(STAMP)  ## the model zoo (17 models compiled, run 5 times, analyzed), the real-Spark tests and the heaviest end-to-end checks (about 10 min; CI runs them)
	$(VENV)/bin/pytest -q -m "zoo or spark or heavy"

test-all: test test-heavy  ## everything: what CI runs

test-fast: $(STAMP)  ## skip the real-model compiles, PyTorch/JAX exports and Spark
	$(VENV)/bin/pytest -q -m "not slow and not frontends and not spark"

lint: $(STAMP)  ## ruff, the import layers (tests/import_layers.py) and mypy on the typed layers
	$(VENV)/bin/ruff check dfit_mlir passes dialects adapters runtime_hooks tests benchmarks examples
	$(PY) -m tests.import_layers
	$(PY) -m tests.typecheck

bench: $(STAMP)  ## every benchmark; each rewrites its section of benchmarks/RESULTS.md
	$(PY) benchmarks/compile_overhead.py --rounds 5
	$(PY) benchmarks/tag_scale.py
	$(PY) benchmarks/event_pipeline.py
	$(PY) benchmarks/runtime_overhead.py
	$(PY) benchmarks/runtime_join.py
	$(PY) benchmarks/reconstruct_scale.py --runs 5
	$(PY) -m benchmarks.time_split

clean:  ## remove build outputs (keeps .venv)
	rm -rf build .pytest_cache
