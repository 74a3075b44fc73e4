"""The contract's reference transforms, implemented once for every family and for both kinds of
capture: a checkpoint's `reference.transform` and an op-level point's rule (`points` in the
contract; xray-core's `contract::Transform` and `contract::PointRule` are the declarations).

A transform brings a tensor as the HF reference computed it to the engine's canonical form:
- `"squeeze_batch"`: drop a leading batch axis of 1 (any other size is an error);
- `"flatten_windows"`: `[windows, per_window, d]` -> `[windows * per_window, d]`;
- `"split_heads"`: `[T, heads * head_dim]` -> `[heads, T, head_dim]` (dims `heads`, `head_dim`);
- `{"crop": {"axis": A, "to": NAME}}`: keep the first NAME entries along axis A, NAME a dim of
  the contract or a run-time symbol the caller binds (the reference padded that axis); the tensor
  must be at least that long.
An unknown transform is a ContractError; a tensor a transform does not fit is a CaptureError
naming it, never a silent reshape.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from .errors import CaptureError, ContractError

NAMES = ("squeeze_batch", "split_heads", "flatten_windows")
KEYED = ("crop",)


def check(t: Any, where: str) -> None:
    """Refuse a transform outside the vocabulary (a ContractError naming `where`)."""
    if isinstance(t, str):
        if t in NAMES:
            return
        raise ContractError(f"{where}: unknown reference transform {t!r} (known: {NAMES + KEYED})")
    if isinstance(t, dict) and len(t) == 1 and "crop" in t:
        c = t["crop"]
        if not (isinstance(c, dict) and set(c) == {"axis", "to"} and isinstance(c["axis"], int)
                and not isinstance(c["axis"], bool) and c["axis"] >= 0 and isinstance(c["to"], str) and c["to"]):
            raise ContractError(f"{where}: crop {c!r} is not {{'axis': N, 'to': NAME}}")
        return
    raise ContractError(f"{where}: unknown reference transform {t!r} (known: {NAMES + KEYED})")


def describe(t: Any) -> str:
    """`crop(axis 0 to enc_frames)` / `squeeze_batch`: for messages."""
    if isinstance(t, dict) and "crop" in t:
        return f"crop(axis {t['crop']['axis']} to {t['crop']['to']})"
    return str(t)


def apply(a: np.ndarray, transforms: list, where: str, dims: Mapping[str, int],
          symbols: Optional[Mapping[str, int]] = None) -> np.ndarray:
    """`a` with `transforms` applied in order, C-contiguous. `dims` are the contract's resolved
    dims; `symbols` the run-time symbols the caller bound (for `crop`)."""
    for t in transforms:
        check(t, where)
        shape = list(a.shape)
        if t == "squeeze_batch":
            if a.ndim == 0 or a.shape[0] != 1:
                raise CaptureError(f"{where}: squeeze_batch needs a leading batch axis of 1, got shape {shape}")
            a = a[0]
        elif t == "flatten_windows":
            if a.ndim != 3:
                raise CaptureError(f"{where}: flatten_windows needs [windows, per_window, d], got shape {shape}")
            a = a.reshape(a.shape[0] * a.shape[1], a.shape[2])
        elif t == "split_heads":
            h, hd = dims.get("heads"), dims.get("head_dim")
            if h is None or hd is None:
                raise ContractError(f"{where}: split_heads needs dims 'heads' and 'head_dim' in the contract")
            if a.ndim != 2 or a.shape[1] != h * hd:
                raise CaptureError(f"{where}: split_heads expects [T, {h}*{hd}], got shape {shape}")
            a = a.reshape(a.shape[0], h, hd).transpose(1, 0, 2)
        else:
            axis, name = t["crop"]["axis"], t["crop"]["to"]
            n = dims.get(name)
            if n is None:
                n = (symbols or {}).get(name)
            if n is None:
                raise CaptureError(
                    f"{where}: crop to {name!r}, which this run did not bind (known: {sorted(symbols or {})})")
            if axis >= a.ndim or a.shape[axis] < n:
                raise CaptureError(f"{where}: crop axis {axis} to {name} = {n} on shape {shape}")
            a = a[(slice(None),) * axis + (slice(0, n),)]
    return np.ascontiguousarray(a)
