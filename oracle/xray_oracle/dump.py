"""Pure-Python writer and reader of the `xray.dump` version 1 format (docs/dump-format.md).

A dump made here loads in the Rust harness and vice versa, so an engine under bring-up can produce
one without Rust. The `.npy` files are written and their headers read by numpy's own format module
(`numpy.lib.format`, as `numpy.save` writes them: format 1.0, header padded to a multiple of 64
bytes); loading fails closed, naming the file, on any mismatch with the manifest.

The public writer for engines driven from Python is `DumpWriter` (docs/bring-your-own-engine.md,
"From Python"): the same API and the same bytes as the Rust `xray_core::dump::DumpWriter` (every
tensor stored f32; the manifest serialized as serde_json's pretty printer does), pinned by a
golden test (`core/tests/golden/`, `oracle/tests/test_dump_golden.py`,
`core/tests/dump_golden.rs`). Imports numpy only.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
from numpy.lib import format as npy_format

from .errors import DumpError, read_json_object

SCHEMA = "xray.dump"
VERSION = 1

# manifest dtype name <-> numpy descr
DTYPES = {"f32": "<f4", "f64": "<f8", "f16": "<f2", "i64": "<i8", "i32": "<i4"}
DESCR_TO_NAME = {v: k for k, v in DTYPES.items()}
LAYOUTS = ("token_major", "head_major", "channel_major", "plain")


def checkpoint_key(name: str, step: int) -> str:
    """A checkpoint's id at a step, `name@stepK`: Python's one spelling of it (Rust's is
    `xray_core::key`)."""
    return f"{name}@step{step}"


def file_name(name: str, step: int) -> str:
    """The conventional file name of a checkpoint at a step: its id plus `.npy`."""
    return checkpoint_key(name, step) + ".npy"


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------------------------------------
# .npy


def npy_bytes(array: np.ndarray) -> bytes:
    """Serialize an array as NumPy format 1.0, C order, little-endian, with numpy's own
    `numpy.lib.format.write_array` (exactly what `numpy.save` writes; never a pickle)."""
    a = np.asarray(array)
    descr = a.dtype.newbyteorder("<").str
    if descr not in DESCR_TO_NAME:
        raise DumpError(f"dtype {a.dtype} cannot be stored in a dump (allowed: {sorted(DESCR_TO_NAME)})")
    # np.array(order="C"), not np.ascontiguousarray: the latter makes a 0-d array 1-d.
    a = np.array(a, dtype=np.dtype(descr), order="C")
    buf = io.BytesIO()
    try:
        npy_format.write_array(buf, a, version=(1, 0), allow_pickle=False)
    except ValueError as e:  # a header that does not fit format 1.0
        raise DumpError(f"array of shape {a.shape} cannot be written as .npy 1.0: {e}") from None
    return buf.getvalue()


def parse_npy(data: bytes, where: str) -> np.ndarray:
    """Parse .npy bytes (format 1.0 or 2.0) with numpy's own `numpy.lib.format` header reader
    (a literal, never a pickle), then check what a dump allows: C order, a dump dtype, and a payload
    of exactly shape x itemsize bytes. `where` names the file in errors."""
    fp = io.BytesIO(data)
    try:
        version = npy_format.read_magic(fp)
    except ValueError as e:
        raise DumpError(f"{where}: not a .npy file ({e})") from None
    try:
        if version == (1, 0):
            shape, fortran_order, dt = npy_format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran_order, dt = npy_format.read_array_header_2_0(fp)
        else:
            raise DumpError(f"{where}: .npy format version {version[0]}.{version[1]}, only 1.0 and 2.0 are accepted")
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError) as e:
        raise DumpError(f"{where}: .npy header does not parse ({e})") from None
    if fortran_order:
        raise DumpError(f"{where}: .npy is Fortran-ordered, dumps are C order")
    if dt.str not in DESCR_TO_NAME:
        raise DumpError(f"{where}: .npy dtype {dt.str!r} is not one of {sorted(DESCR_TO_NAME)}")
    expected = math.prod(shape) * dt.itemsize  # Python ints: no wrap-around
    payload = memoryview(data)[fp.tell() :]
    if len(payload) != expected:
        raise DumpError(
            f"{where}: payload is {len(payload)} bytes, shape {list(shape)} of {dt.str} needs exactly {expected}"
        )
    return np.frombuffer(payload, dtype=dt).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Writing


TOKEN_POSITIONS = ("last",)
LOGITS_PROCESSED = ("suppression",)


@dataclass
class DumpCheckpoint:
    """One (checkpoint, step) tensor of a dump."""

    name: str
    step: int
    array: Optional[np.ndarray]
    layout: str
    # filled by the reader / writer
    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    file: Optional[str] = None
    sha256: Optional[str] = None
    stats: Optional[dict] = None
    content_sha256: Optional[str] = None
    # declarations (docs/dump-format.md): which positions the `tokens` axis holds ("last"), and
    # whether logits are processed ("suppression")
    token_positions: Optional[str] = None
    logits_processed: Optional[str] = None


# ---------------------------------------------------------------------------------------------
# JSON exactly as serde_json's pretty printer writes it (the Rust writer's manifest bytes)


def _json_float(x: float) -> str:
    """A float as serde_json writes an f64 (ryu's shortest digits in its layout: `0.00001`,
    `3e-7`, `1e+16`, `12.5`, `3.0`); NaN and infinities as `null`, as serde_json does."""
    if not math.isfinite(x):
        return "null"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    r = repr(float(x))
    sign = ""
    if r.startswith("-"):
        sign, r = "-", r[1:]
    mant, _, ex = r.partition("e")
    ip, _, fp = mant.partition(".")
    digits = (ip + fp).lstrip("0")
    e = (int(ex) if ex else 0) - len(fp)
    stripped = digits.rstrip("0")
    e += len(digits) - len(stripped)
    d, n = stripped, len(stripped)
    kk = n + e
    if 0 <= e and kk <= 16:
        out = d + "0" * e + ".0"
    elif 0 < kk <= 16:
        out = d[:kk] + "." + d[kk:]
    elif -5 < kk <= 0:
        out = "0." + "0" * (-kk) + d
    elif n == 1:
        out = f"{d}e{kk - 1:+d}"
    else:
        out = f"{d[0]}.{d[1:]}e{kk - 1:+d}"
    return sign + out


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _json_str(t: str) -> str:
    out = []
    for ch in t:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_text(v, indent: int = 0) -> str:
    """`v` as serde_json's `to_string_pretty` writes it (two-space indent, `": "`, empty
    containers as `[]` / `{}`, keys in the dict's order, UTF-8 unescaped)."""
    pad = "  " * indent
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return _json_float(float(v))
    if isinstance(v, str):
        return _json_str(v)
    if isinstance(v, (list, tuple)):
        if not v:
            return "[]"
        return "[\n" + ",\n".join(pad + "  " + json_text(x, indent + 1) for x in v) + "\n" + pad + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = []
        for k, x in v.items():
            if not isinstance(k, str):
                raise DumpError(f"manifest key {k!r} is not a string")
            items.append(pad + "  " + _json_str(k) + ": " + json_text(x, indent + 1))
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    raise DumpError(f"manifest value {v!r} ({type(v).__name__}) is not JSON")


