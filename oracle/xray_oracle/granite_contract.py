"""Reference capture for the granite_nar oracle: forward hooks / pre-hooks that copy the contract's
checkpoints out of one forward pass, the reference transforms, and the shape / symbol binding check
after the run. The contract arrives resolved (`xray_oracle.contract.load_resolved`); the relations
between symbols are checked on the Rust side (xray-core's `Contract::check_shapes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import transforms
from .contract import Checkpoint, Contract, ContractError, load_resolved

__all__ = ["Checkpoint", "Contract", "ContractError", "Recorder", "check_shapes",
           "load_resolved"]


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    # Copy immediately: some reference code mutates block outputs in place after the hook fires.
    return t.detach().to(device="cpu", dtype=torch.float32).clone().numpy()


class Recorder:
    """Installs one hook per contract checkpoint and collects the transformed arrays."""

    def __init__(self, model: torch.nn.Module, checkpoints: list[Checkpoint], dims: dict[str, int]):
        self.model = model
        self.checkpoints = checkpoints
        self.dims = dims
        self.captured: dict[str, np.ndarray] = {}
        self._handles: list[Any] = []

    def _grab(self, ck: Checkpoint, tensor: Any) -> None:
        if ck.name in self.captured:
            raise ContractError(f"{ck.name}: hook on '{ck.reference.module}' fired more than once")
        if not isinstance(tensor, torch.Tensor):
            raise ContractError(f"{ck.name}: hook captured {type(tensor).__name__}, not a tensor")
        a = transforms.apply(_to_numpy(tensor), ck.reference.transform, ck.name, self.dims)
        self.captured[ck.name] = np.ascontiguousarray(a, dtype=np.float32)

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
