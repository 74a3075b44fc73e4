# X-Ray: two commands do all set-up on a fresh machine.
#   make demo   - venv + build + fixtures, then `xray check` on real Whisper tiny.en (reports/)
#   make test   - the same set-up, then every test (cargo + pytest + xray selftest), including the
#                 clean-run corpus on the random-init fixtures
#   make corpus - the whole clean-run corpus: every (model, clip) pair that fits, with a margin table
SHELL := /bin/bash
PY_BASE ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PYO3_PYTHON ?= $(shell command -v $(PY_BASE))
# The embedded interpreter's libpython must be found at run time.
export LD_LIBRARY_PATH := $(shell $(PY_BASE) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")'):$(LD_LIBRARY_PATH)
CARGO ?= cargo
XRAY := target/release/xray
AUDIO ?= fixtures/audio/fox.wav

.PHONY: all venv tools fixtures build demo test test-rust test-python test-nopy test-wheel test-ci lint selftest corpus bench candle whispercpp whispercpp-tools whispercpp-models ctranslate2 wheel wheel-pack clean

all: build

$(VENV)/.stamp: oracle/requirements.txt
	$(PY_BASE) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r oracle/requirements.txt
	touch $@

venv: $(VENV)/.stamp

# The speech corpus needs espeak-ng and sox (Debian packages); a fresh machine (CI) gets them here.
APT_GET := $(if $(filter 0,$(shell id -u)),apt-get,sudo apt-get)
tools:
	@command -v espeak-ng >/dev/null && command -v sox >/dev/null || { \
	  echo "installing espeak-ng and sox with apt-get (needed by the speech corpus)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq espeak-ng sox; }

fixtures: venv tools
	$(PY) fixtures/build.py

# whisper.cpp (vendored by whisper-rs-sys) builds with cmake; bindgen needs libclang (Debian).
# GGML_NATIVE=OFF: the same ggml code (x86-64 + AVX2/FMA/F16C, ggml's non-native defaults) on every
# machine, whatever CPU built it, so CI and developers measure one engine.
export GGML_NATIVE := OFF
whispercpp-tools:
	@command -v cmake >/dev/null && { ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang*.so* >/dev/null 2>&1; } || { \
	  echo "installing cmake and libclang-dev with apt-get (needed to build whisper.cpp for engines/whispercpp)"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq cmake libclang-dev; }

# The ggml model files whisper.cpp loads, converted from fixtures/whisper-tiny-en by the project's
# own converter (fixtures/make_ggml.py), f32 and f16, with openai-whisper's mel filter bank read
# from its sdist (downloaded once from PyPI; no network after set-up).
GGML_DIR := fixtures/build/ggml
OPENAI_WHISPER := 20250625
OPENAI_SDIST := $(GGML_DIR)/sdist/openai_whisper-$(OPENAI_WHISPER).tar.gz
$(OPENAI_SDIST): | venv
	mkdir -p $(GGML_DIR)/sdist
	$(PY) -m pip download --quiet openai-whisper==$(OPENAI_WHISPER) --no-deps --no-binary :all: -d $(GGML_DIR)/sdist
# The converted model folder is made by fixtures/build.py (`make fixtures`); the rule names it so a
# target that needs one of its files has a way to make it (on a clean clone it does not exist yet).
TINY_EN := fixtures/whisper-tiny-en/model.safetensors
$(TINY_EN): | venv
	$(PY) fixtures/build.py --only whisper-tiny-en
$(GGML_DIR)/tiny-en-%.bin: fixtures/make_ggml.py $(OPENAI_SDIST) $(TINY_EN)
	$(PY) fixtures/make_ggml.py --model fixtures/whisper-tiny-en --ftype $* --out $@
whispercpp-models: fixtures $(GGML_DIR)/tiny-en-f32.bin $(GGML_DIR)/tiny-en-f16.bin

# The candle engine (engines/candle-whisper) and the whisper.cpp engine (engines/whispercpp: a
# cmake build of the vendored whisper.cpp + ggml) are left out of the plain build; `make test`
# builds and tests them, `make candle` / `make whispercpp` build and run them.
build:
	$(CARGO) build --release --workspace --exclude xray-candle-whisper --exclude xray-whispercpp

demo: venv fixtures build
	mkdir -p reports
	$(XRAY) check --model fixtures/whisper-tiny-en --audio $(AUDIO) \
	  --evidence reports/demo.evidence.json --report reports/demo.html --markdown reports/demo.md
	@echo "report: reports/demo.html  evidence: reports/demo.evidence.json"

# Every guard (xray_core::testing) appends a skipped test to $(SKIPS): a missing fixture fails here
# (XRAY_REQUIRE_FIXTURES), so what is left is a CPU without a kernel's feature or an environment
# condition; `make test` ends by printing the count and the lines (.ci/skips). Absolute: each test
# binary runs in its own crate's directory.
SKIPS := $(CURDIR)/target/test-skips.txt

# harness/tests/it/e2e.rs runs target/release/xray-nopy (made by test-nopy) on a reference cache the
# oracle build fills.
test-rust: venv fixtures whispercpp-tools whispercpp-models test-nopy
	mkdir -p target && : > $(SKIPS)
	XRAY_REQUIRE_FIXTURES=1 XRAY_SKIP_LEDGER=$(SKIPS) $(CARGO) test --release --workspace
	@bash .ci/skips $(SKIPS)

# The CTranslate2 engine's e2e test (engines/ctranslate2/tests) runs here too: CI installs ctranslate2
# (oracle/requirements-bench.txt: one 42.6 MB wheel, 146 MB installed, ~3 s from pip's cache, next
# to torch's ~1 GB), so under XRAY_REQUIRE_FIXTURES the test fails rather than skips without it. It
# needs target/release/xray (test-rust builds it first in `make test`).
test-python: venv fixtures $(VENV)/.bench-stamp
	XRAY_REQUIRE_FIXTURES=1 $(PY) -m pytest -q oracle/tests engines/ctranslate2/tests

selftest: build fixtures
	$(XRAY) selftest

# The comparison side without Python: `xray-nopy`, the CLI built with --no-default-features (no
# oracle, no libpython), runs the runtime, compares with the committed oracle dump, gates, and
# refuses a check without a reference cache or with a miss (.ci/nopy-check; its warm-cache check
# is in harness/tests/it/e2e.rs, which needs an oracle build to fill the cache). A binary of its
# own name (harness/src/nopy.rs, feature `nopy`) in the same target directory: building it never
# touches target/release/xray. Resolved over the whole workspace, with the features core/Cargo.toml
# unifies (.ci/unified), so it shares every crate but xray's own with test-rust's build.
test-nopy: fixtures
	$(CARGO) build --release --workspace --no-default-features --features xray/nopy --bin xray-nopy
	bash .ci/nopy-check target/release/xray-nopy

# Fails on unformatted Rust, any clippy warning (every target of every member, and of the bindings'
# own workspace; --release shares the proc-macros and build scripts of the release build) and
# ruff's findings in oracle/, fixtures/, engines/, bindings/python/
# (ruff.toml; ruff is pinned in oracle/requirements.txt), and on a crate whose features differ
# with and without the dev-dependencies (.ci/unified: the build would compile it twice).
RUFF ?= $(VENV)/bin/ruff
LINT_TARGETS := demo test corpus bench candle whispercpp ctranslate2 wheel
lint: venv whispercpp-tools
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path $(BINDINGS)/Cargo.toml -- --check
	@# The CLI's entry is include!d by both binaries' roots, which rustfmt does not follow.
	rustfmt --edition 2021 --check harness/src/entry.rs
	@# The recipes `make test` does not run are still valid shell (a lost `done` once broke
	@# `make whispercpp` unnoticed), and every prerequisite has a rule on a clean clone (a missing
	@# one once failed CI's lint while the developer's tree, with fixtures built, passed):
	@# printed by make -n here and in a copy of the tracked files, parsed by bash -n, nothing run.
	bash .ci/make-n $(LINT_TARGETS)
	$(RUFF) check --no-cache oracle fixtures engines $(BINDINGS)
	$(PY_BASE) .ci/unified
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	CARGO_TARGET_DIR=$(CURDIR)/target/python-bindings $(CARGO) clippy --manifest-path $(BINDINGS)/Cargo.toml --all-targets --release -- -D warnings

# The xray_parity wheel (bindings/python, docs/python.md): the Python API's extension module
# (maturin, pinned in bindings/python/requirements-build.txt and installed into its own venv),
# the oracle package (oracle/xray_oracle, copied in) and target/release/xray (debug info
# stripped) as the `xray` command. `make wheel` builds the workspace first; `wheel-pack` packs
# the xray that is there (`make test` packs the one test-rust built from the same sources). The
# extension has its own cargo workspace and target directory (bindings/python/Cargo.toml says why).
WHEEL_DIR := target/wheels
MATURIN_VENV := target/maturin-venv
BINDINGS := bindings/python
$(MATURIN_VENV)/.stamp: $(BINDINGS)/requirements-build.txt
	$(PY_BASE) -m venv $(MATURIN_VENV)
	$(MATURIN_VENV)/bin/pip install --quiet -r $(BINDINGS)/requirements-build.txt
	touch $@
wheel-pack: $(MATURIN_VENV)/.stamp
	$(PY_BASE) $(BINDINGS)/check_extra.py
	@test -x $(XRAY) || { echo "wheel: $(XRAY) is not built (make build)" >&2; exit 2; }
	rm -rf $(BINDINGS)/python/xray_oracle $(BINDINGS)/python/xray_parity/bin
	mkdir -p $(BINDINGS)/python/xray_oracle $(BINDINGS)/python/xray_parity/bin
	cp oracle/xray_oracle/*.py $(BINDINGS)/python/xray_oracle/
	strip --strip-debug -o $(BINDINGS)/python/xray_parity/bin/xray $(XRAY)
	rm -f $(WHEEL_DIR)/xray_parity-*.whl
	cd $(BINDINGS) && CARGO_TARGET_DIR=$(CURDIR)/target/python-bindings \
	  $(CURDIR)/$(MATURIN_VENV)/bin/maturin build --quiet --release --out $(CURDIR)/$(WHEEL_DIR) -i $(PYO3_PYTHON)
	@ls -l $(WHEEL_DIR)/xray_parity-*.whl
wheel: build
	$(MAKE) wheel-pack

# The wheel installed into a fresh venv (no torch): `xray --version`, the Python API on the
# committed dumps, the CLI, a torch-free `xray check` from a reference cache, and the pytest
# plugin under pytester (bindings/python/tests; fresh-venv.sh prints its timings).
test-wheel: venv fixtures wheel-pack
	bash $(BINDINGS)/tests/fresh-venv.sh $(WHEEL_DIR)

# docs/ci.md's GitHub Actions recipe, run locally on the committed clips (.ci/gate-local.sh).
test-ci: venv fixtures
	bash .ci/gate-local.sh $(XRAY)

# `cargo test` leaves target/release/xray built from the same sources (with the dev-dependency
# feature set), so the self-test runs it as is instead of a second release build of the workspace.
test: lint test-nopy test-rust test-python
	$(XRAY) selftest
	$(MAKE) test-wheel test-ci
	@bash .ci/skips $(SKIPS)

# Every (model, clip) pair of the corpus that fits, tiny.en included; fails on any divergence and
# writes the margin table to reports/corpus.md.
corpus: venv fixtures
	mkdir -p reports
	XRAY_REQUIRE_FIXTURES=1 XRAY_CORPUS=full XRAY_CORPUS_TABLE=reports/corpus.md \
	  $(CARGO) test --release -p xray --test it -- corpus:: --nocapture --test-threads 1

# `xray bench`: the runtime against torch (SDPA, eager) and CTranslate2 (installed here from
# oracle/requirements-bench.txt), at 2 and 1 threads on tiny.en; then the cost growth on a
# whisper-small-geometry fixture (random-init, f16-rounded weights, ~1 GB, built on demand) with
# `xray check --stats-only` (summaries instead of tensors on both sides; it prints its peak RSS,
# getrusage; the bench JSON has peak_rss_bytes). The clean check must pass: a divergence fails
# the target.
BENCH_AUDIO ?= fixtures/audio/stella.wav
BENCH_OUT ?= reports/bench
# Clips for the corpus-mode timing (`xray check` over all of them in one process vs one clip alone).
BENCH_CORPUS ?= fixtures/audio/fox.wav fixtures/audio/stella.wav fixtures/audio/weather.wav
$(VENV)/.bench-stamp: $(VENV)/.stamp oracle/requirements-bench.txt
	$(PY) -m pip install --quiet -r oracle/requirements-bench.txt
	touch $@
bench: build fixtures $(VENV)/.bench-stamp
	$(PY) fixtures/make_whisper_small.py
	mkdir -p $(BENCH_OUT)
	set -o pipefail; $(XRAY) bench --model fixtures/whisper-tiny-en --audio $(BENCH_AUDIO) --threads 2 --json \
	  --corpus $(BENCH_CORPUS) | tee $(BENCH_OUT)/tiny-2t.json
	set -o pipefail; $(XRAY) bench --model fixtures/whisper-tiny-en --audio $(BENCH_AUDIO) --threads 1 --json | tee $(BENCH_OUT)/tiny-1t.json
	set -o pipefail; $(XRAY) bench --model fixtures/build/whisper-small-f16 --audio $(BENCH_AUDIO) --threads 2 --reps 3 --json | tee $(BENCH_OUT)/small-2t.json
	$(XRAY) check --model fixtures/build/whisper-small-f16 --audio $(BENCH_AUDIO) --stats-only \
	  --evidence $(BENCH_OUT)/small-check.json

# candle-transformers' Whisper under X-Ray: reference dump, candle's dump as it is and fed the
# reference's log-mel (its encoder isolated) and memory + tokens (its decoder isolated), one offline
# comparison with per-stage local errors. `xray compare` exits 1 on a divergence (the finding,
# reported), 2 on an error (fails the target). Then the mel-fed run with its checkpoints written as
# the op-level points they are (--ops): compared, its whole encoder replayed and cut into a repro
# case, which candle's encoder run alone (xray-candle-op) fails (`xray replay` exits 1) and X-Ray's
# own ops pass (docs/engines/candle.md, "candle's encoder as a repro case").
CANDLE_OUT ?= reports/candle
CANDLE = target/release/xray-candle-whisper --model fixtures/whisper-tiny-en --audio $(AUDIO) --force
candle: build fixtures
	$(CARGO) build --release -p xray-candle-whisper
	mkdir -p $(CANDLE_OUT)
	$(XRAY) oracle --model fixtures/whisper-tiny-en --audio $(AUDIO) --out $(CANDLE_OUT)/ref --force --ops
	$(CANDLE) --out $(CANDLE_OUT)/candle
	$(CANDLE) --out $(CANDLE_OUT)/candle-mel-fed --mel-from $(CANDLE_OUT)/ref
	$(CANDLE) --out $(CANDLE_OUT)/candle-memory-fed --memory-from $(CANDLE_OUT)/ref --tokens-from $(CANDLE_OUT)/ref
	$(XRAY) compare $(CANDLE_OUT)/ref $(CANDLE_OUT)/candle --model fixtures/whisper-tiny-en \
	  --isolated $(CANDLE_OUT)/candle-mel-fed --isolated $(CANDLE_OUT)/candle-memory-fed \
	  --evidence $(CANDLE_OUT)/evidence.json \
	  --report $(CANDLE_OUT)/report.html --markdown $(CANDLE_OUT)/report.md; test $$? -le 1
	$(CANDLE) --out $(CANDLE_OUT)/candle-mel-fed-ops --mel-from $(CANDLE_OUT)/ref --ops
	$(XRAY) compare $(CANDLE_OUT)/ref $(CANDLE_OUT)/candle-mel-fed-ops --model fixtures/whisper-tiny-en \
	  --evidence $(CANDLE_OUT)/encoder.evidence.json; test $$? -eq 1
	$(XRAY) repro $(CANDLE_OUT)/encoder.evidence.json --out $(CANDLE_OUT)/encoder-case --force
	rm -f $(CANDLE_OUT)/encoder-candle.npy
	target/release/xray-candle-op $(CANDLE_OUT)/encoder-case --out $(CANDLE_OUT)/encoder-candle.npy
	$(XRAY) replay $(CANDLE_OUT)/encoder-case --got $(CANDLE_OUT)/encoder-candle.npy; test $$? -eq 1
	$(XRAY) replay $(CANDLE_OUT)/encoder-case --runtime

# whisper.cpp under X-Ray, per model (f32, f16) on $(AUDIO): the reference dump, whisper.cpp as it is
# (flash attention off, and on), fed the reference's log-mel (its encoder and decoder isolated from
# its mel) and the reference's log-mel + tokens (teacher-forced), one offline comparison with
# per-stage local errors; then plain and flash compared again accepting f16-level error
# (engines/whispercpp/policies/f16-accepted.json). The f32 model runs with --im2col-stub (whisper.cpp 1.8.3 aborts on an f32
# model's conv otherwise: engines/whispercpp/src/ffi.rs). `xray compare` exits 1 on a divergence
# (the finding, reported), 2 on an error (fails the target).
WHISPERCPP_OUT ?= reports/whispercpp
WCPP = target/release/xray-whispercpp --model fixtures/whisper-tiny-en --audio $(AUDIO) --force --im2col-stub
whispercpp: build fixtures whispercpp-tools whispercpp-models
	$(CARGO) build --release -p xray-whispercpp
	mkdir -p $(WHISPERCPP_OUT)
	$(XRAY) oracle --model fixtures/whisper-tiny-en --audio $(AUDIO) --out $(WHISPERCPP_OUT)/ref --force --ops
	set -e; for m in f32 f16; do \
	  $(WCPP) --ggml $(GGML_DIR)/tiny-en-$$m.bin --out $(WHISPERCPP_OUT)/$$m --ops; \
	  $(WCPP) --ggml $(GGML_DIR)/tiny-en-$$m.bin --out $(WHISPERCPP_OUT)/$$m-flash --flash-attn --ops; \
	  $(WCPP) --ggml $(GGML_DIR)/tiny-en-$$m.bin --out $(WHISPERCPP_OUT)/$$m-mel-fed --mel-from $(WHISPERCPP_OUT)/ref --no-neutrality; \
	  $(WCPP) --ggml $(GGML_DIR)/tiny-en-$$m.bin --out $(WHISPERCPP_OUT)/$$m-fed --mel-from $(WHISPERCPP_OUT)/ref --tokens-from $(WHISPERCPP_OUT)/ref --no-neutrality; \
	  $(XRAY) compare $(WHISPERCPP_OUT)/ref $(WHISPERCPP_OUT)/$$m --model fixtures/whisper-tiny-en \
	    --isolated $(WHISPERCPP_OUT)/$$m-mel-fed --isolated $(WHISPERCPP_OUT)/$$m-fed \
	    --evidence $(WHISPERCPP_OUT)/$$m.evidence.json \
	    --report $(WHISPERCPP_OUT)/$$m.html --markdown $(WHISPERCPP_OUT)/$$m.md || test $$? -le 1; \
	  for run in $$m $$m-flash; do \
	    $(XRAY) compare $(WHISPERCPP_OUT)/ref $(WHISPERCPP_OUT)/$$run --model fixtures/whisper-tiny-en \
	      --policy engines/whispercpp/policies/f16-accepted.json \
	      --evidence $(WHISPERCPP_OUT)/$$run.f16-accepted.evidence.json || test $$? -le 1; \
	  done; \
	done

# CTranslate2's Whisper (engines/ctranslate2, Python; ctranslate2 from oracle/requirements-bench.txt)
# under X-Ray, per clip: the reference dump and two reference variants (HF weights on CTranslate2's
# per-row int8 grid; also the GEMM inputs), CTranslate2 at f32 and int8, each plain and fed the
# reference's memory + tokens (its decoder isolated), compared offline (int8 also against the
# variants: how much of its divergence int8 explains). `xray compare` exits 1 on a divergence
# (int8's finding, reported), 2 on an error (fails the target).
CT2_OUT ?= reports/ctranslate2
CT2_CLIPS ?= fox stella
CT2 = $(PY) engines/ctranslate2/xray_ct2.py --model fixtures/whisper-tiny-en --force
ctranslate2: build fixtures $(VENV)/.bench-stamp
	mkdir -p $(CT2_OUT)
	set -e; for clip in $(CT2_CLIPS); do \
	  o=$(CT2_OUT)/$$clip; a=fixtures/audio/$$clip.wav; \
	  $(XRAY) oracle --model fixtures/whisper-tiny-en --audio $$a --out $$o/ref --force; \
	  for v in int8 int8_w8a8; do \
	    $(XRAY) oracle --model fixtures/whisper-tiny-en --audio $$a --out $$o/ref-$$v --force --weights-variant $$v; \
	  done; \
	  for ct in float32 int8; do \
	    $(CT2) --audio $$a --compute-type $$ct --out $$o/$$ct; \
	    $(CT2) --audio $$a --compute-type $$ct --out $$o/$$ct-fed --memory-from $$o/ref --tokens-from $$o/ref; \
	    variants=; test $$ct = int8 && variants="--variant $$o/ref-int8 --variant $$o/ref-int8_w8a8"; \
	    rc=0; $(XRAY) compare $$o/ref $$o/$$ct --isolated $$o/$$ct-fed $$variants --evidence $$o/$$ct.evidence.json \
	      --markdown $$o/$$ct.md || rc=$$?; test $$rc -le 1; \
	  done; \
	done

clean:
	$(CARGO) clean
	rm -rf fixtures/build fixtures/whisper-tiny-en