SKETCH_LEN = 32
_SKETCH_CHUNK = 1 << 16


def sketch_bits(idx: np.ndarray) -> np.ndarray:
    """splitmix64 of each flat index (uint64): bit k is the sign of that element in sketch
    projection k (1 = minus). The same function as `xray_runtime::dump::sketch_bits`."""
    z = idx.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tensor_sketch(a: np.ndarray) -> list[float]:
    """The order-sensitive `sketch` of a stats-only entry: SKETCH_LEN random-sign projections of the
    C-order content over finite values, divided by sqrt(count) (docs/dump-format.md)."""
    x = np.ascontiguousarray(a, dtype=np.float64).ravel()
    acc = np.zeros(SKETCH_LEN, dtype=np.float64)
    ks = np.arange(SKETCH_LEN, dtype=np.uint64)
    for start in range(0, x.size, _SKETCH_CHUNK):
        chunk = x[start : start + _SKETCH_CHUNK]
        chunk = np.where(np.isfinite(chunk), chunk, 0.0)
        bits = (sketch_bits(np.arange(start, start + chunk.size, dtype=np.uint64))[:, None] >> ks) & np.uint64(1)
        acc += chunk @ (1.0 - 2.0 * bits.astype(np.float64))
    return [float(v) for v in acc / np.sqrt(max(x.size, 1))]


