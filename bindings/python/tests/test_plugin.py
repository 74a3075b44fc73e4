"""The pytest plugin of the installed wheel, under pytester: registered through its entry point
(no `-p`), its fixtures pass and fail as X-Ray decides, a failure's message is X-Ray's one-line
summary and the evidence path, and pytest's own --junitxml carries both."""
from __future__ import annotations

import importlib.metadata
import xml.etree.ElementTree as ET
from pathlib import Path

from conftest import AUDIO, COMMITTED, MODEL


def test_registered_as_a_pytest11_entry_point():
    eps = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "xray_parity"]
    assert [e.value for e in eps] == ["xray_parity.pytest_plugin"]


def test_fixtures_pass_fail_and_junit(pytester, cache, tmp_path):
    pytester.makepyfile(test_parity=f"""
        MODEL, AUDIO, REF = {str(MODEL)!r}, {str(AUDIO)!r}, {str(COMMITTED)!r}

        def test_clean(xray_check, monkeypatch, tmp_path):
            # A module of the working directory named like the package is never what runs.
            (tmp_path / "xray_parity.py").write_text("open(__file__ + '.ran', 'w')\\n")
            monkeypatch.chdir(tmp_path)
            ev = xray_check(MODEL, AUDIO, max_steps=3)
            assert not (tmp_path / "xray_parity.py.ran").exists()
            assert ev.verdict == "pass"

        def test_planted(xray_check):
            xray_check(MODEL, AUDIO, max_steps=3, args=["--inject", "gelu_tanh", "--no-drill"])

        def test_compare_same(xray_compare):
            xray_compare(REF, REF)

        def test_gate_against_a_broken_baseline(xray_check, xray_gate, tmp_path):
            ev = xray_check(MODEL, AUDIO, max_steps=3)
            import xray_parity
            base = tmp_path / "base.json"
            r = xray_parity.run_xray(["check", "--model", MODEL, "--audio", AUDIO, "--max-steps", "3",
                                      "--inject", "gelu_tanh", "--no-drill",
                                      "--reference-cache", {str(cache)!r}, "--evidence", base],
                                     capture_output=True, text=True)
            assert r.returncode == 1, r.stderr
            xray_gate(base, ev.path)
    """)
    junit = tmp_path / "junit.xml"
    r = pytester.runpytest_subprocess("--xray-reference-cache", str(cache), f"--junitxml={junit}",
                                      "-p", "no:cacheprovider")
    r.assert_outcomes(passed=2, failed=2)
    out = r.stdout.str()
    assert "xray: verdict diverged" in out and "first divergence: " in out
    suites = ET.parse(junit).getroot()
    cases = {c.get("name"): c for c in suites.iter("testcase")}
    assert set(cases) == {"test_clean", "test_planted", "test_compare_same", "test_gate_against_a_broken_baseline"}
    planted = cases["test_planted"].find("failure")
    msg = planted.get("message")
    evidence = [p.get("value") for p in cases["test_planted"].iter("property") if p.get("name") == "xray_evidence"]
    assert len(evidence) == 1 and Path(evidence[0]).is_file()
    # The message: the evidence's one-line headline, then the evidence path.
    import xray_parity as xp
    headline = xp.load_evidence(evidence[0]).headline()
    # (pytest prefixes the message with "Failed: ")
    assert msg.removeprefix("Failed: ").startswith(headline) and f"evidence: {evidence[0]}" in msg, msg
    assert cases["test_clean"].find("failure") is None
    gate_msg = cases["test_gate_against_a_broken_baseline"].find("failure").get("message")
    assert "gate:" in gate_msg and "FAIL" in gate_msg and "evidence: " in gate_msg, gate_msg
