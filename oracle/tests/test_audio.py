"""Bad audio is refused with a message that names the file, the problem and the fix."""
from __future__ import annotations

import struct
import wave

import numpy as np
import pytest
from conftest import AUDIO, EDGE_AUDIO

from xray_oracle.audio import read_wav
from xray_oracle.errors import OracleInputError


def test_committed_clips_are_16k_mono_pcm16():
    total = 0
    for name in ("fox.wav", "stella.wav", "weather.wav"):
        a = read_wav(AUDIO / name, max_seconds=30)
        assert a.sample_rate == 16000 and 2.0 <= a.seconds <= 5.0, name
        assert a.samples.dtype == np.float32 and np.abs(a.samples).max() > 0.1
        total += (AUDIO / name).stat().st_size
    assert total < 600_000


def test_silence_reads():
    a = read_wav(EDGE_AUDIO / "silence-2s.wav", max_seconds=30)
    assert a.seconds == 2.0 and not a.samples.any()


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("fox-44k.wav", r"fox-44k\.wav: sample rate 44100 Hz.*`sox .*fox-44k\.wav -r 16000 "),
        ("fox-stereo.wav", r"fox-stereo\.wav: 2 channels.*`sox .*fox-stereo\.wav -c 1 "),
        ("long-35s.wav", r"long-35s\.wav: 35\.00 s of audio, longer than the model's 30 s window.*trim 0 30"),
    ],
)
def test_edge_cases_are_refused(name, pattern):
    with pytest.raises(OracleInputError, match=pattern):
        read_wav(EDGE_AUDIO / name, max_seconds=30)


def _wav(path, width=2, channels=1, rate=16000, n=1600):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(b"\x01" * (n * width * channels))
    return path


def test_sample_width_corruption_and_formats(tmp_path):
    with pytest.raises(OracleInputError, match=r"8-bit samples.*-b 16"):
        read_wav(_wav(tmp_path / "u8.wav", width=1))
    with pytest.raises(OracleInputError, match=r"24-bit samples"):
        read_wav(_wav(tmp_path / "s24.wav", width=3))
    # IEEE float WAV (format tag 3)
    data = np.zeros(160, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 64000, 4, 32)
    riff = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    (tmp_path / "f32.wav").write_bytes(b"RIFF" + struct.pack("<I", len(riff)) + riff)
    with pytest.raises(OracleInputError, match=r"f32\.wav: not 16-bit integer PCM.*-e signed-integer -b 16"):
        read_wav(tmp_path / "f32.wav")
    (tmp_path / "junk.wav").write_bytes(b"this is not a wav file at all" * 10)
    with pytest.raises(OracleInputError, match=r"junk\.wav: not a readable WAV file"):
        read_wav(tmp_path / "junk.wav")
    good = _wav(tmp_path / "good.wav", n=16000).read_bytes()
    (tmp_path / "cut.wav").write_bytes(good[: len(good) // 2])
    with pytest.raises(OracleInputError, match=r"cut\.wav: corrupt or truncated"):
        read_wav(tmp_path / "cut.wav")
    (tmp_path / "hdr.wav").write_bytes(good[:20])
    with pytest.raises(OracleInputError, match=r"hdr\.wav: (corrupt|not a readable)"):
        read_wav(tmp_path / "hdr.wav")
    with pytest.raises(OracleInputError, match=r"empty\.wav: the WAV file holds no samples"):
        read_wav(_wav(tmp_path / "empty.wav", n=0))
    with pytest.raises(OracleInputError, match=r"nope\.wav does not exist"):
        read_wav(tmp_path / "nope.wav")