def tensor_stats(a: np.ndarray) -> dict:
    """`stats` of a stats-only dump entry (over the values as f64; min/max/mean/rms are 0 when no
    value is finite, as the Rust writer does)."""
    x = np.asarray(a, dtype=np.float64).ravel()
    finite = x[np.isfinite(x)]
    return {
        "count": int(x.size),
        "min": float(finite.min()) if finite.size else 0.0,
        "max": float(finite.max()) if finite.size else 0.0,
        "mean": float(finite.mean()) if finite.size else 0.0,
        "rms": float(np.sqrt(np.mean(finite * finite))) if finite.size else 0.0,
        "nan": int(np.isnan(x).sum()),
        "inf": int(np.isinf(x).sum()),
        "sketch": tensor_sketch(a),
    }


def dump_target(out: Path, overwrite: bool) -> list[str]:
    """Check that a dump may be written at `out` (the rules of `xray_runtime::dump::check_dump_target`):
    absent or empty -> []; an X-Ray dump whose every file its manifest lists -> those files (only
    with `overwrite`); anything else raises DumpError naming `out`."""
    if out.is_symlink():
        raise DumpError(f"{out}: is a symbolic link; give the real directory (a dump is replaced by renaming)")
    if not out.exists():
        return []
    if not out.is_dir():
        raise DumpError(f"{out}: exists and is not a directory")
    present = sorted(os.listdir(out))
    if not present:
        return []
    not_dump = DumpError(
        f"{out}: is not empty and is not an X-Ray dump (no xray.dump manifest.json); refusing to write there, "
        "choose a new or empty directory"
    )
    try:
        m = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        raise not_dump from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA:
        raise not_dump
    files = {"manifest.json"}
    for e in m.get("checkpoints") or []:
        f = e.get("file") if isinstance(e, dict) else None
        if isinstance(f, str) and "/" not in f and "\\" not in f and f not in (".", ".."):
            files.add(f)
    foreign = [n for n in present if n not in files or not (out / n).is_file() or (out / n).is_symlink()]
    if foreign:
        raise DumpError(
            f"{out}: is an X-Ray dump but also holds what its manifest does not list ({', '.join(foreign)}); "
            "move those away or choose another directory"
        )
    if not overwrite:
        raise DumpError(f"{out}: already exists and holds an X-Ray dump; pass overwrite=True (CLI: --force) to replace it")
    return [n for n in present if n in files]


def content_sha256(a: np.ndarray) -> str:
    """sha256 of the raw little-endian f32 bytes of the C-order tensor (stats-only dumps)."""
    return sha256_bytes(np.ascontiguousarray(a, dtype="<f4").tobytes())


