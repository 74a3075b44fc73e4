"""Audio input for the oracle. Under `xray` the samples arrive already decoded and converted by the
runtime's reader (`from_samples`): one decoder for both engines. Standalone (`python -m
xray_oracle`), `read_wav` reads 16 kHz mono 16-bit PCM (plain or WAVE_FORMAT_EXTENSIBLE) with a
bounded RIFF walk plus numpy, and refuses anything else with the fixing command."""
from __future__ import annotations

import hashlib
import struct
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


WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_IEEE_FLOAT = 0x0003
WAVE_FORMAT_EXTENSIBLE = 0xFFFE


def _parse_riff(raw: bytes, p: Path, fix_out: Path) -> tuple[int, int, int, int, bool, bytes]:
    """(format tag, channels, rate, bits, extensible, data bytes) from WAV bytes. A bounded chunk
    walk (every size is checked against the file's length before it is used), the same container
    rules as the runtime's reader (hound): plain and WAVE_FORMAT_EXTENSIBLE `fmt ` chunks."""
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise OracleInputError(f"{p}: not a readable WAV file (no RIFF/WAVE header)")
    pos, fmt, data = 12, None, None
    while pos + 8 <= len(raw):
        cid = raw[pos : pos + 4]
        size = int.from_bytes(raw[pos + 4 : pos + 8], "little")
        body = pos + 8
        if size > len(raw) - body:
            raise OracleInputError(
                f"{p}: corrupt or truncated WAV file: chunk {cid!r} claims {size} bytes, {len(raw) - body} remain"
            )
        if cid == b"fmt ":
            if size < 16:
                raise OracleInputError(f"{p}: corrupt WAV file: fmt chunk of {size} bytes (at least 16)")
            tag, channels, rate, _byte_rate, _align, bits = struct.unpack("<HHIIHH", raw[body : body + 16])
            extensible = tag == WAVE_FORMAT_EXTENSIBLE
            if extensible:
                if size < 40:
                    raise OracleInputError(f"{p}: corrupt WAV file: WAVE_FORMAT_EXTENSIBLE fmt chunk of {size} bytes (at least 40)")
                # SubFormat GUID: its first two bytes are the format tag.
                tag = int.from_bytes(raw[body + 24 : body + 26], "little")
            fmt = (tag, channels, rate, bits, extensible)
        elif cid == b"data":
            data = raw[body : body + size]
            if fmt is not None:
                break
        pos = body + size + (size & 1)
    if fmt is None:
        raise OracleInputError(f"{p}: not a readable WAV file (no fmt chunk)")
    if data is None:
        raise OracleInputError(f"{p}: corrupt or truncated WAV file (no data chunk)")
    return (*fmt, data)


def read_wav(path: str | Path, max_seconds: float | None = None, dtype=np.float32) -> Audio:
    """Read a 16 kHz mono 16-bit PCM WAV (plain or WAVE_FORMAT_EXTENSIBLE) as float samples
    (int16 / 32768, what the HF pipelines feed WhisperFeatureExtractor), bit for bit what the
    runtime's reader gives for the same file. Standalone use only (`python -m xray_oracle`):
    `xray` decodes and converts audio once in Rust and passes the samples in (`samples=`), so
    other rates, channel counts and formats are converted there; here they are refused with an
    OracleInputError naming the file, the problem and the fix."""
    p = Path(path)
    if p.is_dir():
        raise OracleInputError(f"audio {p} is a directory, not a WAV file")
    if not p.is_file():
        raise OracleInputError(f"audio file {p} does not exist")
    raw = p.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    fix_out = p.with_name(p.stem + "-16k-mono.wav")
    tag, channels, rate, bits, _ext, data = _parse_riff(raw, p, fix_out)
    convert = f"use `xray oracle` (it converts) or `sox {p} -e signed-integer -b 16 -r {EXPECTED_RATE} -c 1 {fix_out}`"
    if tag != WAVE_FORMAT_PCM:
        raise OracleInputError(
            f"{p}: not 16-bit integer PCM (format tag {tag:#06x}: float or compressed WAV); {convert}"
        )
    if bits != 16:
        raise OracleInputError(
            f"{p}: {bits}-bit samples, the standalone oracle reads 16-bit PCM only; "
            f"convert with `sox {p} -e signed-integer -b 16 {fix_out}` or use `xray oracle`"
        )
    if channels != 1:
        raise OracleInputError(
            f"{p}: {channels} channels, the standalone oracle reads mono only; downmix with `sox {p} -c 1 {fix_out}` or use `xray oracle`"
        )
    if rate != EXPECTED_RATE:
        raise OracleInputError(
            f"{p}: sample rate {rate} Hz, Whisper's feature extractor needs {EXPECTED_RATE} Hz; "
            f"resample with `sox {p} -r {EXPECTED_RATE} {fix_out}` or use `xray oracle`"
        )
    if len(data) % 2:
        raise OracleInputError(f"{p}: corrupt or truncated WAV file: odd data chunk length {len(data)}")
    n = len(data) // 2
    if n == 0:
        raise OracleInputError(f"{p}: the WAV file holds no samples")
    samples = np.frombuffer(data, dtype="<i2").astype(dtype) / dtype(32768.0)
    audio = Audio(str(p), np.ascontiguousarray(samples, dtype=dtype), rate, sha)
    check_length(audio, max_seconds)
    return audio


def check_length(audio: Audio, max_seconds: float | None) -> None:
    """Refuse audio longer than the model's window (short-form only, never silently cut)."""
    if max_seconds is not None and audio.seconds > max_seconds:
        p = Path(audio.path)
        fix_out = p.with_name(p.stem + "-cut.wav")
        raise OracleInputError(
            f"{p}: {audio.seconds:.2f} s of audio, longer than the model's {max_seconds:g} s window (chunk_length); "
            f"the oracle runs short-form only: cut it with `sox {p} {fix_out} trim 0 {max_seconds:g}`"
        )


def from_samples(path: str | Path, samples, sha256: str, dtype=np.float32, max_seconds: float | None = None) -> Audio:
    """Audio decoded and converted by the caller (`xray`: 16 kHz mono f32 from the runtime's
    reader), so both engines see the same samples. Checked: 1-D, non-empty, finite."""
    a = np.asarray(samples)
    if a.ndim != 1 or a.size == 0:
        raise OracleInputError(f"{path}: samples must be a non-empty 1-D array, got shape {a.shape}")
    if a.dtype not in (np.float32, np.float64):
        raise OracleInputError(f"{path}: samples must be float32, got {a.dtype}")
    if not np.isfinite(a).all():
        raise OracleInputError(f"{path}: non-finite sample at index {int(np.argmin(np.isfinite(a)))}")
    audio = Audio(str(path), np.ascontiguousarray(a.astype(dtype)), EXPECTED_RATE, str(sha256))
    check_length(audio, max_seconds)
    return audio


def samples_sha256(samples) -> str:
    """sha256 of the samples as little-endian float32 bytes (the runtime's `samples_sha256`)."""
    return hashlib.sha256(np.ascontiguousarray(samples, dtype="<f4").tobytes()).hexdigest()
