"""Op-level points on the reference side: the tensors at the boundaries of the model's modules,
named `{module}:{in|out}` (xray-core's `ops` module; docs/dump-format.md, "Op-level points").

One recorder serves every family: `OpRecorder(model, ops, contract, step)` hooks the selected modules
(`ops="all"`: every module that has parameters of its own; a list: exactly the named points) and
copies each firing out, in firing order, tagged with `step()` at the time it fired. The Whisper
recorder passes its decode-step counter; a single-pass model (granite_nar) passes nothing (step 0).

Rules (each checked where it can fail):
- `in` is the module's first positional input (forward pre-hook, `args[0]`), or the keyword argument
  its rule names (`kwarg`: WhisperPositionalEmbedding looks up `position_ids`); `out` is its output
  (forward hook; a tuple or a transformers ModelOutput gives its element 0).
- `keys` / `values` are a decoder self-attention's cache after the call (forward hook): its `cache`
  keyword argument (an EncoderDecoderCache's `self_attention_cache`), layer `module.layer_idx`,
  `.keys` / `.values`. They exist only where a contract rule declares them (`ops="all"` hooks those
  modules too); a call without a cache is a CaptureError naming the point.
- integer and boolean tensors (token ids, positions) become float32; float16/bfloat16 become
  float32; float32/float64 are kept as computed.
- shape and layout are declared, never guessed: each point is brought to the engine's form by the
  first rule of the contract's `points` that matches it (`contract.PointRule`: its layout and its
  transforms, `xray_oracle.transforms`, the same vocabulary and code as the checkpoints'; a batch
  axis of 1 is dropped only where a rule says `squeeze_batch`). A captured point no rule declares
  is a ContractError naming it; a tensor its rule's transforms do not fit is a CaptureError.
- one firing per point per step: a second one is a CaptureError naming the point and the step; an
  explicitly named point that never fired is a CaptureError naming it ("all" simply has no point
  for a module that never runs).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np

from . import transforms
from .dump import checkpoint_key
from .errors import CaptureError, OracleInputError
from .recorder import Hooks

ALL = "all"
SIDES = ("in", "out")
CACHE_SIDES = ("keys", "values")
ALL_SIDES = SIDES + CACHE_SIDES

OpsArg = Union[None, str, list, tuple]


def parse_ops(ops: OpsArg) -> Union[None, str, list[str]]:
    """Validate an `ops` argument without torch: None (no points), "all", or a list of point names
    `{module}:in` / `{module}:out`. Returns None, "all", or the names (duplicates dropped, order
    kept); an empty list is None. Anything else is an OracleInputError naming the bad value."""
    if ops is None:
        return None
    if isinstance(ops, str):
        if ops == ALL:
            return ALL
        raise OracleInputError(
            f"ops {ops!r} is neither 'all' nor a list of op-level point names such as "
            "'model.encoder.layers.0.fc2:out'"
        )
    if not isinstance(ops, (list, tuple)):
        raise OracleInputError(f"ops must be None, 'all' or a list of point names, got a {type(ops).__name__}")
    names: list[str] = []
    for name in ops:
        if not isinstance(name, str):
            raise OracleInputError(f"op-level point {name!r} is a {type(name).__name__}, not a name")
        module, sep, side = name.rpartition(":")
        if not sep or not module or side not in ALL_SIDES:
            raise OracleInputError(
                f"op-level point {name!r}: not '{{module}}:in', ':out', ':keys' or ':values' (a module's dotted "
                "path from the model root, e.g. 'model.encoder.layers.3.fc2:out')"
            )
        if name not in names:
            names.append(name)
    return names or None


def _has_own_parameters(module) -> bool:
    return next(module.parameters(recurse=False), None) is not None


class OpRecorder(Hooks):
    """Forward pre-hooks / hooks on the selected modules; `points()` after the run.

    `ops` is validated by `parse_ops`; module names are checked against the model at construction
    (before anything runs): an unknown module is an OracleInputError naming the point and the
    nearest module paths the model has. `step` returns the current step when a hook fires.
    `contract` is the resolved contract (`contract.Contract`: its `points` rules and dims);
    `symbols` returns the run-time symbols a rule's `crop` names, called once by `points()`."""

    def __init__(self, model, ops: OpsArg, contract, step: Optional[Callable[[], int]] = None,
                 symbols: Optional[Callable[[], dict]] = None):
        self.model = model
        self.contract = contract
        self.selection = parse_ops(ops)
        self.step = step or (lambda: 0)
        self.symbols = symbols or dict
        super().__init__()
        self.captured: list[dict] = []
        self._seen: set[tuple[str, int]] = set()
        self._kwargs: dict[str, Optional[str]] = {}  # point -> its rule's kwarg, looked up once
        # (module path, module, sides) in the model's module order
        self.targets: list[tuple[str, Any, tuple[str, ...]]] = []
        if self.selection is None:
            return
        if self.selection == ALL:
            for path, mod in model.named_modules():
                # A module's in/out where it has parameters of its own; a cache where the
                # contract declares one.
                sides = (SIDES if _has_own_parameters(mod) else ()) + tuple(
                    s for s in CACHE_SIDES if contract.declares(f"{path}:{s}"))
                if path and sides:
                    self.targets.append((path, mod, sides))
            return
        wanted: dict[str, list[str]] = {}
        for name in self.selection:
            module, _, side = name.rpartition(":")
            wanted.setdefault(module, []).append(side)
        for path, sides in wanted.items():
            try:
                mod = model.get_submodule(path)
            except AttributeError:
                raise OracleInputError(
                    f"op-level point {path}:{sides[0]}: the model ({type(model).__name__}) has no module {path!r}"
                    f"{_nearby(model, path)}"
                ) from None
            self.targets.append((path, mod, tuple(s for s in ALL_SIDES if s in sides)))

    def install(self) -> "OpRecorder":
        for path, mod, sides in self.targets:
            if "in" in sides:
                self._handles.append(
                    mod.register_forward_pre_hook(
                        lambda m, args, kwargs, p=path: self._take(m, p, "in", args, kwargs), with_kwargs=True
                    )
                )
            if "out" in sides:
                self._handles.append(
                    mod.register_forward_hook(lambda m, args, out, p=path: self._take(m, p, "out", out, None))
                )
            for side in (s for s in CACHE_SIDES if s in sides):
                self._handles.append(
                    mod.register_forward_hook(
                        lambda m, args, kwargs, out, p=path, s=side: self._take(m, p, s, _cache(m, p, s, kwargs), None),
                        with_kwargs=True,
                    )
                )
        return self

    def _kwarg(self, name: str) -> Optional[str]:
        """The keyword argument point `name`'s rule takes its `in` from (contract.point_kwarg),
        looked up once per point rather than at every firing."""
        if name not in self._kwargs:
            self._kwargs[name] = self.contract.point_kwarg(name)
        return self._kwargs[name]

    def _take(self, module, path: str, side: str, value: Any, kwargs: Optional[dict]) -> None:
        import torch

        name = f"{path}:{side}"
        step = self.step()
        if (name, step) in self._seen:
            raise CaptureError(
                f"op-level point {name}: {path} ran twice at step {step}; a point is one firing per step"
            )
        self._seen.add((name, step))
        kwarg = self._kwarg(name) if side == "in" else None
        if kwarg is not None:
            if kwarg not in (kwargs or {}):
                raise CaptureError(
                    f"op-level point {name}: its rule takes the keyword argument {kwarg!r}, and {path} was "
                    f"called without it (keyword arguments: {sorted(kwargs or {})})"
                )
            t = kwargs[kwarg]
            what = f"keyword argument {kwarg!r}"
        elif side == "in":
            if not value:
                raise CaptureError(
                    f"op-level point {name}: {path} was called with no positional input "
                    f"(keyword arguments only: {sorted(kwargs or {})}); `in` is the first positional input"
                )
            t = value[0]
            what = "first positional input"
        elif side in CACHE_SIDES:
            t = value
            what = f"cache's {side}"
        else:
            t = value
            if isinstance(value, (tuple, list)):
                t = value[0] if len(value) else None
            elif not torch.is_tensor(value) and hasattr(value, "to_tuple"):
                tup = value.to_tuple()
                t = tup[0] if tup else None
            what = "output"
        if not torch.is_tensor(t):
            raise CaptureError(
                f"op-level point {name}: {path}'s {what} is a {type(value).__name__} whose first element "
                f"is a {type(t).__name__}, not a tensor"
            )
        t = t.detach()
        if not t.is_floating_point() or t.dtype in (torch.float16, torch.bfloat16):
            t = t.to(torch.float32)
        a = np.ascontiguousarray(t.to("cpu").numpy()).copy()
        self.captured.append({"name": name, "step": step, "array": a, "seq": len(self.captured)})

    def points(self) -> list[dict]:
        """The captured points [{"name", "step", "layout", "array"}] sorted by (step, firing
        order), each brought to the engine's form by its rule. An explicitly named point that never
        fired is a CaptureError naming it; a point no rule declares is a ContractError."""
        if isinstance(self.selection, list):
            fired = {c["name"] for c in self.captured}
            missing = [n for n in self.selection if n not in fired]
            if missing:
                raise CaptureError(
                    f"op-level point(s) {missing} never fired: the module exists but the run never called it "
                    "(a module whose weight is read directly, such as an embedding table, has no points)"
                )
        out = sorted(self.captured, key=lambda c: (c["step"], c["seq"]))
        symbols = self.symbols() if out else {}
        aligned = []
        for c in out:
            rule = self.contract.point_rule(c["name"])
            where = f"op-level point {checkpoint_key(c['name'], c['step'])} (rule {rule.module!r})"
            a = transforms.apply(c["array"], rule.transform, where, self.contract.dims, symbols)
            aligned.append({"name": c["name"], "step": c["step"], "layout": rule.layout, "array": a})
        return aligned


def _cache(module, path: str, side: str, kwargs: dict):
    """The `keys` or `values` of the self-attention cache `module` updated in its call."""
    name = f"{path}:{side}"
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is None:
        raise CaptureError(f"op-level point {name}: {path} was called without a cache (keyword `cache`); "
                           f"`{side}` is a decoder self-attention's cache after the call")
    cache = getattr(cache, "self_attention_cache", cache)
    idx = getattr(module, "layer_idx", None)
    layers = getattr(cache, "layers", None)
    if idx is None or layers is None or not 0 <= idx < len(layers):
        raise CaptureError(f"op-level point {name}: {type(cache).__name__} has no layer {idx!r} "
                           f"({type(module).__name__}.layer_idx) to read the {side} from")
    return getattr(layers[idx], side)


def _nearby(model, path: str) -> str:
    """A hint: module paths of the model that share the longest prefix with `path`."""
    parts = path.split(".")
    names = [n for n, _ in model.named_modules() if n]
    for k in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:k])
        near = [n for n in names if n.startswith(prefix + ".") and n.count(".") == prefix.count(".") + 1] if prefix else \
            [n for n in names if "." not in n]
        if near:
            return f"; {prefix or 'the root'} has {near[:8]}"
    return ""
