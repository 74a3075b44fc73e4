"""fixtures/make_corpus.py: the clean-run speech corpus is deterministic, 1-30 s, >= 30 clips."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from conftest import REPO

import build

CORPUS = REPO / "fixtures" / "build" / "corpus"

pytestmark = pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("sox") is None,
    reason="espeak-ng / sox missing (make fixtures installs them)",
)


def _shas(d):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if f.suffix == ".wav"}


def test_corpus_is_reproducible_and_matches_the_built_one(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "BUILD", tmp_path)
    monkeypatch.setattr(build, "REPO", tmp_path.parent)
    build.build_corpus(force=True)
    first = _shas(tmp_path / "corpus")
    build.build_corpus(force=True)
    assert _shas(tmp_path / "corpus") == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    if CORPUS.is_dir():
        assert _shas(CORPUS) == first


def test_corpus_manifest_lists_at_least_30_clips_of_1_to_30_s(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "BUILD", tmp_path)
    monkeypatch.setattr(build, "REPO", tmp_path.parent)
    line = build.build_corpus(force=False)
    assert "corpus: built" in line
    m = json.loads((tmp_path / "corpus" / "corpus.json").read_text())
    clips = m["clips"]
    assert len(clips) >= 30
    assert all(1.0 <= c["seconds"] <= 30.0 for c in clips)
    assert sum(c["seconds"] <= 5.0 for c in clips) >= 20, "enough clips fit the 5 s windows"
    assert {c["effect"] for c in clips} >= {"none", "noise20", "noise10", "tones", "mix"}
    assert len({c["voice"] for c in clips}) >= 6
    assert "up to date" in build.build_corpus(force=False)
