"""Shared pytest setup: import paths, fixture locations, and one in-process call of
fixtures/build.py (idempotent, ~0.2 s when cached) so the tests never see a missing fixture."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "oracle"))
sys.path.insert(0, str(REPO / "fixtures"))

TINY_EN = REPO / "fixtures" / "whisper-tiny-en"
RAND_A = REPO / "fixtures" / "build" / "whisper-rand-a"
RAND_B = REPO / "fixtures" / "build" / "whisper-rand-b"
AUDIO = REPO / "fixtures" / "audio"
EDGE_AUDIO = REPO / "fixtures" / "build" / "audio"
# The oracle reads contracts resolved by X-Ray's Rust core (`xray contract`); either build of xray
# (with or without the oracle feature) prints them.
XRAY_BINS = [REPO / "target" / "release" / "xray", REPO / "target" / "release" / "xray-nopy"]

# What espeak-ng says in each committed clip (fixtures/audio/transcripts.tsv) and the words of it
# that tiny.en must recognise (espeak's voice is robotic; tiny.en gets most, not all, words right).
EXPECTED_WORDS = {
    "fox.wav": ["quick", "over", "lazy", "dog"],
    "stella.wav": ["please", "call", "stella", "bring", "these", "things"],
    "weather.wav": ["very", "nice", "walk", "park"],
}


def require_fixture(path: Path) -> Path:
    """`path` if it exists; else the test is skipped with a notice, or fails when
    XRAY_REQUIRE_FIXTURES is set (`make test` sets it): a skip must not pass for a result there."""
    if path.exists():
        return path
    why = f"fixture {path} is missing (run `make fixtures`)"
    if os.environ.get("XRAY_REQUIRE_FIXTURES"):
        pytest.fail(f"{why} and XRAY_REQUIRE_FIXTURES is set", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def built_fixtures():
    import build

    rc = build.main(["--only", "whisper-tiny-en", "whisper-rand-a", "whisper-rand-b", "audio"])
    if rc != 0:
        pytest.exit("fixtures/build.py failed (see its output above); run `make fixtures`", returncode=1)


_resolved: dict[str, str] = {}


def resolved_contract(model_dir) -> str:
    """The model's contract resolved by `xray contract --model DIR` (the newest build of xray)."""
    key = str(model_dir)
    if key not in _resolved:
        built = [p for p in XRAY_BINS if p.is_file()]
        if not built:
            pytest.fail("no target/release/xray: the oracle reads contracts resolved by X-Ray's Rust core; run `make build`")
        exe = max(built, key=lambda p: p.stat().st_mtime)
        r = subprocess.run([str(exe), "contract", "--model", key], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"{exe} contract --model {key}: exit {r.returncode}: {r.stderr.strip()}")
        _resolved[key] = r.stdout
    return _resolved[key]
