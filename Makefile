# Two commands do everything on a fresh machine (see README):
#   make demo   create .venv, install, run `python -m tuner.optimize --trials 20` on the emulator
#   make test   all set-up (venv, test host, PostgreSQL, Chromium), then the whole test suite
PY ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# The demo's launch command says `python -m sglang_emulator`: it must find the venv's python.
export PATH := $(BIN):$(PATH)
TRIALS ?= 20

.PHONY: install demo test test-fast services dashboard report clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,postgres,emulator]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python -m tuner.optimize --trials $(TRIALS)

services:
	.ci/services.sh up

# Two workers, one test file each at a time (--dist loadfile: a file's tests share its servers
# and the test host): the end-to-end tests mostly wait on servers, so this halves the wall time.
test: install services
	$(BIN)/python -m pytest -ra --durations=15 -n 2 --dist loadfile

test-fast: install
	$(BIN)/python -m pytest -ra -m "not e2e"

dashboard: install
	$(BIN)/python -m tuner.dashboard

report: install
	$(BIN)/python -m tuner.report

clean:
	rm -rf $(VENV) studies/*.db studies/*.artifacts .pytest_cache
