"""The Python writer (`xray_oracle.dump.DumpWriter`) writes exactly the bytes the Rust writer does:
the same recipe as `core/tests/dump_golden.rs`, compared file by file with the golden dump that
test pins (`core/tests/golden/dump/`)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO

from xray_oracle.dump import DumpError, DumpWriter, _json_float, read_dump

GOLDEN = REPO / "core" / "tests" / "golden" / "dump"


def ramp(shape):
    n = int(np.prod(shape)) if shape else 1
    v = np.array([((i * 37) % 101) / 8.0 - 6.0 for i in range(n)], dtype=np.float32)
    return v.reshape(shape)


def recipe() -> DumpWriter:
    w = DumpWriter(
        family="whisper", model_id="golden/model", producer="golden-engine",
        weights_sha256="a" * 64, audio_sha256="b" * 64,
        tools={"zeta": "2", "golden-engine": "1.0.0"},
        engine_weights={"format": "ctranslate2", "sha256": "c" * 64, "file": "model.bin", "source": "golden/model",
                        "conversion": "exact f16 -> f32 widening",
                        "config": {"layer_norm_epsilon": None, "suppress_ids": [220]}},
    )
    w.tokens = [50257, 50362, 440, 50256]
    w.transcript = ' The "quoted"\n\t\\ \u00e9\u0001'
    w.extra["fed"] = {"tokens": {"from": "ref", "into": "generate"}}
    w.extra["config"] = {"d_model": 384, "init_std": 0.02, "eps": 1e-5, "small": 1.234e-5, "tiny": 3e-7, "big": 1e16,
                         "huge": 1.5e300, "neg": -0.5, "whole": 3.0, "list": [1, 2.0, None, True, False, "x"],
                         "empty": {}, "none": []}
    special = ramp([2, 4])
    special[0, :4] = [-0.0, np.nan, np.inf, np.finfo(np.float32).min]
    w.add("audio.frontend.mel", 0, "channel_major", ramp([3, 5]))
    w.add("audio.decoder.layer.0.cross_attention.output", 1, "head_major", ramp([2, 1, 4]))
    w.add("audio.encoder.memory", 0, "token_major", special)
    w.add("scalar", 0, "plain", ramp([]))
    w.add("empty", 0, "plain", ramp([0, 3]))
    w.add("audio.decoder.logits", 0, "token_major", ramp([1, 7]), token_positions="last", logits_processed="suppression")
    return w


def test_python_writer_writes_the_rust_writers_bytes(tmp_path):
    if not (GOLDEN / "manifest.json").is_file():
        pytest.fail(f"{GOLDEN} is missing (it is committed; `cargo test -p xray-core --test dump_golden` checks it)")
    out = recipe().write(tmp_path / "d")
    got = sorted(p.name for p in out.iterdir())
    want = sorted(p.name for p in GOLDEN.iterdir())
    assert got == want
    for name in want:
        g, w = (out / name).read_bytes(), (GOLDEN / name).read_bytes()
        assert g == w, f"{name}: the Python writer's bytes differ from the golden (Rust) bytes:\n{g[:2000]!r}\n---\n{w[:2000]!r}"
    d = read_dump(out)
    c = d.get("audio.decoder.logits", 0)
    assert (c.token_positions, c.logits_processed) == ("last", "suppression")


@pytest.mark.parametrize("x,text", [(0.02, "0.02"), (1e-5, "0.00001"), (3e-7, "3e-7"), (1e16, "1e+16"),
                                    (1.5e300, "1.5e+300"), (3.0, "3.0"), (-0.0, "-0.0"), (1e15, "1000000000000000.0"),
                                    (float("nan"), "null")])
def test_floats_as_serde_json_writes_them(x, text):
    assert _json_float(x) == text


def test_writer_fails_closed(tmp_path):
    with pytest.raises(DumpError, match="weights_sha256"):
        DumpWriter(family="whisper", model_id="m", producer="e", weights_sha256="model.bin", audio_sha256="b" * 64)
    with pytest.raises(DumpError, match="name your engine"):
        DumpWriter(family="whisper", model_id="m", producer="oracle", weights_sha256="a" * 64, audio_sha256="b" * 64)
    with pytest.raises(DumpError, match="engine_weights lacks 'format'"):
        DumpWriter(family="whisper", model_id="m", producer="e", weights_sha256="a" * 64, audio_sha256="b" * 64,
                   engine_weights={"sha256": "c" * 64})
    w = DumpWriter(family="whisper", model_id="m", producer="e", weights_sha256="a" * 64, audio_sha256="b" * 64)
    w.add("audio.decoder.logits", 0, "token_major", np.zeros((1, 3)), token_positions="first")
    with pytest.raises(DumpError, match="token_positions 'first'"):
        w.write(tmp_path / "x")
    assert not (tmp_path / "x").exists()
