# fcos-d2: `make quickstart` trains and evaluates on the built-in dataset; `make test` runs the suite.
PYTHON_VERSION ?= 3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fcos-d2-setup-done

# exits 1 where the installed torch has no bytecode (cheap: imports nothing heavy)
define BYTECODE_CHECK
import importlib.util as u, os, sys, sysconfig
init = os.path.join(sysconfig.get_paths()["purelib"], "torch", "__init__.py")
sys.exit(0 if os.path.exists(u.cache_from_source(init)) else 1)
endef
export BYTECODE_CHECK

.PHONY: setup test browser quickstart benchmark train-quality train-quality-thin mask-quality \
	mask-quality-thin \
	epochs-curve docs-tables clean-venv

# The stamp records that requirements.txt, detectron2 and fcos-d2 were installed; it is
# redone when requirements.txt or setup.py change. A second run only verifies imports, and
# compiles the bytecode of a .venv set up before pip wrote it (no torch/__init__'s: once,
# both cores; one file of torch's tests is Python 3.12 only, hence the ignored status).
setup: $(STAMP)
	@$(PY) -c "$$BYTECODE_CHECK" || { echo "make setup: compiling the bytecode of $(VENV)"; \
	  $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null; true; }
	@$(PY) -c "import fcos_d2, detectron2.engine, detectron2.evaluation, detectron2.data; print('environment OK: torch', __import__('torch').__version__, '| detectron2', __import__('detectron2').__version__)"

# pip writes the bytecode of what it installs (its default, about 17 s here): where
# PYTHONDONTWRITEBYTECODE is set, as on this project's machines, Python never writes it on import,
# and without it every process of the suite compiled torch, sympy and detectron2 from
# source again (`import fcos_d2` 15.7 s against 5.5 s with it; docs/development.md).
$(STAMP): requirements.txt setup.py tools/install_detectron2.py
	@test -x $(PY) || python$(PYTHON_VERSION) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) tools/install_detectron2.py
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

# Two pytest workers (pytest-xdist), a test file per worker at a time so that a module's
# fixtures are built once; tests/conftest.py gives each worker its share of the CPU threads.
TEST_WORKERS ?= 2
test: setup browser
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

# Headless Chromium (Debian's chromium) for the browser check of report.html in
# tests/evaluation/test_evaluation_report.py. Best effort: where it cannot be installed (no apt-get,
# not root, offline) this says so and that test skips, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	echo "make browser: chromium not installed (needs apt-get and root); the browser test of report.html will skip"

quickstart: setup
	$(PY) train_net.py --config-file configs/quickstart.yaml --num-gpus 1 --vis-val 8 OUTPUT_DIR output/quickstart

# The benchmarks (benchmarks/, run as modules from this folder) append a record of every run
# to benchmarks/results/<benchmark>.jsonl; docs-tables makes docs/results/*.md from them.
benchmark: setup
	$(PY) -m benchmarks.speed

# Training quality on small data from scratch: 18 contenders x 3 seeds, about 4 minutes
# a training, two at a time on 2 CPU cores; LabelEnc's three contenders cost about 6.8
# such trainings per seed (~2.3 hours in all, an estimate from the measured per-iteration
# costs); runs already in
# output/train_quality/results.jsonl are kept, so an interrupted run continues.
train-quality: setup
	$(PY) -m benchmarks.train_quality

# Regime 2 (issue 20): 10 classes of thin and filled objects in 256-352 px images, every
# contender x 5 seeds, ~4x the iteration cost of the first regime (--regime-cost);
# results in output/train_quality_thin/. TRAIN_QUALITY_ARGS adds --contenders, --diagnostics ...
TRAIN_QUALITY_ARGS ?=
train-quality-thin: setup
	$(PY) -m benchmarks.train_quality --regime thin $(TRAIN_QUALITY_ARGS)

# Mask AP and latency of SipMask against detectron2's Mask R-CNN (same trunk, data,
# schedule and evaluator), 3 seeds each, two runs at a time on one thread each; runs
# already in output/mask_quality/results.jsonl under the same regime and model are kept. Shorter:
# make mask-quality MASK_QUALITY_ARGS="--iters 600".
MASK_QUALITY_ARGS ?=
mask-quality: setup
	$(PY) -m benchmarks.masks $(MASK_QUALITY_ARGS)

# The same on the thin shapes with masks (256-352 px, 10 classes, strokes a few px wide),
# ~4-8x the iteration cost; results in output/mask_quality_thin/.
mask-quality-thin: setup
	$(PY) -m benchmarks.masks --regime thin $(MASK_QUALITY_ARGS)

# AP against epochs of the small-data recipe (issue 54): E = 12, 24, 36, 48 epochs x 3 seeds,
# one run at a time; runs already in output/epochs_curve_<regime>/results.jsonl are kept.
# The other regime: make epochs-curve EPOCHS_CURVE_ARGS="--regime thin".
EPOCHS_CURVE_ARGS ?=
epochs-curve: setup
	$(PY) -m benchmarks.epochs $(EPOCHS_CURVE_ARGS)

# The docs' tables, generated from the records (never edited by hand).
docs-tables: setup
	$(PY) -m benchmarks.tables

clean-venv:
	rm -rf $(VENV)
