# The two commands of the README. Both create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
#: pytest-xdist workers of `make test` (each with servers of its own: tests/support/worker_servers.py);
#: TEST_WORKERS=0 runs the suite in one process
TEST_WORKERS ?= 2

.PHONY: demo demo-django test fuzz docs clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test,docs]'
	touch $(STAMP)

## demo: three beat instances and one worker on the embedded default (SQLite, no server)
demo: $(STAMP)
	$(PY) example_project/demo.py

## demo-django: django-celery-beat's rows, edited while three beats and a worker run (SQLite, no server)
demo-django: $(STAMP)
	$(PY) example_project/demo_django.py

## test: every test against the real servers (see DEVELOPERS.md), on two workers; fails on any failure
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS)

## fuzz: the property-based fuzzing of tests/fuzz/ for ~30 minutes, random (its seed printed);
## make test runs the same properties for ~3 minutes, derandomized
FUZZ_SEED ?= $(shell date +%s)
fuzz: $(STAMP)
	@echo "fuzz: --hypothesis-seed=$(FUZZ_SEED) (make fuzz FUZZ_SEED=$(FUZZ_SEED) replays it)"
	$(PY) -m pytest tests/fuzz -p no:randomly --timeout 0 --hypothesis-profile fuzz \
		--hypothesis-seed=$(FUZZ_SEED) --hypothesis-show-statistics

docs: $(STAMP)
	$(PY) -m sphinx -q -b html docs docs/_build/html

clean:
	rm -rf $(VENV) example_project/.run example_project/.run-django docs/_build .pytest_cache
