"""The `xray` command of the installed wheel: its version and oracle discovery (the venv it is
installed in, never the checkout that built it), `xray run` + `xray compare` against the committed
dump, a torch-free `xray check` from a reference cache, and one-line refusals."""
from __future__ import annotations

import json
import subprocess

import xray_parity as xp
from conftest import AUDIO, COMMITTED, MODEL, VENV, XRAY, ROOT


def xray(*args, cwd=None):
    return subprocess.run([str(XRAY), *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_version_finds_the_oracle_in_its_own_venv(tmp_path):
    r = xray("--version", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[-1] == xp.__version__
    assert f"oracle venv: {VENV.resolve()} (the venv the xray_parity wheel is installed in" in r.stdout
    assert "installed by the xray_parity wheel" in r.stdout
    assert str(ROOT) not in r.stdout, "the checkout that built the wheel is no place to look"


def test_run_then_compare_with_the_committed_dump(tmp_path):
    r = xray("run", "--model", MODEL, "--audio", AUDIO, "--out", tmp_path / "run", "--max-steps", "3")
    assert r.returncode == 0, r.stderr
    ev = xp.compare(COMMITTED, tmp_path / "run")
    assert ev.verdict == "pass", ev.summary()
    r = xray("compare", COMMITTED, tmp_path / "run", "--evidence", tmp_path / "e.json")
    assert r.returncode == 0 and "xray: verdict pass" in r.stderr, r.stderr
    assert xp.load_evidence(tmp_path / "e.json").to_dict()["checkpoints"] == ev.to_dict()["checkpoints"]
    r = xray("gate", "--evidence", tmp_path / "e.json", "--baseline", tmp_path / "e.json")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("PASS")


def test_check_from_the_reference_cache_without_torch(tmp_path, cache):
    r = xray("check", "--model", MODEL, "--audio", AUDIO, "--max-steps", "3",
             "--reference-cache", cache, "--evidence", tmp_path / "warm.json")
    assert r.returncode == 0, r.stderr
    ev = json.loads((tmp_path / "warm.json").read_text())
    assert ev["verdict"] == "pass" and ev["run"]["reference_cache"]["hit"] is True
    # A planted fault: the same cached reference, the origin found (no drill-down: its op-level
    # reference is not cached, and there is no torch to compute it).
    r = xray("check", "--model", MODEL, "--audio", AUDIO, "--max-steps", "3", "--no-drill",
             "--inject", "gelu_tanh", "--reference-cache", cache, "--evidence", tmp_path / "f.json")
    assert r.returncode == 1, r.stderr
    assert xp.load_evidence(tmp_path / "f.json").verdict == "diverged"


def test_a_miss_without_torch_is_one_line(tmp_path, cache):
    r = xray("check", "--model", MODEL, "--audio", AUDIO, "--max-steps", "2",
             "--reference-cache", cache, "--evidence", tmp_path / "miss.json")
    assert r.returncode == 2
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("xray: error:")]
    assert len(errors) == 1 and "torch" in errors[0], r.stderr
    assert not (tmp_path / "miss.json").exists()


def test_bad_input_exits_2_with_one_line(tmp_path):
    r = xray("compare", tmp_path / "none", COMMITTED)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "xray: error:" in r.stderr, r.stderr
