"""The one reference recorder of every family: the torch hooks that copy a resolved contract's
checkpoints (`contract.Checkpoint.reference`: module, hook, index, kwarg, transform) out of a
reference run, and the check of what was captured against the contract.

A family module supplies only what is its own:
- which checkpoints (`select`: the contract's, or those `only` names);
- how the step advances (`StepBy`): every call of one module starts the next step (Whisper: its
  decoder, once per decode step; `on_call` sees each call's arguments); without it the run is one
  pass and every checkpoint is at step 0 (granite_nar);
- the run-time symbols it knows at each step (`Recorder.collect`'s `known`; Whisper: `tokens` and
  `past+tokens`); a symbol it does not know is bound by the first checkpoint that has it.

Rules (each checked where it can fail; every message names the checkpoint):
- a hook is a forward hook (`forward`: the module's output) or a forward pre-hook (`pre`: its
  positional inputs, or with `kwarg` that keyword argument); a module the model does not have or a
  hook kind the oracle does not install is a ContractError;
- `index` selects an element of a tuple / list; on a bare tensor only index 0 (the tensor) is
  valid; a transformers ModelOutput at index 0 gives its `last_hidden_state`;
- integer and boolean tensors (ids, positions) become the run's float dtype (float64 in a float64
  run, else float32); float16 / bfloat16 become float32; float32 / float64 are kept as computed;
- the contract's transforms (`transforms.apply`) bring each tensor to the engine's form as it
  fires, and it is copied out then (reference code may change a block's output in place later);
- one call per checkpoint per step: a second is a CaptureError;
- stats-only (`summarize`): each float32 array is handed to `summarize` as it is produced and only
  its shape and the returned int are kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Self

import numpy as np

from . import transforms
from .contract import Checkpoint, Contract
from .dump import checkpoint_key
from .errors import CaptureError, ContractError, OracleInputError

__all__ = ["Recorder", "StepBy", "Summary", "check_shapes", "select"]


@dataclass(frozen=True)
class StepBy:
    """How the step advances: each call of `module` (a dotted path from the model root) starts the
    next step, the first call step 0; what fires before it is at step 0 too. `on_call(args,
    kwargs)` sees each call's arguments (it may raise)."""

    module: str
    on_call: Optional[Callable[[tuple, dict], None]] = None


class Summary:
    """A stats-only capture: the tensor's shape and the index `summarize` returned for it."""

    __slots__ = ("shape", "index")

    def __init__(self, shape: tuple, index: int):
        self.shape = shape
        self.index = index


def select(contract: Contract, only: Optional[list[str]]) -> list[Checkpoint]:
    """The contract's checkpoints, or those `only` names (expanded names or templates, a template
    selecting every layer); an unknown name is an OracleInputError naming it."""
    if only is None:
        return list(contract.checkpoints)
    names = {c.name for c in contract.checkpoints} | {c.template for c in contract.checkpoints}
    unknown = [o for o in only if o not in names]
    if unknown:
        raise OracleInputError(
            f"unknown checkpoint name(s) {unknown}; the contract has e.g. "
            f"{[c.name for c in contract.checkpoints[:3]]} (templates such as "
            f"{contract.checkpoints[-2].template!r} select every layer)"
        )
    want = set(only)
    return [c for c in contract.checkpoints if c.name in want or c.template in want]


