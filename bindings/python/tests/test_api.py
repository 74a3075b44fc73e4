"""The Python API of the installed wheel on the committed dump: loading, the Rust dump writer
(byte for byte the committed files and xray_oracle's writer), compare (the same evidence as the
CLI), gate, reports, and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import xray_parity as xp
from conftest import COMMITTED, VENV, XRAY


def copy_dump(src: xp.Dump, out: Path, change=None) -> Path:
    """Writes `src`'s tensors and identity through xray_parity.DumpWriter; `change(name, step, a)`
    may return a replacement array."""
    m = src.manifest
    w = xp.DumpWriter(family=m["family"], model_id=m["model_id"], producer="copy",
                      weights_sha256=m["weights_sha256"], audio_sha256=m["audio_sha256"],
                      tools=m.get("tools"))
    for e in m["checkpoints"]:
        a = src.array(e["name"], e["step"])
        if change is not None:
            a = change(e["name"], e["step"], a)
        w.add(e["name"], e["step"], e["layout"], a)
    w.tokens, w.transcript = m["tokens"], m["transcript"]
    w.extra = {"config": m["extra"]["config"]}
    return w.write(out)


def test_installed_from_the_wheel():
    site = next((VENV / "lib").glob("python3.*/site-packages"))
    assert Path(xp.__file__).resolve().is_relative_to(site.resolve())
    assert xp.xray_executable().resolve().is_relative_to(site.resolve())
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    assert r.returncode != 0, "torch must not be installed in the fresh venv"


def test_load_dump_matches_its_manifest():
    d = xp.load_dump(COMMITTED)
    m = json.loads((COMMITTED / "manifest.json").read_text())
    assert d.family == m["family"] == "whisper"
    assert d.keys() == [(e["name"], e["step"]) for e in m["checkpoints"]]
    for e in m["checkpoints"]:
        a = d.array(e["name"], e["step"])
        assert a.dtype == np.float32 and list(a.shape) == e["shape"]
        assert np.array_equal(a, np.load(COMMITTED / e["file"], allow_pickle=False))
    with pytest.raises(KeyError):
        d.array("no.such.checkpoint", 0)


def test_writer_is_the_rust_writer(tmp_path):
    d = xp.load_dump(COMMITTED)
    out = copy_dump(d, tmp_path / "copy")
    for e in d.manifest["checkpoints"]:
        # The same f32 payload as the committed file (whose header an older numpy spelled).
        ours, theirs = (out / e["file"]).read_bytes(), (COMMITTED / e["file"]).read_bytes()
        n = 4 * int(np.prod(e["shape"]))
        assert len(ours) % 64 == n % 64 and ours[-n:] == theirs[-n:], e["file"]
        assert np.array_equal(np.load(out / e["file"], allow_pickle=False), d.array(e["name"], e["step"]))
    # xray_oracle's pure-Python writer (shipped in the wheel) is byte-identical, manifest too.
    from xray_oracle.dump import DumpWriter as PyWriter
    m = d.manifest
    w = PyWriter(family=m["family"], model_id=m["model_id"], producer="copy",
                 weights_sha256=m["weights_sha256"], audio_sha256=m["audio_sha256"], tools=m.get("tools"))
    for e in m["checkpoints"]:
        w.add(e["name"], e["step"], e["layout"], d.array(e["name"], e["step"]))
    w.tokens, w.transcript = m["tokens"], m["transcript"]
    w.extra = {"config": m["extra"]["config"]}
    py_out = w.write(tmp_path / "py")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in Path(py_out).iterdir())
    for p in out.iterdir():
        assert p.read_bytes() == (Path(py_out) / p.name).read_bytes(), p.name


def test_compare_pass_and_a_planted_divergence(tmp_path):
    d = xp.load_dump(COMMITTED)
    same = xp.compare(COMMITTED, copy_dump(d, tmp_path / "same"))
    assert same.verdict == "pass" and same.passed
    cps = same.to_dict()["checkpoints"]
    assert len(cps) == len(d.keys()) and all(c["status"] == "pass" for c in cps)
    assert same.headline().startswith(f"xray: verdict pass ({len(cps)}/{len(cps)} checkpoints pass")
    # One encoder layer's output scaled by 1.02 at step 0: the origin is that checkpoint, named.
    target = next(n for n, s in d.keys() if n.startswith("audio.encoder.layer.") and n.endswith(".out"))
    ev = xp.compare(COMMITTED, copy_dump(d, tmp_path / "bad",
                                        lambda n, s, a: a * 1.02 if n == target else a))
    assert ev.verdict == "diverged" and not ev.passed
    fd = ev.first_divergence
    assert (fd["checkpoint"], fd["step"]) == (target, 0)
    assert f"first divergence: {target}@step0" in ev.headline()
    assert "\n" not in ev.headline()
    assert ev.summary().splitlines()[0] == ev.headline().split("; ")[0]


def test_compare_is_the_cli_compare(tmp_path):
    d = xp.load_dump(COMMITTED)
    target = [n for n, s in d.keys() if n.startswith("audio.decoder.layer.")][0]
    bad = copy_dump(d, tmp_path / "bad", lambda n, s, a: a[..., ::-1].copy() if n == target and s == 1 else a)
    ev = xp.compare(COMMITTED, bad)
    r = subprocess.run([str(XRAY), "compare", str(COMMITTED), str(bad), "--evidence", str(tmp_path / "cli.json")],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    cli = json.loads((tmp_path / "cli.json").read_text())
    assert ev.to_dict() == cli
    # The CLI's stderr summary is the API's summary, line for line.
    assert ev.summary() in r.stderr


def test_gate_reports_and_round_trip(tmp_path):
    d = xp.load_dump(COMMITTED)
    good = xp.compare(COMMITTED, copy_dump(d, tmp_path / "good"))
    good.write(tmp_path / "good.json")
    back = xp.load_evidence(tmp_path / "good.json")
    assert back.to_dict() == good.to_dict() and back.path == tmp_path / "good.json"
    g = xp.gate(good, tmp_path / "good.json")
    assert g.passed and len(g.checked) == len(d.keys()) and g.text().rstrip().endswith("PASS")
    worse = xp.compare(COMMITTED, copy_dump(d, tmp_path / "worse", lambda n, s, a: a * 1.001))
    g = xp.gate(worse, good)
    assert not g.passed and any(f for f, _ in g.findings)
    junit = g.junit_xml()
    assert "<testsuite" in junit and "<failure" in junit
    assert xp.render_html(tmp_path / "good.json") == good.html() and "<html" in good.html()
    assert "pass" in xp.render_markdown(good)


def test_errors_are_one_line(tmp_path):
    with pytest.raises(xp.XrayError) as e:
        xp.load_dump(tmp_path / "missing")
    assert "missing" in str(e.value) and "\n" not in str(e.value)
    # A tampered tensor file: its sha256 no longer matches the manifest's.
    bad = copy_dump(xp.load_dump(COMMITTED), tmp_path / "tampered")
    f = sorted(bad.glob("*.npy"))[0]
    f.write_bytes(f.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(xp.XrayError) as e:
        xp.compare(COMMITTED, bad)
    assert f.name in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(xp.XrayError, match="sha256"):
        xp.DumpWriter(family="whisper", model_id="m", producer="e", weights_sha256="x", audio_sha256="0" * 64)
    with pytest.raises(xp.XrayError, match="X-Ray's own"):
        xp.DumpWriter(family="whisper", model_id="m", producer="oracle", weights_sha256="0" * 64, audio_sha256="0" * 64)
    w = xp.DumpWriter(family="whisper", model_id="m", producer="e", weights_sha256="0" * 64, audio_sha256="0" * 64)
    w.add("a", 0, "plain", np.zeros(3))
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "notes.txt").write_text("mine")
    with pytest.raises(xp.XrayError):
        w.write(tmp_path / "occupied")
    assert (tmp_path / "occupied" / "notes.txt").read_text() == "mine"
    with pytest.raises(xp.XrayError):
        xp.gate(tmp_path / "nope.json", tmp_path / "nope2.json")
