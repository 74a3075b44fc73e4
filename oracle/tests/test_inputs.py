"""Issue 10 items 9/10: known input errors are OracleInputError (one line in `xray`), raised by one
shared check before torch is imported; the standalone WAV reader accepts what the runtime accepts
(16-bit WAVE_FORMAT_EXTENSIBLE) and survives hostile headers (a huge fmt chunk)."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import AUDIO, RAND_A, REPO, require_fixture

from xray_oracle.audio import from_samples, read_wav
from xray_oracle.errors import OracleInputError

GRANITE = REPO / "fixtures" / "build" / "granite-nar-tiny"


def _no_torch_run(family: str, model_dir, audio, **kw) -> str:
    """Call xray_oracle.run in a fresh interpreter; return the error text, and fail if torch was
    imported before the refusal."""
    code = f"""
import sys
sys.path.insert(0, {str(REPO / 'oracle')!r})
import xray_oracle
from xray_oracle.errors import OracleInputError
try:
    xray_oracle.run({family!r}, {str(model_dir)!r}, {str(audio)!r}, "{{}}", **{kw!r})
except OracleInputError as e:
    print("REFUSED:", e)
print("TORCH_LOADED:", "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "TORCH_LOADED: False" in out.stdout, out.stdout
    assert "REFUSED:" in out.stdout, out.stdout
    return out.stdout


@pytest.mark.parametrize("family, src", [("whisper", RAND_A), ("granite_nar", GRANITE)])
def test_pickles_and_auto_map_refused_the_same_way_in_both_families(tmp_path, family, src):
    require_fixture(src)
    d = tmp_path / "m"
    shutil.copytree(src, d)
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    out = _no_torch_run(family, d, AUDIO / "fox.wav")
    assert "pickle-format weights ['pytorch_model.bin']" in out
    (d / "pytorch_model.bin").unlink()
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_evil.Evil"}
    (d / "config.json").write_text(json.dumps(cfg))
    out = _no_torch_run(family, d, AUDIO / "fox.wav")
    assert "auto_map (remote code)" in out


def test_granite_without_tokenizer_is_a_one_line_input_error(tmp_path):
    require_fixture(GRANITE)
    d = tmp_path / "g"
    shutil.copytree(GRANITE, d)
    (d / "tokenizer.json").unlink()
    out = _no_torch_run("granite_nar", d, AUDIO / "fox.wav")
    assert f"{d / 'tokenizer.json'} is missing" in out


def test_argument_and_audio_errors_before_torch(tmp_path):
    out = _no_torch_run("whisper", RAND_A, AUDIO / "fox.wav", dtype="float16")
    assert "dtype 'float16'" in out
    out = _no_torch_run("whisper", RAND_A, AUDIO / "fox.wav", max_new_tokens=0)
    assert "max_new_tokens must be a positive integer" in out
    out = _no_torch_run("whisper", RAND_A, AUDIO / "fox.wav", threads=0)
    assert "threads must be a positive integer" in out
    out = _no_torch_run("whisper", RAND_A, tmp_path)
    assert "is a directory" in out


def _riff(fmt: bytes, data: bytes, fmt_size: int | None = None) -> bytes:
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt) if fmt_size is None else fmt_size) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_extensible_16bit_is_read_like_the_plain_file(tmp_path):
    plain = read_wav(AUDIO / "fox.wav")
    pcm = (plain.samples * 32768).astype("<i2").tobytes()
    guid_pcm = struct.pack("<H", 1) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    fmt = struct.pack("<HHIIHHHHI", 0xFFFE, 1, 16000, 32000, 2, 16, 22, 16, 4) + guid_pcm
    p = tmp_path / "ext.wav"
    p.write_bytes(_riff(fmt, pcm))
    ext = read_wav(p)
    assert np.array_equal(ext.samples, plain.samples)


def test_huge_fmt_chunk_is_an_input_error_not_a_crash(tmp_path):
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    p = tmp_path / "huge.wav"
    p.write_bytes(_riff(fmt, b"\x00\x01" * 100, fmt_size=0xFFFFFFF0))
    with pytest.raises(OracleInputError, match=r"huge\.wav: corrupt or truncated WAV file: chunk b'fmt ' claims"):
        read_wav(p)


def test_from_samples_checks_shape_dtype_and_finiteness():
    with pytest.raises(OracleInputError, match="non-finite sample at index 2"):
        from_samples("x.wav", np.array([0, 0, np.nan], np.float32), "")
    with pytest.raises(OracleInputError, match="1-D"):
        from_samples("x.wav", np.zeros((2, 2), np.float32), "")
    with pytest.raises(OracleInputError, match="longer than the model's 1 s window"):
        from_samples("x.wav", np.zeros(16001, np.float32), "", max_seconds=1)