class Hooks:
    """The torch hooks a recorder installed (`_handles`), removed by `remove` or on leaving its
    `with` block. A subclass's `install` registers them and returns the recorder."""

    def __init__(self) -> None:
        self._handles: list = []

    def install(self) -> Self:
        raise NotImplementedError

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> Self:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class Recorder(Hooks):
    """Forward hooks / pre-hooks that copy `selected` checkpoints out of a run of `model`, per step
    (`step_by`; None: one pass, step 0). `captured[(name, step)]` is the array (a `Summary` with
    `summarize`); `collect` checks and returns them. Use as a context manager, or `install` /
    `remove`."""

    def __init__(self, model, contract: Contract, selected: list[Checkpoint], *,
                 step_by: Optional[StepBy] = None, summarize: Optional[Callable[[np.ndarray], int]] = None):
        self.model = model
        self.contract = contract
        self.selected = selected
        self.step_by = step_by
        self.summarize = summarize
        self.step = 0
        self.calls = 0  # calls of step_by's module
        super().__init__()
        self.captured: dict[tuple[str, int], np.ndarray | Summary] = {}
        self._int_dtype = None

    @property
    def steps(self) -> int:
        """How many steps ran: the calls of step_by's module, or 1 (one pass)."""
        return self.calls if self.step_by is not None else 1

    def _module(self, path: str, what: str):
        try:
            return self.model.get_submodule(path)
        except AttributeError:
            raise ContractError(f"{what} {path!r} does not exist in {type(self.model).__name__}") from None

    def install(self) -> "Recorder":
        """Install the hooks (the step's first, so it fires before any checkpoint of its call).
        Module names and hook kinds are checked here, before anything runs."""
        import torch

        p = next(self.model.parameters(), None)
        self._int_dtype = torch.float64 if p is not None and p.dtype == torch.float64 else torch.float32
        try:
            if self.step_by is not None:
                by = self.step_by
                mod = self._module(by.module, "the step's module")
                self._handles.append(mod.register_forward_pre_hook(self._next_step, with_kwargs=True))
            for ck in self.selected:
                self._install(ck)
        except BaseException:
            self.remove()
            raise
        return self

    def _install(self, ck: Checkpoint) -> None:
        ref = ck.reference
        mod = self._module(ref.module, f"checkpoint {ck.name}: contract reference module")
        if ref.hook == "forward":
            h = mod.register_forward_hook(lambda m, a, k, out, c=ck: self._take(c, out, "output"), with_kwargs=True)
        elif ref.hook == "pre" and ref.kwarg is not None:
            h = mod.register_forward_pre_hook(lambda m, a, k, c=ck: self._take_kwarg(c, k), with_kwargs=True)
        elif ref.hook == "pre":
            h = mod.register_forward_pre_hook(lambda m, a, k, c=ck: self._take(c, a, "positional inputs"),
                                              with_kwargs=True)
        else:
            raise ContractError(
                f"checkpoint {ck.name}: reference hook kind {ref.hook!r} on {ref.module} is not one the oracle "
                "installs ('forward': the module's output, 'pre': its inputs)"
            )
        self._handles.append(h)

    def _next_step(self, _module, args, kwargs) -> None:
        self.step = self.calls
        self.calls += 1
        if self.step_by.on_call is not None:
            self.step_by.on_call(args, kwargs)

    def _take_kwarg(self, ck: Checkpoint, kwargs: dict) -> None:
        name = ck.reference.kwarg
        value = kwargs.get(name)
        if value is None:
            raise CaptureError(f"checkpoint {ck.name}: {ck.reference.module} was called without keyword argument {name!r}")
        self._take(ck, value, f"keyword argument {name!r}")

    def _element(self, ck: Checkpoint, value: Any, what: str):
        """The tensor `reference.index` selects in `value` (a CaptureError naming why not)."""
        import torch

        ref = ck.reference
        if isinstance(value, (tuple, list)):
            if ref.index >= len(value):
                raise CaptureError(
                    f"checkpoint {ck.name}: {ref.module} {what} has {len(value)} elements, contract index is {ref.index}"
                )
            t = value[ref.index]
            if t is None:
                raise CaptureError(
                    f"checkpoint {ck.name}: {ref.module} {what}[{ref.index}] is None; HF returns attention "
                    "probabilities only with attn_implementation='eager' (select other checkpoints with `only` "
                    "to run sdpa)"
                )
        elif torch.is_tensor(value):
            # A module returning a bare tensor (an encoder / decoder layer, nn.Linear): index 0 is
            # the tensor itself.
            if ref.index != 0:
                raise CaptureError(f"checkpoint {ck.name}: {ref.module} {what} is a single tensor, contract index is {ref.index}")
            t = value
        else:
            t = getattr(value, "last_hidden_state", None) if ref.index == 0 else None
            if t is None:
                raise CaptureError(f"checkpoint {ck.name}: {ref.module} {what} is a {type(value).__name__}, not a tensor or tuple")
        if not torch.is_tensor(t):
            raise CaptureError(f"checkpoint {ck.name}: {ref.module} {what}[{ref.index}] is a {type(t).__name__}, not a tensor")
        return t

    def _take(self, ck: Checkpoint, value: Any, what: str) -> None:
        import torch

        key = (ck.name, self.step)
        if key in self.captured:
            raise CaptureError(
                f"checkpoint {ck.name}: {ck.reference.module} ran twice at step {self.step}; the contract expects "
                "one call per step"
            )
        t = self._element(ck, value, what).detach()
        if not t.is_floating_point():
            # Ids and positions are compared as floats, in the run's dtype like every checkpoint.
            t = t.to(self._int_dtype)
        elif t.dtype in (torch.float16, torch.bfloat16):
            t = t.to(torch.float32)
        a = transforms.apply(t.to("cpu").numpy(), ck.reference.transform, f"checkpoint {ck.name}", self.contract.dims)
        if self.summarize is None:
            self.captured[key] = a.copy()  # ours: the tensor's storage may change after the hook
            return
        if a.dtype != np.float32:
            raise CaptureError(f"checkpoint {ck.name}: stats-only capture summarizes float32, got {a.dtype}")
        self.captured[key] = Summary(tuple(a.shape), int(self.summarize(a)))

    def collect(self, known: Optional[Callable[[int], Mapping[str, int]]] = None) -> list[dict]:
        """Every selected checkpoint at exactly its steps (`every`: each step run, `once` /
        `prefill`: step 0) with its contract shape (`check_shapes`; `known(step)`: the symbols
        the family knows at that step), as [{"name", "step", "layout", "array"}] (stats-only:
        "shape" and "summary" instead of "array") sorted by (step, contract order)."""
        steps = self.steps
        for ck in self.selected:
            want = list(range(steps)) if ck.steps == "every" else [0]
            got = sorted(s for (n, s) in self.captured if n == ck.name)
            if got != want:
                raise CaptureError(
                    f"checkpoint {ck.name} (steps: {ck.steps}, hook {ck.reference.hook} on {ck.reference.module}): "
                    f"captured at steps {got} of {steps}; missing {sorted(set(want) - set(got))}, "
                    f"unexpected {sorted(set(got) - set(want))}"
                )
        shapes = {k: tuple(a.shape) for k, a in self.captured.items()}
        check_shapes(self.contract, self.selected, shapes, known)
        order = {ck.name: ck.order for ck in self.selected}
        layout = {ck.name: ck.layout for ck in self.selected}
        out = []
        for (name, step), a in sorted(self.captured.items(), key=lambda kv: (kv[0][1], order[kv[0][0]])):
            e: dict = {"name": name, "step": step, "layout": layout[name]}
            if isinstance(a, Summary):
                e.update(shape=list(a.shape), summary=a.index)
            else:
                e["array"] = a
            out.append(e)
        return out


