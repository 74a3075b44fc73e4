"""Checkpoint-contract resolution and reference capture for the granite_nar oracle.

Resolves a `xray.contract/v1` file (the format of runtime/contracts/whisper.json, parsed in Rust by
runtime/src/contract.rs) against a model's config.json, including the small extensions the
granite_nar contract needs (documented in docs/granite_nar.md, "Contract format extensions"):

- `lists`: named integer lists read from the config and wrapped Python-style (`-1` = last);
  a template placeholder `{each:NAME ...}` in `inputs` expands once per element.
- `range`: `[start_expr, end_expr]` restricts a repeated template to layers `start..end-1` (so
  one repeat can be split into several templates and the file stays in topological order);
  `inputs_at_first` applies to the first layer of the range.
- `symbols`: data-dependent dims with an expression over config dims and other symbols
  (`ceil_div`, `floor_div`, `min`, `max` allowed); checked after a run.
- `reference.kwarg`: a pre-hook captures a keyword argument instead of positional `index`.
- transform `flatten_windows`: `[windows, per_window, C]` -> `[windows * per_window, C]`.

Expression semantics match the Rust `eval_expr`: integers, names (dims, repeats, dotted config
keys, `layer`, `last:REPEAT`, `each:LIST`), `+ - * /` with `/` exact integer division; this module
additionally accepts parentheses and the four functions above.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

SCHEMA = "xray.contract/v1"


class ContractError(ValueError):
    """A contract that does not parse, does not resolve against the config, or is violated."""


# --------------------------------------------------------------------------------------------
# Expressions
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_.:]*)|(.))")


def _tokenize(expr: str) -> list[str]:
    toks: list[str] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            break
        pos = m.end()
        tok = m.group(1) or m.group(2) or m.group(3)
        if tok is not None and tok.strip():
            toks.append(tok)
    return toks


_FUNCS: dict[str, Callable[[int, int], int]] = {
    "ceil_div": lambda a, b: -(-a // b),
    "floor_div": lambda a, b: a // b,
    "min": min,
    "max": max,
}


def eval_expr(expr: str, lookup: Callable[[str], int | None]) -> int:
    """Evaluate an integer expression; `lookup` resolves names (None = unknown)."""
    toks = _tokenize(expr)
    if not toks:
        raise ContractError(f"empty expression '{expr}'")
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(toks):
            raise ContractError(f"unexpected end of '{expr}'")
        pos += 1
        return toks[pos - 1]

    def atom() -> int:
        t = take()
        if t == "(":
            v = additive()
            if take() != ")":
                raise ContractError(f"missing ')' in '{expr}'")
            return v
        if t == "-":
            return -atom()
        if t.isdigit():
            return int(t)
        if t in _FUNCS and peek() == "(":
            take()
            a = additive()
            if take() != ",":
                raise ContractError(f"'{t}' takes two arguments in '{expr}'")
            b = additive()
            if take() != ")":
                raise ContractError(f"missing ')' in '{expr}'")
            if t in ("ceil_div", "floor_div") and b == 0:
                raise ContractError(f"division by zero in '{expr}'")
            return _FUNCS[t](a, b)
        v = lookup(t)
        if v is None:
            raise ContractError(f"'{t}' is not a known dim, repeat, symbol or config key (in '{expr}')")
        return v

    def product() -> int:
        acc = atom()
        while peek() in ("*", "/"):
            op = take()
            rhs = atom()
            if op == "*":
                acc *= rhs
            else:
                if rhs == 0 or acc % rhs != 0:
                    raise ContractError(f"'{expr}': {acc} is not divisible by {rhs}")
                acc //= rhs
        return acc

    def additive() -> int:
        acc = product()
        while peek() in ("+", "-"):
            op = take()
            rhs = product()
            acc = acc + rhs if op == "+" else acc - rhs
        return acc

    value = additive()
    if pos != len(toks):
        raise ContractError(f"unexpected '{toks[pos]}' in '{expr}'")
    return value


def config_value(config: dict, key: str) -> Any:
    """A dotted config key (`encoder_config.hidden_dim`), or None if absent."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _config_int(config: dict, key: str) -> int | None:
    v = config_value(config, key)
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """One expanded checkpoint."""

    name: str
    steps: str
    shape: list[int | str]
    layout: str
    producer: str
    inputs: list[str]
    reference: dict
    kind: str | None = None
    layer: int | None = None
    order: int = 0


