"""Shared pytest setup: import paths, fixture locations, and one in-process call of
fixtures/build.py (idempotent, ~0.2 s when cached) so the tests never see a missing fixture."""
from __future__ import annotations

import os
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
CONTRACT = REPO / "core" / "contracts" / "whisper.json"

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


@pytest.fixture(scope="session")
def contract_text() -> str:
    return CONTRACT.read_text(encoding="utf-8")
