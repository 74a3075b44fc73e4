"""The contract's reference transforms, implemented once for every family and for both kinds of
capture: a checkpoint's `reference.transform` and an op-level point's rule (`points` in the
contract; xray-core's `contract::Transform` and `contract::PointRule` are the declarations).

A transform brings a tensor as the HF reference computed it to the engine's canonical form
(`apply`):
- `"squeeze_batch"`: drop a leading batch axis of 1 (any other size is an error);
- `"split_heads"`: `[T, heads * head_dim]` -> `[heads, T, head_dim]` (dims `heads`, `head_dim`);
- `{"flatten_windows": {"per_window": NAME}}`: `[windows, NAME, d]` -> `[windows * NAME, d]`, NAME
  a dim (the window's length, checked);
- `{"crop": {"axis": A, "to": NAME}}`: keep the first NAME entries along axis A, NAME a dim of
  the contract or a run-time symbol the caller binds (the reference padded that axis); the tensor
  must be at least that long.
`undo` is the way back, for a tensor in the engine's form handed to a reference module (replay):
the batch axis re-added, heads merged, windows of NAME rows restored; a crop's entries are the
ones the engine holds (what the reference padded is in no engine tensor), so its NAME is bound
to the tensor's length along the axis when the caller has not bound it, and checked when it has.
An unknown transform is a ContractError; a tensor a transform does not fit is a CaptureError
naming it, never a silent reshape.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from .errors import CaptureError, ContractError

NAMES = ("squeeze_batch", "split_heads")
KEYED = ("crop", "flatten_windows")


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
    if isinstance(t, dict) and len(t) == 1 and "flatten_windows" in t:
        c = t["flatten_windows"]
        if not (isinstance(c, dict) and set(c) == {"per_window"} and isinstance(c["per_window"], str)
                and c["per_window"]):
            raise ContractError(f"{where}: flatten_windows {c!r} is not {{'per_window': NAME}}")
        return
    raise ContractError(f"{where}: unknown reference transform {t!r} (known: {NAMES + KEYED})")


def describe(t: Any) -> str:
    """`crop(axis 0 to enc_frames)` / `squeeze_batch`: for messages."""
    if isinstance(t, dict) and "crop" in t:
        return f"crop(axis {t['crop']['axis']} to {t['crop']['to']})"
    if isinstance(t, dict) and "flatten_windows" in t:
        return f"flatten_windows(per_window {t['flatten_windows']['per_window']})"
    return str(t)


def _size(name: str, where: str, what: str, dims: Mapping[str, int], symbols: Optional[Mapping[str, int]]) -> int:
    """A dim's value, else a bound run-time symbol's (a CaptureError naming both when neither)."""
    n = dims.get(name)
    if n is None:
        n = (symbols or {}).get(name)
    if n is None:
        raise CaptureError(f"{where}: {what} {name!r}, which this run did not bind (known: {sorted(symbols or {})})")
    return n


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
        elif isinstance(t, dict) and "flatten_windows" in t:
            name = t["flatten_windows"]["per_window"]
            n = _size(name, where, "flatten_windows per_window", dims, symbols)
            if a.ndim != 3 or a.shape[1] != n:
                raise CaptureError(f"{where}: flatten_windows needs [windows, {name} = {n}, d], got shape {shape}")
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
            n = _size(name, where, "crop to", dims, symbols)
            if axis >= a.ndim or a.shape[axis] < n:
                raise CaptureError(f"{where}: crop axis {axis} to {name} = {n} on shape {shape}")
            a = a[(slice(None),) * axis + (slice(0, n),)]
    return np.ascontiguousarray(a)


def undo(a: np.ndarray, transforms: list, where: str, dims: Mapping[str, int],
         symbols: Optional[dict] = None) -> np.ndarray:
    """The inverse of `apply`: `a` in the engine's form back to the reference's, `transforms`
    undone last to first, C-contiguous. `symbols` (updated in place) binds a crop's NAME to the
    length `a` holds along the crop's axis when neither the dims nor the caller bound it."""
    symbols = {} if symbols is None else symbols
    for t in reversed(transforms):
        check(t, where)
        shape = list(a.shape)
        if t == "squeeze_batch":
            a = a[None]
        elif t == "split_heads":
            h, hd = dims.get("heads"), dims.get("head_dim")
            if h is None or hd is None:
                raise ContractError(f"{where}: split_heads needs dims 'heads' and 'head_dim' in the contract")
            if a.ndim != 3 or a.shape[0] != h or a.shape[2] != hd:
                raise CaptureError(f"{where}: undoing split_heads expects [{h}, T, {hd}], got shape {shape}")
            a = a.transpose(1, 0, 2).reshape(a.shape[1], h * hd)
        elif isinstance(t, dict) and "flatten_windows" in t:
            name = t["flatten_windows"]["per_window"]
            n = _size(name, where, "flatten_windows per_window", dims, symbols)
            if a.ndim != 2 or a.shape[0] % n:
                raise CaptureError(f"{where}: undoing flatten_windows expects [windows * {name} = {n}, d], "
                                   f"got shape {shape}")
            a = a.reshape(a.shape[0] // n, n, a.shape[1])
        else:
            axis, name = t["crop"]["axis"], t["crop"]["to"]
            if axis >= a.ndim:
                raise CaptureError(f"{where}: undoing crop axis {axis} to {name} on shape {shape}")
            n = dims.get(name, symbols.get(name))
            if n is None:
                symbols[name] = a.shape[axis]
            elif a.shape[axis] != n:
                raise CaptureError(f"{where}: undoing crop axis {axis} to {name} = {n}: the tensor holds "
                                   f"{a.shape[axis]} (shape {shape})")
    return np.ascontiguousarray(a)
