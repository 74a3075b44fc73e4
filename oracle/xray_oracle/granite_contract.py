"""Reference capture for the granite_nar oracle: forward hooks / pre-hooks that copy the contract's
checkpoints out of one forward pass, the reference transforms, and the shape / symbol binding check
after the run. The contract arrives resolved (`xray_oracle.contract.load_resolved`); the relations
between symbols are checked on the Rust side (xray-core's `Contract::check_shapes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .contract import Checkpoint, Contract, ContractError, load_resolved

__all__ = ["Checkpoint", "Contract", "ContractError", "Recorder", "apply_transforms", "check_shapes",
           "load_resolved"]


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    # Copy immediately: some reference code mutates block outputs in place after the hook fires.
    return t.detach().to(device="cpu", dtype=torch.float32).clone().numpy()


def apply_transforms(a: np.ndarray, transforms: list[str], name: str) -> np.ndarray:
    """Apply the contract's reference transforms to a captured array."""
    for t in transforms:
        if t == "squeeze_batch":
            if a.ndim == 0 or a.shape[0] != 1:
                raise ContractError(f"{name}: squeeze_batch on shape {list(a.shape)} (batch must be 1)")
            a = a[0]
        elif t == "flatten_windows":
            if a.ndim != 3:
                raise ContractError(f"{name}: flatten_windows needs 3 axes, got {list(a.shape)}")
            a = a.reshape(a.shape[0] * a.shape[1], a.shape[2])
        else:
            raise ContractError(f"{name}: unknown reference transform '{t}'")
    return np.ascontiguousarray(a, dtype=np.float32)


class Recorder:
    """Installs one hook per contract checkpoint and collects the transformed arrays."""

    def __init__(self, model: torch.nn.Module, checkpoints: list[Checkpoint]):
        self.model = model
        self.checkpoints = checkpoints
        self.captured: dict[str, np.ndarray] = {}
        self._handles: list[Any] = []

    def _grab(self, ck: Checkpoint, tensor: Any) -> None:
        if ck.name in self.captured:
            raise ContractError(f"{ck.name}: hook on '{ck.reference.module}' fired more than once")
        if not isinstance(tensor, torch.Tensor):
            raise ContractError(f"{ck.name}: hook captured {type(tensor).__name__}, not a tensor")
        self.captured[ck.name] = apply_transforms(_to_numpy(tensor), ck.reference.transform, ck.name)

    def __enter__(self) -> "Recorder":
        for ck in self.checkpoints:
            ref = ck.reference
            try:
                module = self.model.get_submodule(ref.module)
            except AttributeError as e:
                raise ContractError(f"{ck.name}: reference module '{ref.module}' does not exist") from e
            hook = ref.hook
            if hook == "pre":
                if ref.kwarg is not None:

                    def pre_kw(_m, _args, kwargs, _ck=ck):
                        self._grab(_ck, kwargs.get(_ck.reference.kwarg))

                    self._handles.append(module.register_forward_pre_hook(pre_kw, with_kwargs=True))
                else:

                    def pre(_m, args, _ck=ck):
                        self._grab(_ck, args[_ck.reference.index])

                    self._handles.append(module.register_forward_pre_hook(pre))
            elif hook == "forward":

                def fwd(_m, _args, output, _ck=ck):
                    idx = _ck.reference.index
                    out = output[idx] if isinstance(output, (tuple, list)) else output
                    self._grab(_ck, out)

                self._handles.append(module.register_forward_hook(fwd))
            else:
                raise ContractError(f"{ck.name}: unknown hook kind '{hook}'")
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def check_shapes(resolved: Contract, checkpoints: list[Checkpoint], arrays: dict[str, np.ndarray]) -> dict[str, int]:
    """Check every captured array against its contract shape and bind the run-time symbols (one
    value per symbol). Returns the bindings; the relations between symbols (the contract's
    `symbols` block) are checked by the Rust side when the run returns."""
    bound: dict[str, int] = {}
    for ck in checkpoints:
        if ck.name not in arrays:
            raise ContractError(f"{ck.name}: not captured (hook on '{ck.reference.module}' never fired)")
        a = arrays[ck.name]
        if a.ndim != len(ck.shape):
            raise ContractError(f"{ck.name}: captured shape {list(a.shape)}, contract {ck.shape}")
        for axis, (want, got) in enumerate(zip(ck.shape, a.shape, strict=True)):
            if isinstance(want, int):
                if want != got:
                    raise ContractError(f"{ck.name}: axis {axis} is {got}, contract says {want}")
            elif want in bound and bound[want] != got:
                raise ContractError(f"{ck.name}: symbol '{want}' is {got} here but {bound[want]} elsewhere")
            else:
                bound[want] = got
    return bound
