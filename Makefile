# X-Ray: two commands do all set-up on a fresh machine.
#   make demo   - venv + build + fixtures, then `xray check` on real Whisper tiny.en (reports/)
#   make test   - the same set-up, then every test (cargo + pytest + xray selftest)
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

.PHONY: all venv fixtures build demo test test-rust test-python selftest bench candle clean

all: build

$(VENV)/.stamp: oracle/requirements.txt
	$(PY_BASE) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r oracle/requirements.txt
	touch $@

venv: $(VENV)/.stamp

fixtures: venv
	$(PY) fixtures/build.py

# The candle engine (engines/candle-whisper) is left out of the plain build (candle-transformers is a
# long compile); `make test` builds and tests it, `make candle` builds and runs it.
build:
	$(CARGO) build --release --workspace --exclude xray-candle-whisper

demo: venv fixtures build
	mkdir -p reports
	$(XRAY) check --model fixtures/whisper-tiny-en --audio $(AUDIO) \
	  --evidence reports/demo.evidence.json --report reports/demo.html --markdown reports/demo.md
	@echo "report: reports/demo.html  evidence: reports/demo.evidence.json"

test-rust: venv fixtures
	XRAY_REQUIRE_FIXTURES=1 $(CARGO) test --release --workspace

test-python: venv fixtures
	$(PY) -m pytest -q oracle/tests

selftest: build fixtures
	$(XRAY) selftest

# `cargo test` leaves target/release/xray built from the same sources (with the dev-dependency
# feature set), so the self-test runs it as is instead of a second release build of the workspace.
test: test-rust test-python
	$(XRAY) selftest

bench: build fixtures
	$(XRAY) bench --model fixtures/whisper-tiny-en --audio $(AUDIO)

# candle-transformers' Whisper under X-Ray: reference dump, candle's dump, offline comparison.
# `xray compare` exits 1 on a divergence (the finding, reported), 2 on an error (fails the target).
CANDLE_OUT ?= reports/candle
candle: build fixtures
	$(CARGO) build --release -p xray-candle-whisper
	mkdir -p $(CANDLE_OUT)
	$(XRAY) oracle --model fixtures/whisper-tiny-en --audio $(AUDIO) --out $(CANDLE_OUT)/ref
	target/release/xray-candle-whisper --model fixtures/whisper-tiny-en --audio $(AUDIO) --out $(CANDLE_OUT)/candle
	$(XRAY) compare $(CANDLE_OUT)/ref $(CANDLE_OUT)/candle --evidence $(CANDLE_OUT)/evidence.json \
	  --report $(CANDLE_OUT)/report.html --markdown $(CANDLE_OUT)/report.md; test $$? -le 1

clean:
	$(CARGO) clean
	rm -rf fixtures/build fixtures/whisper-tiny-en
