"""Shared paths of the wheel's tests. They run in a fresh venv with the wheel installed
(fresh-venv.sh, `make test-wheel`), which sets XRAY_ROOT (the checkout: committed dumps, built
fixtures), XRAY_TEST_CACHE (a reference cache holding whisper-rand-a on fox.wav, 3 steps) and
XRAY_TEST_VENV (the fresh venv)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


def _env(name: str) -> Path:
    v = os.environ.get(name)
    if not v:
        raise pytest.UsageError(f"{name} is not set: run these tests through bindings/python/tests/fresh-venv.sh")
    return Path(v)


ROOT = _env("XRAY_ROOT")
CACHE = _env("XRAY_TEST_CACHE")
VENV = _env("XRAY_TEST_VENV")
COMMITTED = ROOT / "fixtures/dumps/whisper-rand-a.fox"
MODEL = ROOT / "fixtures/build/whisper-rand-a"
AUDIO = ROOT / "fixtures/audio/fox.wav"
XRAY = VENV / "bin/xray"


@pytest.fixture
def cache(tmp_path) -> Path:
    """A private copy of the filled reference cache (a test never changes the shared one)."""
    d = tmp_path / "cache"
    shutil.copytree(CACHE, d)
    return d
