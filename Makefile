# Two entry points: `make demo` and `make test`. Each (re)creates the local virtualenv
# when it is missing or older than this Makefile (how it installs) or one of the three
# distributions' pyproject.toml: the server (.), the Python client (client/) and the
# embedded dev stack (devstack/).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-from-pyproject
PYPROJECTS := pyproject.toml client/pyproject.toml devstack/pyproject.toml
# The agent frameworks' Temporal callers (tests/nexus/*_caller.py) run as their users run
# them: in a virtualenv holding only the client with both frameworks' Temporal extras, made
# with the main one's uv (seconds, from cache). The OpenAI Agents SDK's integration also pins
# openai-agents 0.22, where the main virtualenv holds 0.24. temporalio's opentelemetry extra:
# the trace test's caller runs with its TracingInterceptor, as a user tracing calls would.
CALLER_VENV := .venv-temporal-agents
CALLER_STAMP := $(CALLER_VENV)/.installed-from-pyproject

.PHONY: demo demo-agent test lint dev docs bench

$(STAMP): $(PYPROJECTS) Makefile
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet uv==0.13.9
	# uv installs the same pinned set as pip in half the time (CI's budget); pip stays in the
	# virtualenv, upgraded, for the tests that build wheels with it. Compiled at install, as
	# pip does: where PYTHONDONTWRITEBYTECODE is set, every process the tests start would
	# otherwise compile what it imports again (3 s more each).
	$(VENV)/bin/uv pip install --python $(VENV)/bin/python --quiet --compile-bytecode \
		--upgrade-package pip pip -e './client[pydantic-ai,openai-agents]' -e '.[test]' -e ./devstack
	touch $(STAMP)

$(CALLER_STAMP): client/pyproject.toml Makefile | $(STAMP)
	test -x $(CALLER_VENV)/bin/python || $(VENV)/bin/uv venv --quiet --python $(VENV)/bin/python $(CALLER_VENV)
	$(VENV)/bin/uv pip install --python $(CALLER_VENV)/bin/python --quiet --compile-bytecode \
		-e './client[openai-agents-temporal,pydantic-ai-temporal]' 'temporalio[opentelemetry]'
	touch $(CALLER_STAMP)

demo: $(STAMP)
	$(VENV)/bin/onceflow demo

# The PydanticAI support agent (examples/support_agent), scripted offline: its parked refund
# is reconciled with the CLI and the run resumes. Installs the example (offline) first.
demo-agent: $(STAMP)
	$(VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation ./examples/support_agent
	$(VENV)/bin/onceflow demo --agent

test: $(STAMP) $(CALLER_STAMP)
	$(VENV)/bin/python -m pytest -n 4 --dist loadfile

# What the benchmarks need beyond the tests' set (the plots' matplotlib); then run any of
# them as BENCHMARKS.md shows, e.g. `.venv/bin/python -m bench.task_overhead`.
bench: $(STAMP)
	$(VENV)/bin/uv pip install --python $(VENV)/bin/python --quiet -e '.[bench]'

dev: $(STAMP)
	$(VENV)/bin/onceflow dev

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

docs: $(STAMP)
	$(VENV)/bin/python docs/api_reference.py
