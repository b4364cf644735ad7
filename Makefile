# The two commands of the README: `make demo` and `make test`. Both set everything up first.
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch (a bare `torch` would pull a multi-GB CUDA build). Elsewhere, add
# PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu" to get the CPU wheel.
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
PYTEST_ARGS ?=

BIN := $(VENV)/bin

.PHONY: setup demo lint test test-kernels test-all test-fast clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip check
	touch $@

demo: setup
	$(BIN)/spotlight run --run-dir runs/demo --overwrite

# The style (pyproject's [tool.ruff]) and the layering (pyproject's [tool.importlinter]); CI runs it before the tests.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# Two test processes (pytest-xdist): a test file, and every reader of the session's shared runs, stay in one
# (tests/conftest.py's scheduler).
XDIST := -n 2

# What CI runs: every behaviour a user would notice (docs/BENCHMARKS.md, "The test suite": its time and what is nightly).
test: setup
	@command -v redis-server >/dev/null || echo "make test: no redis-server on PATH, so the Redis queue tests skip (about 55); CI installs Debian's: apt-get install redis-server"
	@command -v chromium >/dev/null || echo "make test: no chromium on PATH, so the Dagster UI screenshot skips; CI installs it: apt-get install chromium"
	$(BIN)/python -m pytest $(XDIST) -m "not nightly" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-kernels

# The golden run and the bit-for-bit SP test again on another of torch's CPU kernel sets (ATEN_CPU_CAPABILITY: AVX2's,
# or DEFAULT's where AVX2 is what the CPU has): the fixtures' tolerances and the equal hashes must hold on either
# (docs/SPOT_RUNTIME.md, "What bit-identical covers"). It used 70 s of CPU here (docs/log/kernel-sets.md).
KERNEL_TESTS := tests/workers/coordinator/test_golden.py::test_cpu_smoke_train_equals_the_golden_fixture \
	tests/workers/sp/test_node_serve.py::test_a_group_of_one_commits_what_the_rollout_worker_commits_bit_for_bit
test-kernels: setup
	@native=$$($(BIN)/python -c "import torch; print(torch.backends.cpu.get_cpu_capability())") && \
	other=$$(if [ "$$native" = AVX2 ]; then echo default; else echo avx2; fi) && \
	echo "the golden and bit-for-bit tests under ATEN_CPU_CAPABILITY=$$other (this CPU: $$native)" && \
	ATEN_CPU_CAPABILITY=$$other $(BIN)/python -m pytest -q -p no:cacheprovider $(KERNEL_TESTS)

# The nightly job: `make test` plus the long checks (learning runs, benches at full size).
test-all: setup
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-kernels

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
