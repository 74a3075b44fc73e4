"""xray_oracle.dump, issue 10: the writer never deletes what it did not write; stats-only entries
carry the order-sensitive sketch; the .npy parser's size arithmetic cannot wrap."""
from __future__ import annotations

import json

import numpy as np
import pytest

from xray_oracle.dump import DumpError, SKETCH_LEN, parse_npy, read_dump, tensor_stats, write_dump


def _write(path, stats_only=False, **kw):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    return write_dump(path, [{"name": "x", "step": 0, "layout": "plain", "array": a}], family="whisper",
                      model_id="m", producer="test", weights_sha256="w", audio_sha256="a",
                      stats_only=stats_only, **kw)


@pytest.mark.parametrize("overwrite", [False, True])
def test_refuses_a_directory_that_is_not_a_dump(tmp_path, overwrite):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.txt").write_text("years of work")
    with pytest.raises(DumpError, match="not an X-Ray dump"):
        _write(d, overwrite=overwrite)
    assert (d / "thesis.txt").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_replaces_only_the_files_its_manifest_lists(tmp_path):
    d = tmp_path / "d"
    d.mkdir()  # empty is fine
    _write(d)
    (d / "notes.txt").write_text("mine")
    with pytest.raises(DumpError, match="notes.txt"):
        _write(d, overwrite=True)
    assert (d / "notes.txt").read_text() == "mine"
    (d / "notes.txt").unlink()
    _write(d, overwrite=True)
    read_dump(d)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_stats_carry_an_order_sensitive_sketch(tmp_path):
    a = np.sin(np.arange(200, dtype=np.float32) * 0.37).reshape(10, 20)
    s, r = tensor_stats(a), tensor_stats(a.ravel()[::-1].reshape(a.shape))
    assert len(s["sketch"]) == SKETCH_LEN
    assert (s["mean"], s["min"], s["max"]) == (r["mean"], r["min"], r["max"])
    d = np.sqrt(np.mean((np.array(s["sketch"]) - np.array(r["sketch"])) ** 2))
    assert d > 0.1 * s["rms"]
    # The sketch estimates ||x - y|| / sqrt(n): unbiased in the square, ~25 % spread with 32.
    noise = (a * (1 + 1e-4 * np.random.default_rng(0).standard_normal(a.shape))).astype(np.float32)
    true = np.sqrt(np.mean((noise.astype(np.float64) - a) ** 2))
    est = np.sqrt(np.mean((np.array(tensor_stats(noise)["sketch"]) - np.array(s["sketch"])) ** 2))
    assert 0.4 * true < est < 2.0 * true
    # No finite value: zeros, not None (the Rust reader needs numbers).
    z = tensor_stats(np.full(3, np.nan, np.float32))
    assert (z["min"], z["max"], z["mean"], z["rms"], z["nan"]) == (0.0, 0.0, 0.0, 0.0, 3)


def test_stats_only_entry_without_sketch_is_refused(tmp_path):
    d = _write(tmp_path / "s", stats_only=True)
    m = json.loads((d / "manifest.json").read_text())
    del m["checkpoints"][0]["stats"]["sketch"]
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DumpError, match="sketch"):
        read_dump(d)


def test_npy_size_cannot_wrap():
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
    with pytest.raises(DumpError, match="huge.npy"):
        parse_npy(data, "huge.npy")


def test_npy_is_read_by_numpys_format_module():
    """Headers go through numpy.lib.format (format 2.0 too, as numpy writes it for long headers);
    what a dump does not allow is still refused, naming the file."""
    import io

    from numpy.lib import format as npy_format

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = io.BytesIO()
    npy_format.write_array(buf, a, version=(2, 0))
    np.testing.assert_array_equal(parse_npy(buf.getvalue(), "v2.npy"), a)
    for bad, msg in [
        (np.asfortranarray(np.ones((2, 3), np.float32)), "Fortran"),
        (np.array(["x"], dtype=object), "dtype"),
        (np.ones(3, np.uint8), "dtype"),
    ]:
        buf = io.BytesIO()
        npy_format.write_array(buf, bad, version=(1, 0), allow_pickle=True)
        with pytest.raises(DumpError, match=f"bad.npy.*{msg}"):
            parse_npy(buf.getvalue(), "bad.npy")
    # A header that is not a literal dict of exactly descr, fortran_order, shape.
    for header in ["{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "__import__('os')"]:
        header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
        data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\0" * 4
        with pytest.raises(DumpError, match="bad.npy: .npy header does not parse"):
            parse_npy(data, "bad.npy")
