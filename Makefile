# One short command per habit. Everything installs into ./.venv, created on first use.
PYTHON ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
export VIRTUAL_ENV := $(VENV)

.PHONY: demo test test-rust test-python test-example build wheel wheel-check lint format bench clean tools notices

# The tools, checked before anything is made, one line each when one is too old: Python 3.11 or
# newer (requires-python, the abi3 floor) and Rust at least Cargo.toml's rust-version. Once .venv
# exists its Python is the one checked.
PY_FOUND = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
PY_FIX = $(if $(wildcard $(BIN)/python),rm -rf .venv and make,make) PYTHON=python3.11 or newer
RUST_MIN := $(shell sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
tools:
	@$(PY_FOUND) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
		v=$$($(PY_FOUND) --version 2>&1) || v="not found"; \
		echo "cubridge needs Python 3.11 or newer; $(PY_FOUND) is $$v ($(PY_FIX))" >&2; exit 1; }
	@v=$$(rustc --version 2>/dev/null | cut -d' ' -f2); \
	printf '%s\n' $(RUST_MIN) "$$v" | sort -V -C || { \
		echo "cubridge needs Rust $(RUST_MIN) or newer; rustc is $${v:-not found} (rustup update, or https://rustup.rs)" >&2; exit 1; }

# A venv whose creation fails half way is removed, so that the next run starts afresh.
# Quiet steps say first what they do and about how long it takes (timed on 2 cores); the large
# download shows pip's progress.
$(BIN)/python: | tools
	@echo "creating .venv and updating its pip (about 10 s)"
	$(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install -q --upgrade pip || { rm -rf $(VENV); exit 1; }

$(VENV)/.build-deps: requirements/build.txt | $(BIN)/python
	@echo "installing the build tools into .venv: maturin, numpy, zig (about 20 s)"
	$(BIN)/python -m pip install -q -r requirements/build.txt
	touch $@

# PyPI's torch for Linux is its CUDA build: the NVIDIA libraries come with it, also without a
# GPU (the CPU build is on download.pytorch.org, which not every machine reaches).
$(VENV)/.test-deps: requirements/test.txt | $(BIN)/python
	@echo "downloading the test environment once: about 3.1 GB, 5 GB installed (torch with its CUDA libraries, jax, NVRTC)"
	$(BIN)/python -m pip install --progress-bar on -r requirements/test.txt
	touch $@

$(VENV)/.lint-deps: requirements/lint.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements/lint.txt
	touch $@

## build: compile the extension (release) into .venv
build: $(VENV)/.build-deps
	@echo "building cubridge (release) into .venv: about 3 min the first time on 2 cores, seconds after"
	$(BIN)/maturin develop --release -q

## wheel: the release abi3 wheels in target/wheels, one for Python 3.11 and one for 3.12 and newer
## (which calls producers through vectorcall), manylinux_2_28 for this host's architecture
## (linked through zig against glibc 2.28, whatever this host's glibc), that ships add's kernels
## for the common dtypes, compiled here by NVRTC from the nvidia pip packages (no CUDA toolkit):
## cubins for each major version from sm_80 on that this NVRTC knows, and PTX for the newest
SHIP := $(CURDIR)/target/shipped-kernels
NVIDIA := $(VENV)/nvidia-ship
$(NVIDIA)/.done: requirements/ship.txt | $(BIN)/python
	$(BIN)/python -m pip install -q --target $(NVIDIA) -r requirements/ship.txt
	touch $@

wheel: $(VENV)/.build-deps $(NVIDIA)/.done
	rm -rf $(SHIP)
	CUDA_HOME=$(NVIDIA)/nvidia/cuda_runtime CUBRIDGE_NVRTC_DIR=$(NVIDIA)/nvidia/cuda_nvrtc/lib \
		cargo run --release --quiet --example ship_kernels -- $(SHIP)
	rm -f target/wheels/cubridge-*.whl
	PATH=$(BIN):$$PATH CUBRIDGE_SHIP_KERNELS=$(SHIP) $(BIN)/maturin build --release -q --zig
	PATH=$(BIN):$$PATH CUBRIDGE_SHIP_KERNELS=$(SHIP) $(BIN)/maturin build --release -q --zig \
		--features py312

## wheel-check: auditwheel's verdict on the wheels make wheel built (each must be manylinux_2_28),
## then the one pip picks installed into a clean venv (no dependencies) and imported there, and
## the same with a python3.12 where there is one
CHECK_VENV := $(CURDIR)/target/wheel-check-venv
wheel-check: $(VENV)/.build-deps
	for w in target/wheels/cubridge-*.whl; do \
		$(BIN)/auditwheel show $$w | tee target/auditwheel.txt; \
		tr '\n' ' ' < target/auditwheel.txt | grep -q 'consistent with the following platform tag: "manylinux_2_28_' || { \
			echo "auditwheel does not find $$w manylinux_2_28" >&2; exit 1; }; \
	done
	rm -rf $(CHECK_VENV) && $(PY_FOUND) -m venv $(CHECK_VENV)
	$(CHECK_VENV)/bin/python -m pip install -q --no-deps --no-index --find-links target/wheels cubridge
	cd / && $(CHECK_VENV)/bin/python -c 'import cubridge, cubridge.cuda; \
		print("cubridge", cubridge.__file__, len(cubridge.cuda.shipped_kernels()), "cubins shipped")'
	if command -v python3.12 >/dev/null; then \
		rm -rf $(CHECK_VENV) && python3.12 -m venv $(CHECK_VENV) && \
		$(CHECK_VENV)/bin/python -m pip install -q --no-deps --no-index --find-links target/wheels cubridge && \
		cd / && $(CHECK_VENV)/bin/python -c 'import cubridge; print("cubridge on 3.12:", cubridge.__file__)'; \
	else echo "no python3.12 here: the wheel for 3.12 and newer was checked by auditwheel only"; fi

## demo: build, then run examples/demo.py (CUDA when present, else the CPU)
demo: build
	$(BIN)/python examples/demo.py

## test: every test: Rust unit tests (every kernel compiled by the NVRTC that .venv installed;
## they fail without it), the interop suite (without a GPU the CUDA cases are not run, which the
## summary says in one line), then the example extension crate (examples/extension), built and
## tested
test: test-rust test-python test-example

# NVRTC from the nvidia pip packages in .venv (CUDA 13: nvidia/cu13/lib, CUDA 12:
# nvidia/cuda_nvrtc/lib); CUBRIDGE_TEST_REQUIRE_NVRTC=1 fails the compile tests without it.
test-rust: tools $(VENV)/.test-deps
	@echo "building and running the Rust tests, which compile every kernel with NVRTC (about 4 min on 2 idle cores)"
	@lib=$$(ls $(VENV)/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.* 2>/dev/null | head -n 1); \
	test -n "$$lib" || { echo "no NVRTC in .venv: rm .venv/.test-deps and make test again" >&2; exit 1; }; \
	echo "CUBRIDGE_TEST_NVRTC_DIR=$$(dirname $$lib) cargo test --quiet"; \
	CUBRIDGE_TEST_REQUIRE_NVRTC=1 CUBRIDGE_TEST_NVRTC_DIR=$$(dirname $$lib) cargo test --quiet

test-python: build $(VENV)/.test-deps
	$(BIN)/python -m pytest interop-tests -q

test-example: build $(VENV)/.test-deps
	@echo "building the example extension (debug, about 1 min the first time)"
	cd examples/extension && $(BIN)/maturin develop -q
	$(BIN)/python -m pytest examples/extension/tests -q

## notices: THIRD-PARTY-NOTICES, the licences of the crates the extension is built from (shipped
## in the wheel), written from Cargo.lock by cargo-about, a pinned copy built into target/tools;
## (cargo fetch: every platform's crates, so that --frozen finds them; --frozen reads only the
## crates' own files, so that every run writes the same text)
ABOUT := $(CURDIR)/target/tools/bin/cargo-about
NOTICES = cargo fetch --locked --quiet && $(ABOUT) -L error generate --frozen --features python notices.hbs -o
$(ABOUT):
	cargo install --quiet --locked --root $(CURDIR)/target/tools cargo-about@0.9.3 --features cli

notices: $(ABOUT)
	$(NOTICES) THIRD-PARTY-NOTICES

## lint: formatting and lints that must pass before a commit (CI runs it before the tests):
## Rust format and clippy, ruff's lints and format check, the stubs against the extension, and
## no import circle among src/'s modules beyond the two small pairs inside cuda/, and
## THIRD-PARTY-NOTICES as make notices writes it from Cargo.lock
lint: build $(VENV)/.lint-deps $(ABOUT)
	$(NOTICES) target/THIRD-PARTY-NOTICES
	cmp -s THIRD-PARTY-NOTICES target/THIRD-PARTY-NOTICES || { \
		echo "THIRD-PARTY-NOTICES is out of date with Cargo.lock: run make notices" >&2; exit 1; }
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --features abi3 -- -D warnings
	cargo clippy --lib --tests --features abi3,phase-times -- -D warnings
	PYO3_BUILD_EXTENSION_MODULE=1 PYO3_NO_PYTHON=1 cargo clippy --lib --features py312 -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --features abi3
	cargo fmt --manifest-path examples/extension/Cargo.toml -- --check
	cargo clippy --manifest-path examples/extension/Cargo.toml -- -D warnings
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy.stubtest cubridge._cubridge --allowlist stubtest-allowlist.txt
	$(BIN)/python tools/module_cycles.py --allow 'cuda::free<->cuda::memory' 'cuda::kernels<->cuda::shipped'

format: $(VENV)/.lint-deps
	cargo fmt --all
	$(BIN)/ruff format .

## bench: the CPU add benchmark (GPU benchmarks: see docs/development.md)
bench: build
	$(BIN)/python benches/cpu_add.py

clean:
	rm -rf $(VENV) target