@dataclass
class ResolvedContract:
    """A contract resolved against one config."""

    family: str
    dims: dict[str, int]
    repeats: dict[str, int]
    lists: dict[str, list[int]]
    symbols: dict[str, str]
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def get(self, name: str) -> Checkpoint:
        for c in self.checkpoints:
            if c.name == name:
                return c
        raise KeyError(name)


def load_contract(contract_json: str | os.PathLike | dict) -> dict:
    """Accept the contract as parsed JSON, JSON text, or a path to a JSON file."""
    if isinstance(contract_json, dict):
        return contract_json
    text = str(contract_json)
    if not text.lstrip().startswith("{") and os.path.exists(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(f"contract JSON does not parse: {e}") from e


def resolve(contract: dict, config: dict) -> ResolvedContract:
    """Expand a contract's templates against a model config (fails closed on anything unknown)."""
    if contract.get("schema") != SCHEMA:
        raise ContractError(f"unknown contract schema {contract.get('schema')!r}")
    fam = contract.get("family", "?")

    dims: dict[str, int] = {}
    for k, e in contract.get("dims", {}).items():
        v = eval_expr(e, lambda t: _config_int(config, t))
        if v <= 0:
            raise ContractError(f"{fam}: dim '{k}' = {e} = {v} must be positive")
        dims[k] = v

    repeats: dict[str, int] = {}
    for k, e in contract.get("repeats", {}).items():
        v = eval_expr(e, lambda t: _config_int(config, t) if _config_int(config, t) is not None else dims.get(t))
        if v <= 0:
            raise ContractError(f"{fam}: repeat '{k}' = {v} must be positive")
        repeats[k] = v

    def base_lookup(t: str) -> int | None:
        if t.startswith("last:"):
            r = repeats.get(t[5:].strip())
            return None if r is None else r - 1
        for table in (repeats, dims):
            if t in table:
                return table[t]
        return _config_int(config, t)

    lists: dict[str, list[int]] = {}
    for k, spec in contract.get("lists", {}).items():
        raw = config_value(config, spec["config"])
        if not isinstance(raw, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
            raise ContractError(f"{fam}: list '{k}': config key '{spec['config']}' is not an integer list")
        wrap = eval_expr(spec["wrap"], base_lookup)
        out = []
        for x in raw:
            if not -wrap <= x < wrap:
                raise ContractError(f"{fam}: list '{k}': element {x} outside [-{wrap}, {wrap})")
            out.append(x % wrap)
        lists[k] = out

    symbols = dict(contract.get("symbols", {}))

    checkpoints: list[Checkpoint] = []
    for raw in contract["checkpoints"]:
        rep = raw.get("repeat")
        if rep is not None and rep not in repeats:
            raise ContractError(f"{fam}: '{raw['name']}' repeats over unknown '{rep}'")
        layers: list[int | None] = [None]
        if rep is not None:
            start, end = 0, repeats[rep]
            if "range" in raw:
                start, end = (eval_expr(e, base_lookup) for e in raw["range"])
                if not 0 <= start <= end <= repeats[rep]:
                    raise ContractError(f"{fam}: '{raw['name']}' range [{start}, {end}) outside [0, {repeats[rep]})")
            layers = list(range(start, end))
        elif "range" in raw:
            raise ContractError(f"{fam}: '{raw['name']}' has a range but no repeat")
        first_layer = layers[0] if layers else None

        for layer in layers:

            def lookup(t: str, _layer=layer, _each: int | None = None) -> int | None:
                if t == "layer":
                    return _layer
                if t.startswith("each:"):
                    return _each
                return base_lookup(t)

            def expand(tpl: str, each: int | None = None) -> str | None:
                out = []
                rest = tpl
                while "{" in rest:
                    i = rest.index("{")
                    j = rest.index("}", i)
                    out.append(rest[:i])
                    v = eval_expr(rest[i + 1 : j], lambda t: lookup(t, layer, each))
                    if v < 0:
                        return None
                    out.append(str(v))
                    rest = rest[j + 1 :]
                out.append(rest)
                return "".join(out)

            name = expand(raw["name"])
            if name is None:
                raise ContractError(f"{fam}: '{raw['name']}' expands negative")
            if layer is not None and layer == first_layer and "inputs_at_first" in raw:
                tpl_inputs = raw["inputs_at_first"]
            else:
                tpl_inputs = raw.get("inputs", [])
            inputs: list[str] = []
            for tpl in tpl_inputs:
                m = re.search(r"each:([A-Za-z_][A-Za-z0-9_]*)", tpl)
                elements = lists[m.group(1)] if m else [None]
                if m and m.group(1) not in lists:
                    raise ContractError(f"{fam}: input '{tpl}' uses unknown list '{m.group(1)}'")
                for el in elements:
                    n = expand(tpl, el)
                    if n is None:
                        raise ContractError(f"{fam}: input '{tpl}' of '{name}' expands negative")
                    if n not in inputs:
                        inputs.append(n)
            ref = dict(raw.get("reference", {}))
            if "module" in ref:
                ref["module"] = expand(ref["module"])
            shape: list[int | str] = []
            for d in raw["shape"]:
                if str(d).isdigit():
                    shape.append(int(d))
                elif d in dims:
                    shape.append(dims[d])
                else:
                    shape.append(d)
            checkpoints.append(
                Checkpoint(
                    name=name,
                    steps=raw["steps"],
                    shape=shape,
                    layout=raw["layout"],
                    producer=expand(raw["producer"]) or raw["producer"],
                    inputs=inputs,
                    reference=ref,
                    kind=raw.get("kind"),
                    layer=layer,
                    order=len(checkpoints),
                )
            )
    names = {c.name for c in checkpoints}
    for c in checkpoints:
        for i in c.inputs:
            if i.split("@")[0] not in names:
                raise ContractError(f"{fam}: '{c.name}' lists unknown input checkpoint '{i}'")
    return ResolvedContract(fam, dims, repeats, lists, symbols, checkpoints)


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
            raise ContractError(f"{ck.name}: hook on '{ck.reference['module']}' fired more than once")
        if not isinstance(tensor, torch.Tensor):
            raise ContractError(f"{ck.name}: hook captured {type(tensor).__name__}, not a tensor")
        self.captured[ck.name] = apply_transforms(_to_numpy(tensor), ck.reference.get("transform", []), ck.name)

    def __enter__(self) -> "Recorder":
        for ck in self.checkpoints:
            ref = ck.reference
            try:
                module = self.model.get_submodule(ref["module"])
            except AttributeError as e:
                raise ContractError(f"{ck.name}: reference module '{ref['module']}' does not exist") from e
            hook = ref.get("hook", "forward")
            if hook == "pre":
                if "kwarg" in ref:

                    def pre_kw(_m, _args, kwargs, _ck=ck):
                        self._grab(_ck, kwargs.get(_ck.reference["kwarg"]))

                    self._handles.append(module.register_forward_pre_hook(pre_kw, with_kwargs=True))
                else:

                    def pre(_m, args, _ck=ck):
                        self._grab(_ck, args[_ck.reference.get("index", 0)])

                    self._handles.append(module.register_forward_pre_hook(pre))
            elif hook == "forward":

                def fwd(_m, _args, output, _ck=ck):
                    idx = _ck.reference.get("index", 0)
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


def check_shapes(resolved: ResolvedContract, checkpoints: list[Checkpoint], arrays: dict[str, np.ndarray]) -> dict[str, int]:
    """Check every captured array against its contract shape; bind and cross-check symbols.

    Returns the symbol bindings. Symbols with an expression in the contract's `symbols` block are
    checked against that expression once all the symbols it uses are bound.
    """
    bound: dict[str, int] = {}
    for ck in checkpoints:
        if ck.name not in arrays:
            raise ContractError(f"{ck.name}: not captured (hook on '{ck.reference.get('module')}' never fired)")
        a = arrays[ck.name]
        if a.ndim != len(ck.shape):
            raise ContractError(f"{ck.name}: captured shape {list(a.shape)}, contract {ck.shape}")
        for axis, (want, got) in enumerate(zip(ck.shape, a.shape)):
            if isinstance(want, int):
                if want != got:
                    raise ContractError(f"{ck.name}: axis {axis} is {got}, contract says {want}")
            elif want in bound and bound[want] != got:
                raise ContractError(f"{ck.name}: symbol '{want}' is {got} here but {bound[want]} elsewhere")
            else:
                bound[want] = got

    def lookup(t: str) -> int | None:
        if t in bound:
            return bound[t]
        if t in resolved.dims:
            return resolved.dims[t]
        return resolved.repeats.get(t)

    for sym, expr in resolved.symbols.items():
        if expr in ("free", "") or sym not in bound:
            continue
        try:
            want = eval_expr(expr, lookup)
        except ContractError:
            continue  # uses a symbol no captured checkpoint bound (e.g. a partial `only` run)
        if want != bound[sym]:
            raise ContractError(f"symbol '{sym}' = {bound[sym]} but contract says {expr} = {want}")
    return bound