def write_dump(
    out_dir: str | Path,
    checkpoints: Iterable[DumpCheckpoint | dict],
    *,
    family: str,
    model_id: str,
    producer: str,
    weights_sha256: Optional[str] = None,
    audio_sha256: Optional[str] = None,
    tools: Optional[dict] = None,
    tokens: Optional[list[int]] = None,
    transcript: Optional[str] = None,
    stats_only: bool = False,
    overwrite: bool = False,
    extra: Optional[dict] = None,
    engine_weights: Optional[dict] = None,
    _rust_manifest: bool = False,
) -> Path:
    """Write a dump atomically: everything goes into a temporary sibling directory that is renamed
    into place at the end. An existing `out_dir` is an error unless `overwrite`.

    `checkpoints` items are DumpCheckpoint or dicts with name, step, layout, array (the result of
    `run_whisper` fits as is)."""
    out = Path(out_dir)
    old_files = dump_target(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        entries = []
        seen: set[tuple[str, int]] = set()
        for c in checkpoints:
            if isinstance(c, dict):
                c = DumpCheckpoint(name=c["name"], step=int(c["step"]), array=c["array"], layout=c["layout"])
            key = (c.name, c.step)
            if key in seen:
                raise DumpError(f"checkpoint {checkpoint_key(c.name, c.step)} is given twice")
            seen.add(key)
            if c.layout not in LAYOUTS:
                raise DumpError(f"checkpoint {checkpoint_key(c.name, c.step)}: layout {c.layout!r} is not one of {LAYOUTS}")
            if not isinstance(c.step, int) or c.step < 0:
                raise DumpError(f"checkpoint {c.name}: step {c.step!r} must be a non-negative integer")
            a = np.asarray(c.array)
            descr = a.dtype.newbyteorder("<").str
            if descr not in DESCR_TO_NAME:
                raise DumpError(f"checkpoint {checkpoint_key(c.name, c.step)}: dtype {a.dtype} is not storable ({sorted(DTYPES)})")
            if c.token_positions is not None and c.token_positions not in TOKEN_POSITIONS:
                raise DumpError(f"checkpoint {checkpoint_key(c.name, c.step)}: token_positions {c.token_positions!r} is not one of {TOKEN_POSITIONS}")
            if c.logits_processed is not None and c.logits_processed not in LOGITS_PROCESSED:
                raise DumpError(f"checkpoint {checkpoint_key(c.name, c.step)}: logits_processed {c.logits_processed!r} is not one of {LOGITS_PROCESSED}")
            entry = {
                "name": c.name,
                "step": c.step,
                "shape": [int(d) for d in a.shape],
                "dtype": DESCR_TO_NAME[descr],
                "layout": c.layout,
            }
            if stats_only:
                entry["stats"] = tensor_stats(a)
                entry["content_sha256"] = content_sha256(a)
            else:
                fname = file_name(c.name, c.step)
                if "/" in fname or fname.startswith("."):
                    raise DumpError(f"checkpoint name {c.name!r} does not make a safe file name")
                data = npy_bytes(a)
                (tmp / fname).write_bytes(data)
                entry["file"] = fname
                entry["sha256"] = sha256_bytes(data)
            if c.token_positions is not None:
                entry["token_positions"] = c.token_positions
            if c.logits_processed is not None:
                entry["logits_processed"] = c.logits_processed
            entries.append(entry)
        manifest = {
            "schema": SCHEMA,
            "version": VERSION,
            "family": family,
            "model_id": model_id,
            "producer": producer,
            "weights_sha256": weights_sha256,
            "audio_sha256": audio_sha256,
            "tools": dict(tools or {}),
            "tokens": None if tokens is None else [int(t) for t in tokens],
            "transcript": transcript,
            "stats_only": bool(stats_only),
            "checkpoints": entries,
        }
        if extra:
            # Family extras live under one "extra" key (what the Rust reader's Manifest.extra reads).
            manifest["extra"] = dict(extra)
        if engine_weights:
            manifest["engine_weights"] = _engine_weights(engine_weights)
        if _rust_manifest:
            # DumpWriter: what the Rust writer's Manifest serializes: tokens and transcript always,
            # `tools` and `extra` as BTreeMaps (keys sorted; nested objects keep their order).
            manifest["tokens"] = manifest["tokens"] or []
            manifest["transcript"] = manifest["transcript"] or ""
            manifest["tools"] = dict(sorted(manifest["tools"].items()))
            if "extra" in manifest:
                manifest["extra"] = dict(sorted(manifest["extra"].items()))
        manifest = {k: v for k, v in manifest.items() if v is not None or k in ("weights_sha256", "audio_sha256")}
        (tmp / "manifest.json").write_text(json_text(manifest) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        old_files = dump_target(out, overwrite)  # again: the directory may have changed meanwhile
        if out.exists():
            # A fresh, unique aside name; the old dump is removed only after the new one is in
            # place, and only the files its manifest listed (then the directory, if empty).
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rmdir(old)
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(old, out)
                raise
            for f in old_files:
                try:
                    os.unlink(old / f)
                except FileNotFoundError:
                    pass
            os.rmdir(old)
        else:
            os.rename(tmp, out)
    except BaseException:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # our own fresh mkdtemp directory
        raise
    return out


ENGINE_WEIGHTS_KEYS = ("format", "sha256", "file", "source", "conversion", "config")


def _engine_weights(ew: dict) -> dict:
    """`engine_weights` in the Rust struct's field order, checked: `format` and a 64-hex `sha256`
    are required; no other key than ENGINE_WEIGHTS_KEYS."""
    if not isinstance(ew, dict):
        raise DumpError(f"engine_weights must be a dict, got {type(ew).__name__}")
    unknown = sorted(set(ew) - set(ENGINE_WEIGHTS_KEYS))
    if unknown:
        raise DumpError(f"engine_weights: unknown key(s) {unknown} (allowed: {ENGINE_WEIGHTS_KEYS})")
    for key in ("format", "sha256"):
        if not isinstance(ew.get(key), str) or not ew[key]:
            raise DumpError(f"engine_weights lacks {key!r} (a non-empty string)")
    _check_sha("engine_weights.sha256", ew["sha256"])
    return {k: ew[k] for k in ENGINE_WEIGHTS_KEYS if ew.get(k) is not None}


def _check_sha(what: str, v) -> None:
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise DumpError(f"{what} must be a sha256 (64 lowercase hex digits), got {v!r}")


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (an audio file's `audio_sha256`; an engine's weights file)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def hf_weights_sha256(model_dir: str | Path, sha_file=file_sha256) -> str:
    """The `weights_sha256` of an HF model directory, as the oracle computes it: the sha256 of its
    single `.safetensors` file, or of `"{name}:{sha256}\\n"` over the sorted shards."""
    st = sorted(Path(model_dir).glob("*.safetensors"))
    if not st:
        raise DumpError(f"{model_dir}: no .safetensors file (the HF weights' identity is their sha256)")
    if len(st) == 1:
        return sha_file(st[0])
    return hashlib.sha256("".join(f"{p.name}:{sha_file(p)}\n" for p in st).encode()).hexdigest()


class DumpWriter:
    """The public writer for engines driven from Python; the same API and bytes as the Rust
    `xray_core::dump::DumpWriter`.

        w = DumpWriter(family="whisper", model_id="fixtures/whisper-tiny-en", producer="my-engine",
                       weights_sha256=hf_weights_sha256(model_dir), audio_sha256=file_sha256(wav))
        w.add("audio.encoder.memory", 0, "token_major", memory)             # [1500, 384]
        w.add("audio.decoder.logits", 0, "token_major", last_row[None],     # [1, vocab]
              token_positions="last", logits_processed="suppression")
        w.tokens, w.transcript = tokens, text
        w.write("out/dump")                                                 # atomic

    Every tensor is stored as f32 (`<f4`), as the Rust writer stores it (token ids too: the
    contract's ids are f32). `weights_sha256` and `audio_sha256` are required (a dump without an
    identity is refused by `xray compare`'s isolation and `xray gate`). `engine_weights` declares
    the engine's own converted weights file: `{"format", "sha256", "file", "source",
    "conversion", "config"}` (format and sha256 required). `extra` is the manifest's `extra`
    (`config`: the HF config.json; `fed`; `step_argmax`). Byte-identical to the Rust writer for full
    dumps; with `stats_only` the statistics are numpy's sums (equal to rounding, not to the bit).
    """

    def __init__(self, *, family: str, model_id: str, producer: str, weights_sha256: str, audio_sha256: str,
                 tools: Optional[dict] = None, engine_weights: Optional[dict] = None, stats_only: bool = False):
        _check_sha("weights_sha256", weights_sha256)
        _check_sha("audio_sha256", audio_sha256)
        for key, v in (("family", family), ("model_id", model_id), ("producer", producer)):
            if not isinstance(v, str) or not v:
                raise DumpError(f"{key} must be a non-empty string")
        if producer in ("oracle", "runtime"):
            raise DumpError(f"producer {producer!r} is X-Ray's own; name your engine")
        self.family, self.model_id, self.producer = family, model_id, producer
        self.weights_sha256, self.audio_sha256 = weights_sha256, audio_sha256
        self.tools = dict(tools or {})
        self.engine_weights = None if engine_weights is None else _engine_weights(engine_weights)
        self.stats_only = bool(stats_only)
        self.tokens: list[int] = []
        self.transcript: str = ""
        self.extra: dict = {}
        self.checkpoints: list[DumpCheckpoint] = []

    def add(self, name: str, step: int, layout: str, array, *, token_positions: Optional[str] = None,
            logits_processed: Optional[str] = None) -> None:
        """One tensor per (contract checkpoint, step), batch squeezed, in the contract's shape (a
        `token_positions="last"` entry holds one position on the `tokens` axis)."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise DumpError(f"checkpoint {name}: step {step!r} must be a non-negative integer")
        a = np.asarray(array)
        if a.dtype.kind not in "fiub":
            raise DumpError(f"checkpoint {checkpoint_key(name, step)}: dtype {a.dtype} is not numeric")
        self.checkpoints.append(DumpCheckpoint(
            name=name, step=step, array=np.array(a, dtype="<f4", order="C"), layout=layout,
            token_positions=token_positions, logits_processed=logits_processed,
        ))

    def write(self, out_dir: str | Path, *, overwrite: bool = False) -> Path:
        """Write atomically (temp sibling + rename); an existing X-Ray dump only with
        `overwrite` (the CLI's --force), anything else never."""
        return write_dump(
            out_dir, self.checkpoints, family=self.family, model_id=self.model_id, producer=self.producer,
            weights_sha256=self.weights_sha256, audio_sha256=self.audio_sha256, tools=self.tools,
            tokens=[int(t) for t in self.tokens], transcript=self.transcript, stats_only=self.stats_only,
            overwrite=overwrite, extra=self.extra or None, engine_weights=self.engine_weights,
            _rust_manifest=True,
        )


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass
class Dump:
    """A loaded dump: the manifest, its checkpoints (arrays loaded unless stats-only), and the
    files present in the directory that the manifest does not list (reported, ignored)."""

    path: Path
    manifest: dict
    checkpoints: list[DumpCheckpoint]
    unlisted: list[str]

    def get(self, name: str, step: int) -> DumpCheckpoint:
        for c in self.checkpoints:
            if c.name == name and c.step == step:
                return c
        raise KeyError(f"{self.path}: no checkpoint {checkpoint_key(name, step)}")


def read_dump(path: str | Path) -> Dump:
    """Load and verify a dump (docs/dump-format.md, "Loading rules"). Any failure raises DumpError
    naming the file; nothing is returned from a dump that did not load completely."""
    d = Path(path)
    mpath = d / "manifest.json"
    if not mpath.is_file():
        raise DumpError(f"{mpath}: missing (is {d} a dump directory?)")
    m = read_json_object(mpath, DumpError)
    if m.get("schema") != SCHEMA:
        raise DumpError(f"{mpath}: schema is {m.get('schema')!r}, expected {SCHEMA!r}")
    if m.get("version") != VERSION:
        raise DumpError(f"{mpath}: version {m.get('version')!r}, this reader reads version {VERSION}")
    for key in ("family", "producer", "checkpoints"):
        if key not in m:
            raise DumpError(f"{mpath}: lacks the key {key!r}")
    stats_only = bool(m.get("stats_only", False))
    if not isinstance(m["checkpoints"], list):
        raise DumpError(f"{mpath}: 'checkpoints' is not a list")
    out: list[DumpCheckpoint] = []
    seen: set[tuple[str, int]] = set()
    listed: set[str] = {"manifest.json"}
    for i, e in enumerate(m["checkpoints"]):
        where = f"{mpath} checkpoints[{i}]"
        if not isinstance(e, dict):
            raise DumpError(f"{where}: not an object")
        for key in ("name", "step", "shape", "dtype", "layout"):
            if key not in e:
                raise DumpError(f"{where}: lacks {key!r}")
        name, step = e["name"], e["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise DumpError(f"{where} ({name}): step {step!r} is not a non-negative integer")
        where = f"{mpath} checkpoint {checkpoint_key(name, step)}"
        if (name, step) in seen:
            raise DumpError(f"{where}: listed twice")
        seen.add((name, step))
        if e["dtype"] not in DTYPES:
            raise DumpError(f"{where}: dtype {e['dtype']!r} is not one of {sorted(DTYPES)}")
        if e["layout"] not in LAYOUTS:
            raise DumpError(f"{where}: layout {e['layout']!r} is not one of {LAYOUTS}")
        shape = e["shape"]
        if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
            raise DumpError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        for key, allowed in (("token_positions", TOKEN_POSITIONS), ("logits_processed", LOGITS_PROCESSED)):
            if e.get(key) is not None and e[key] not in allowed:
                raise DumpError(f"{where}: {key} {e[key]!r} is not one of {allowed}")
        c = DumpCheckpoint(name=name, step=step, array=None, layout=e["layout"], shape=list(shape), dtype=e["dtype"],
                           token_positions=e.get("token_positions"), logits_processed=e.get("logits_processed"))
        if stats_only:
            if "stats" not in e or "content_sha256" not in e:
                raise DumpError(f"{where}: a stats-only entry needs 'stats' and 'content_sha256'")
            st = e["stats"]
            sk = st.get("sketch") if isinstance(st, dict) else None
            if not isinstance(sk, list) or len(sk) != SKETCH_LEN or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in sk
            ):
                raise DumpError(f"{where}: a stats-only entry needs an order-sensitive 'sketch' of {SKETCH_LEN} finite numbers")
            c.stats, c.content_sha256 = st, e["content_sha256"]
        else:
            for key in ("file", "sha256"):
                if key not in e:
                    raise DumpError(f"{where}: lacks {key!r}")
            fname = e["file"]
            if not isinstance(fname, str) or "/" in fname or "\\" in fname or fname.startswith("."):
                raise DumpError(f"{where}: file {fname!r} is not a plain file name inside the dump")
            fpath = d / fname
            listed.add(fname)
            if not fpath.is_file():
                raise DumpError(f"{fpath}: missing (listed in {mpath} for {checkpoint_key(name, step)})")
            data = fpath.read_bytes()
            got = sha256_bytes(data)
            if got != e["sha256"]:
                raise DumpError(f"{fpath}: sha256 {got} does not match the manifest's {e['sha256']} (corrupt or modified)")
            arr = parse_npy(data, str(fpath))
            if arr.dtype.str != DTYPES[e["dtype"]]:
                raise DumpError(f"{fpath}: dtype {arr.dtype.str} but the manifest says {e['dtype']}")
            if list(arr.shape) != list(shape):
                raise DumpError(f"{fpath}: shape {list(arr.shape)} but the manifest says {shape}")
            c.array, c.file, c.sha256 = arr, fname, e["sha256"]
        out.append(c)
    unlisted = sorted(p.name for p in d.iterdir() if p.name not in listed)
    return Dump(d, m, out, unlisted)
