# The two commands of the README. Both create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test docs clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test,docs]'
	touch $(STAMP)

## demo: three beat instances and one worker on the embedded default (SQLite, no server)
demo: $(STAMP)
	$(PY) example_project/demo.py

## test: every test against the real servers (see DEVELOPERS.md); fails on any failure
test: $(STAMP)
	$(PY) -m pytest

docs: $(STAMP)
	$(PY) -m sphinx -q -b html docs docs/_build/html

clean:
	rm -rf $(VENV) example_project/.run docs/_build .pytest_cache
