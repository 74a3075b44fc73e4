"""WAV input for the oracle: Python's `wave` module plus numpy, nothing else, and a refusal with
the fixing sox command for anything that is not 16 kHz mono 16-bit PCM within the model's window."""
from __future__ import annotations

import hashlib
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import OracleInputError

EXPECTED_RATE = 16000


@dataclass
class Audio:
    path: str
    samples: np.ndarray  # float32 (or float64), mono, in [-1, 1): int16 / 32768
    sample_rate: int
    sha256: str

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


def read_wav(path: str | Path, max_seconds: float | None = None, dtype=np.float32) -> Audio:
    """Read a 16 kHz mono 16-bit PCM WAV as float samples (int16 / 32768, what the HF pipelines
    feed WhisperFeatureExtractor). Refuses anything else with an OracleInputError naming the file,
    the problem and the sox command that fixes it."""
    p = Path(path)
    if not p.is_file():
        raise OracleInputError(f"audio file {p} does not exist")
    raw = p.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    fix_out = p.with_name(p.stem + "-16k-mono.wav")
    try:
        with wave.open(str(p), "rb") as w:
            channels, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            comptype = w.getcomptype()
            data = w.readframes(n)
    except wave.Error as e:
        msg = str(e)
        if msg.startswith("unknown format"):
            raise OracleInputError(
                f"{p}: not 16-bit integer PCM ({msg}: float or extensible WAV); "
                f"convert with `sox {p} -e signed-integer -b 16 -r {EXPECTED_RATE} -c 1 {fix_out}`"
            ) from None
        raise OracleInputError(f"{p}: not a readable WAV file ({msg})") from None
    except (EOFError, OSError, ValueError) as e:
        raise OracleInputError(f"{p}: corrupt or truncated WAV file ({type(e).__name__}: {e})") from None
    if comptype != "NONE":
        raise OracleInputError(f"{p}: compressed WAV ({comptype}); convert with `sox {p} -e signed-integer -b 16 {fix_out}`")
    if width != 2:
        raise OracleInputError(
            f"{p}: {8 * width}-bit samples, the oracle reads 16-bit PCM only; "
            f"convert with `sox {p} -e signed-integer -b 16 {fix_out}`"
        )
    if channels != 1:
        raise OracleInputError(
            f"{p}: {channels} channels, the oracle reads mono only; downmix with `sox {p} -c 1 {fix_out}`"
        )
    if rate != EXPECTED_RATE:
        raise OracleInputError(
            f"{p}: sample rate {rate} Hz, Whisper's feature extractor needs {EXPECTED_RATE} Hz; "
            f"resample with `sox {p} -r {EXPECTED_RATE} {fix_out}`"
        )
    if len(data) != n * channels * width:
        raise OracleInputError(
            f"{p}: corrupt or truncated WAV file: header says {n} frames, data chunk holds {len(data) // (channels * width)}"
        )
    if n == 0:
        raise OracleInputError(f"{p}: the WAV file holds no samples")
    seconds = n / rate
    if max_seconds is not None and seconds > max_seconds:
        raise OracleInputError(
            f"{p}: {seconds:.2f} s of audio, longer than the model's {max_seconds:g} s window (chunk_length); "
            f"the oracle runs short-form only: cut it with `sox {p} {fix_out} trim 0 {max_seconds:g}`"
        )
    samples = np.frombuffer(data, dtype="<i2").astype(dtype) / dtype(32768.0)
    return Audio(str(p), np.ascontiguousarray(samples, dtype=dtype), rate, sha)