def check_shapes(contract: Contract, checkpoints: list[Checkpoint], shapes: Mapping[tuple[str, int], tuple],
                 known: Optional[Callable[[int], Mapping[str, int]]] = None) -> dict[int, dict[str, int]]:
    """Check each captured shape (`shapes[(name, step)]`, `checkpoints` only) against its
    checkpoint's contract shape: a number must match; a run-time symbol takes the value
    `known(step)` gives it, else one value per step, bound by the first checkpoint (in contract
    order) that has it. A symbol neither known nor declared in the contract's `symbols` is a
    ContractError. Returns the bindings per step; the relations between symbols (the contract's
    `symbols` block) are checked by the Rust side when the run returns (xray-core's
    `Contract::check_shapes`)."""
    by_name = {ck.name: ck for ck in checkpoints}
    keys = sorted((k for k in shapes if k[0] in by_name), key=lambda k: (k[1], by_name[k[0]].order))
    bound_at: dict[int, dict[str, int]] = {}
    bound: dict[str, tuple[int, str]] = {}
    given: dict[str, int] = {}
    for name, step in keys:
        ck, got = by_name[name], list(shapes[(name, step)])
        if step not in bound_at:
            given = dict(known(step)) if known is not None else {}
            bound = {s: (v, "") for s, v in given.items()}
            bound_at[step] = dict(given)
        if len(got) != len(ck.shape):
            raise CaptureError(f"checkpoint {checkpoint_key(name, step)}: HF gives shape {got}, the contract says "
                               f"{ck.shape}")
        expected: list = []
        for dim, g in zip(ck.shape, got, strict=True):
            if isinstance(dim, int):
                expected.append(dim)
            elif dim in bound:
                expected.append(bound[dim][0])
            elif dim in contract.symbols:
                bound[dim] = (g, f" from {name}")
                bound_at[step][dim] = g
                expected.append(g)
            else:
                raise ContractError(
                    f"checkpoint {name}: shape symbol {dim!r} is neither a dim, a symbol of the contract "
                    f"({sorted(contract.symbols)}) nor one this run binds ({sorted(given)})"
                )
        if got != expected:
            values = ", ".join(f"{s} = {bound[s][0]}{bound[s][1]}" for s in dict.fromkeys(ck.shape)
                               if isinstance(s, str) and s in bound)
            raise CaptureError(
                f"checkpoint {checkpoint_key(name, step)}: HF gives shape {got}, the contract says "
                f"{ck.shape} = {expected}" + (f" ({values})" if values else "")
            )
    return bound_at
