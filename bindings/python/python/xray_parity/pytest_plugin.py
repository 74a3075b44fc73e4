"""The X-Ray pytest plugin (registered through the `pytest11` entry point `xray_parity`).

Fixtures:

    def test_tiny_en(xray_check):
        xray_check("models/tiny.en", "clips/fox.wav")            # `xray check`; fails on divergence

    def test_no_regression(xray_gate):
        xray_gate("out/new.evidence.json", "baseline.evidence.json")   # `xray gate`

    def test_my_engine(xray_compare):
        xray_compare("ref_dump", "my_engine_dump", policy="policy.json")  # `xray compare`

Each returns what X-Ray decided (`Evidence`, `GateResult`) when it passes, and fails the test
when it does not with X-Ray's one-line summary (`Evidence.headline()`, or the gate's verdict
line and first failing finding) and the evidence path; the evidence path is also recorded as the
test's `xray_evidence` property, so `pytest --junitxml` carries both. An input error (X-Ray's
exit 2) fails the test with X-Ray's one error line. Options: `--xray-evidence-dir DIR` (keep
the evidence there; default: the test's tmp_path), `--xray-reference-cache DIR` (the default
`--reference-cache` of `xray_check`).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Sequence

import pytest

import xray_parity


def pytest_addoption(parser) -> None:
    g = parser.getgroup("xray", "X-Ray numerical parity")
    g.addoption("--xray-evidence-dir", metavar="DIR", default=None,
                help="write the evidence of xray_check / xray_compare here (default: each test's tmp_path)")
    g.addoption("--xray-reference-cache", metavar="DIR", default=None,
                help="the reference cache xray_check passes to `xray check --reference-cache` by default")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "xray: a test that checks numerical parity with X-Ray (set by its fixtures)")


def _evidence_path(request, tmp_path: Path, name: str) -> Path:
    d = request.config.getoption("--xray-evidence-dir")
    base = Path(d) if d else tmp_path
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid).strip("_")[:120] or "test"
    return base / f"{stem}.{name}.evidence.json"


def _record(request, path: Path) -> None:
    request.node.add_marker("xray")
    request.node.user_properties.append(("xray_evidence", str(path)))


def _fail(line: str, path: Optional[Path]) -> None:
    text = line if path is None else f"{line}\nevidence: {path}"
    pytest.fail(text, pytrace=False)


@pytest.fixture
def xray_check(request, tmp_path):
    """`xray_check(model, audio, *, reference_cache=None, policy=None, max_steps=None,
    evidence=None, args=())` runs `xray check` (the wheel's CLI), returns its `Evidence` when the
    verdict is pass, else fails the test with the headline and the evidence path."""
    cache_default = request.config.getoption("--xray-reference-cache")

    def check(model, audio, *, reference_cache=None, policy=None, max_steps: Optional[int] = None,
              evidence=None, args: Sequence[str] = ()) -> xray_parity.Evidence:
        path = Path(evidence) if evidence is not None else _evidence_path(request, tmp_path, "check")
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["check", "--model", os.fspath(model), "--audio", os.fspath(audio),
               "--evidence", os.fspath(path)]
        cache = reference_cache if reference_cache is not None else cache_default
        if cache is not None:
            cmd += ["--reference-cache", os.fspath(cache)]
        if policy is not None:
            cmd += ["--policy", os.fspath(policy)]
        if max_steps is not None:
            cmd += ["--max-steps", str(int(max_steps))]
        cmd += [str(a) for a in args]
        p = xray_parity.run_xray(cmd, capture_output=True, text=True)
        _record(request, path)
        if p.returncode not in (0, 1) or not path.is_file():
            errors = [ln for ln in p.stderr.splitlines() if ln.startswith("xray: error:")]
            line = errors[-1] if errors else (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            _fail(f"xray check failed (exit {p.returncode}): {line}", None)
        ev = xray_parity.load_evidence(path)
        if not ev.passed:
            _fail(ev.headline(), path)
        return ev

    return check


@pytest.fixture
def xray_compare(request, tmp_path):
    """`xray_compare(ref_dir, got_dir, *, policy=None, model=None, require_all=False,
    evidence=None)` compares two dumps in-process (`xray_parity.compare`), writes the evidence,
    returns it when it passes, else fails the test with the headline and the evidence path."""
    def compare(ref_dir, got_dir, *, evidence=None, **kw) -> xray_parity.Evidence:
        path = Path(evidence) if evidence is not None else _evidence_path(request, tmp_path, "compare")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            ev = xray_parity.compare(ref_dir, got_dir, **kw)
        except xray_parity.XrayError as e:
            _fail(f"xray compare: error: {e}", None)
        ev.write(path)
        _record(request, path)
        if not ev.passed:
            _fail(ev.headline(), path)
        return ev

    return compare


@pytest.fixture
def xray_gate(request):
    """`xray_gate(evidence, baseline, **options)` gates evidence (an `Evidence`, a file, or a
    corpus directory with a corpus baseline) as `xray gate` does; returns the `GateResult` when
    it passes, else fails the test with the gate's verdict line, its first failing finding and
    the evidence path."""
    def gate(evidence, baseline, **kw) -> xray_parity.GateResult:
        path = evidence.path if isinstance(evidence, xray_parity.Evidence) else Path(evidence)
        if path is not None:
            _record(request, path)
        try:
            r = xray_parity.gate(evidence, baseline, **kw)
        except xray_parity.XrayError as e:
            _fail(f"xray gate: error: {e}", path)
        if not r.passed:
            verdict = r.text().rstrip("\n").splitlines()[-1]
            first = next((m for failing, m in r.findings if failing), "")
            _fail(f"{verdict}; first: {first}" if first else verdict, path)
        return r

    return gate
