"""xray_oracle.dump: byte-exact .npy, writer/reader round trip, fail-closed loading."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from xray_oracle.dump import DumpError, npy_bytes, parse_npy, read_dump, write_dump


@pytest.mark.parametrize(
    "a",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.zeros((6, 1, 64), np.float32),
        np.linspace(-1, 1, 7, dtype=np.float64),
        np.ones((3, 0), np.float16),
        np.array(3.5, np.float32),
        np.array([50257, 50362, 383], np.int64),
        np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],  # non-contiguous input
        np.arange(4, dtype=">f4"),  # big-endian input is stored little-endian
    ],
)
def test_npy_bytes_match_numpy_save(a):
    buf = io.BytesIO()
    np.save(buf, np.array(a, dtype=a.dtype.newbyteorder("<"), order="C"))
    assert npy_bytes(a) == buf.getvalue()
    b = parse_npy(npy_bytes(a), "x.npy")
    np.testing.assert_array_equal(a, b)
    assert (10 + int.from_bytes(npy_bytes(a)[8:10], "little")) % 64 == 0


def _entries():
    rng = np.random.default_rng(0)
    return [
        {"name": "audio.frontend.mel", "step": 0, "layout": "channel_major", "array": rng.standard_normal((4, 6)).astype(np.float32)},
        {"name": "audio.decoder.layer.0.cross_attention.output", "step": 1, "layout": "head_major",
         "array": rng.standard_normal((2, 1, 3)).astype(np.float32)},
        {"name": "audio.decoder.logits", "step": 0, "layout": "token_major", "array": rng.standard_normal((2, 5))},
    ]


def _write(path, **kw):
    return write_dump(path, _entries(), family="whisper", model_id="m", producer="test",
                      weights_sha256="w" * 64, audio_sha256="a" * 64, tools={"python": "3"},
                      tokens=[50257, 50362, 13, 50256], transcript=" hi", **kw)


def test_round_trip(tmp_path):
    out = _write(tmp_path / "d")
    d = read_dump(out)
    m = d.manifest
    assert m["schema"] == "xray.dump" and m["version"] == 1 and m["stats_only"] is False
    assert m["tokens"] == [50257, 50362, 13, 50256] and m["transcript"] == " hi"
    for e, c in zip(_entries(), d.checkpoints, strict=True):
        assert (c.name, c.step, c.layout) == (e["name"], e["step"], e["layout"])
        np.testing.assert_array_equal(c.array, e["array"])
        assert c.array.dtype == e["array"].dtype
    assert m["checkpoints"][2]["dtype"] == "f64" and m["checkpoints"][0]["file"] == "audio.frontend.mel@step0.npy"
    assert d.unlisted == []
    assert not list(tmp_path.glob(".d.tmp-*"))
    # numpy reads our files
    np.testing.assert_array_equal(np.load(out / "audio.frontend.mel@step0.npy"), _entries()[0]["array"])


def test_refuses_to_overwrite_unless_asked(tmp_path):
    _write(tmp_path / "d")
    with pytest.raises(DumpError, match="already exists"):
        _write(tmp_path / "d")
    _write(tmp_path / "d", overwrite=True)
    read_dump(tmp_path / "d")


def test_stats_only_round_trip(tmp_path):
    out = _write(tmp_path / "s", stats_only=True)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
    d = read_dump(out)
    c = d.get("audio.decoder.logits", 0)
    assert c.array is None and c.stats["count"] == 10 and len(c.content_sha256) == 64


def test_flipped_byte_is_refused_naming_the_file(tmp_path):
    out = _write(tmp_path / "d")
    f = out / "audio.decoder.layer.0.cross_attention.output@step1.npy"
    b = bytearray(f.read_bytes())
    b[-3] ^= 0x01
    f.write_bytes(bytes(b))
    with pytest.raises(DumpError, match=r"cross_attention\.output@step1\.npy: sha256 .* does not match"):
        read_dump(out)


def test_truncated_file_is_refused_naming_the_file(tmp_path):
    out = _write(tmp_path / "d")
    f = out / "audio.decoder.logits@step0.npy"
    f.write_bytes(f.read_bytes()[:-8])
    with pytest.raises(DumpError, match=r"logits@step0\.npy: sha256"):
        read_dump(out)
    # with the manifest's sha256 "fixed", the payload length check still catches it
    import hashlib

    m = json.loads((out / "manifest.json").read_text())
    m["checkpoints"][2]["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DumpError, match=r"logits@step0\.npy: payload is 72 bytes.*needs exactly 80"):
        read_dump(out)


def test_manifest_mismatches_are_refused(tmp_path):
    out = _write(tmp_path / "d")
    m0 = json.loads((out / "manifest.json").read_text())

    def with_manifest(mut):
        m = json.loads(json.dumps(m0))
        mut(m)
        (out / "manifest.json").write_text(json.dumps(m))

    with_manifest(lambda m: m["checkpoints"][0].__setitem__("shape", [6, 4]))
    with pytest.raises(DumpError, match=r"mel@step0\.npy: shape \[4, 6\] but the manifest says \[6, 4\]"):
        read_dump(out)
    with_manifest(lambda m: m["checkpoints"][0].__setitem__("dtype", "f16"))
    with pytest.raises(DumpError, match=r"mel@step0\.npy: dtype <f4 but the manifest says f16"):
        read_dump(out)
    with_manifest(lambda m: m.__setitem__("version", 2))
    with pytest.raises(DumpError, match="version 2"):
        read_dump(out)
    with_manifest(lambda m: m["checkpoints"].append(dict(m["checkpoints"][0])))
    with pytest.raises(DumpError, match="listed twice"):
        read_dump(out)
    with_manifest(lambda m: m["checkpoints"][1].__setitem__("file", "../escape.npy"))
    with pytest.raises(DumpError, match="not a plain file name"):
        read_dump(out)
    with_manifest(lambda m: None)
    (out / "audio.frontend.mel@step0.npy").unlink()
    with pytest.raises(DumpError, match=r"mel@step0\.npy: missing"):
        read_dump(out)


def test_unlisted_files_are_reported(tmp_path):
    out = _write(tmp_path / "d")
    (out / "stray.npy").write_bytes(b"x")
    assert read_dump(out).unlisted == ["stray.npy"]


def test_verify_cli(tmp_path):
    out = _write(tmp_path / "d")
    env = {"PYTHONPATH": str(REPO / "oracle"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "xray_oracle", "verify", str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "3 checkpoint entries, OK" in r.stdout, r.stderr
    (out / "audio.frontend.mel@step0.npy").write_bytes(b"\x93NUMPY")
    r = subprocess.run([sys.executable, "-m", "xray_oracle", "verify", str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "mel@step0.npy" in r.stderr
