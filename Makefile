# Two entry points: `make demo` and `make test`. Each (re)creates the local virtualenv
# from pyproject.toml when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-from-pyproject

.PHONY: demo test lint dev docs

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/onceflow demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest

dev: $(STAMP)
	$(VENV)/bin/onceflow dev

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .

docs: $(STAMP)
	$(VENV)/bin/python docs/api_reference.py
