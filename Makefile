# dsgd-teach: every target bootstraps .venv first (idempotent: a second run reuses it).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# pytest-xdist workers for `make test` (each runs whole test files; the slow files go first, see tests/conftest.py)
JOBS   ?= 2

.PHONY: install lab test compat lint course book bench assignments browser-deps sandbox-deps hub-deps clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# JupyterLab on course/ opens the workspace binder/dsgd.jupyterlab-workspace (re-imported at every start): chapter 00
# beside the dask task stream, progress and workers panes. Dashboard links go through jupyter-server-proxy, as on
# Binder, so the panes work wherever the browser reaches only the notebook server.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab workspaces import binder/dsgd.jupyterlab-workspace
	DASK_DISTRIBUTED__DASHBOARD__LINK='/proxy/{port}/status' $(VENV)/bin/jupyter lab --ServerApp.root_dir=course \
	  --LabApp.default_url=/lab/workspaces/dsgd

lint: $(STAMP)
	$(VENV)/bin/ruff check dsgd_teach tests

# The compat environment (below) downloads, installs and runs its own tests while the main suite runs (its output
# is printed after the main suite's), in one pytest process so that it takes one core's share beside the main suite.
# The main suite runs in JOBS pytest-xdist workers, one test file per worker at a time. Where the compat stage runs
# (a second Python exists), the chapters' runs on a CLI deployment are its, not the main suite's.
test: $(STAMP) lint browser-deps sandbox-deps hub-deps
	@mkdir -p build; JOBS=1 bash scripts/compat_test.sh $(PY) > build/compat.log 2>&1 & compat=$$!; \
	if bash scripts/newest_python.sh "$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')" >/dev/null; \
	then export DSGD_DEPLOYMENT_CHAPTERS=compat; fi; \
	$(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder; status=$$?; wait $$compat; compat_status=$$?; \
	cat build/compat.log; [ $$status -eq 0 ] || exit $$status; exit $$compat_status

# The newcomer's configuration: the newest other Python here with PyPI's standard (CUDA) torch wheel, in
# .venv-compat: every chapter in smoke mode on a CLI deployment plus the oracle and memory tests (skips if no second
# Python).
compat: $(STAMP)
	bash scripts/compat_test.sh $(PY)

course: $(STAMP)
	$(PY) -m dsgd_teach.course_runner --out build/course

# The course as a website in build/book/html (Sphinx, MyST-NB and the book theme, all installed by pip; nothing is
# fetched while it builds) from the chapters `make course` executed into build/course: a chapter missing there, or
# older than its notebook, is executed first. Each chapter's Binder launch link names BINDER_REPO=owner/name, else the
# GitHub repository of the origin remote; with neither, a link to the chapter in the JupyterLab of `make lab`.
book: $(STAMP)
	$(PY) -m dsgd_teach.book --executed build/course --out build/book $(if $(BINDER_REPO),--binder-repo $(BINDER_REPO))

bench: $(STAMP)
	$(VENV)/bin/dsgd-teach bench --out build/bench

assignments: $(STAMP)
	$(PY) -m dsgd_teach.grading.release --source course/assignments/source --out release

# The browser tests drive Debian's chromium through Playwright; `playwright install` cannot download here.
browser-deps: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || command -v /usr/bin/chromium >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	    else echo "chromium missing: install it (e.g. sudo apt-get install chromium); browser tests will skip"; fi; }

# The course's hub (deploy/hub, tests/test_hub.py) puts configurable-http-proxy, an npm package, in front of
# JupyterHub: installed into .venv/chp unless it is on PATH (npm itself from Debian when root).
CHP_VERSION := 5.3.0
hub-deps: $(STAMP)
	@command -v configurable-http-proxy >/dev/null 2>&1 || test -x $(VENV)/chp/node_modules/.bin/configurable-http-proxy || \
	  { command -v npm >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; } || true; \
	    if command -v npm >/dev/null 2>&1; then \
	      npm install --prefix $(VENV)/chp --no-audit --no-fund --silent configurable-http-proxy@$(CHP_VERSION); \
	    else echo "npm missing: install it (e.g. sudo apt-get install npm); the hub tests will skip"; fi; }

# `dsgd-teach grade` runs every grading kernel in a bubblewrap sandbox (and refuses to grade without one).
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	    else echo "bubblewrap missing: install it (e.g. sudo apt-get install bubblewrap); sandboxed grading tests will skip and dsgd-teach grade will refuse"; fi; }

clean:
	rm -rf build release .pytest_cache
