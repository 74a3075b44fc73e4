"""Checkpoint contracts (runtime/contracts/<family>.json, doc: docs/checkpoint-contracts.md) as the
oracle reads them: dims and repeats resolved against a model config, `{...}` templates expanded,
and each checkpoint's HF capture recipe (`reference`).

The expression language mirrors `runtime/src/contract.rs::eval_expr` (the Rust side resolves the
same text): `a`, `a * b`, `a / b`, `a + b - c`, `*` and `/` bind tighter, evaluated left to right;
terms are integers, dims, repeats, `layer`, `last:REPEAT` or config keys (dotted paths walk nested
objects); division must be exact.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import ContractError

SCHEMA = "xray.contract/v1"
STEPS = ("once", "prefill", "every")
LAYOUTS = ("token_major", "head_major", "channel_major", "plain")
HOOKS = ("forward", "pre")
TRANSFORMS = ("squeeze_batch", "split_heads")


def default_contract_path(family: str = "whisper") -> Path:
    """runtime/contracts/<family>.json of the repository this package lives in."""
    return Path(__file__).resolve().parents[2] / "runtime" / "contracts" / f"{family}.json"


def load_contract_text(contract_json: str) -> dict:
    """Parse contract text; a string that is not JSON but names a file is read from that file."""
    text = contract_json
    if not contract_json.lstrip().startswith("{") and os.path.isfile(contract_json):
        text = Path(contract_json).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(f"contract JSON does not parse: {e}") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ContractError(f"contract schema is {data.get('schema') if isinstance(data, dict) else None!r}, expected {SCHEMA!r}")
    return data


def _config_int(config: dict, key: str) -> Optional[int]:
    v: Any = config
    for part in key.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


def _tokenize(s: str) -> list[str]:
    out, cur = [], ""
    for c in s:
        if c in "+-*/":
            if cur.strip():
                out.append(cur.strip())
            cur = ""
            out.append(c)
        else:
            cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


def eval_expr(expr: str, lookup: Callable[[str], Optional[int]]) -> int:
    """Evaluate a contract expression (see module doc). Raises ValueError with the reason."""
    toks = _tokenize(expr)
    if not toks:
        raise ValueError(f"empty expression '{expr}'")

    def term(t: str) -> int:
        try:
            return int(t)
        except ValueError:
            pass
        v = lookup(t)
        if v is None:
            raise ValueError(f"'{t}' is not a known dim, repeat or config key (in '{expr}')")
        return v

    total, sign, i = 0, 1, 0
    while i < len(toks):
        acc = term(toks[i])
        i += 1
        while i + 1 < len(toks) and toks[i] in ("*", "/"):
            rhs = term(toks[i + 1])
            if toks[i] == "*":
                acc *= rhs
            else:
                if rhs == 0 or acc % rhs != 0:
                    raise ValueError(f"'{expr}': {acc} is not divisible by {rhs}")
                acc //= rhs
            i += 2
        total += sign * acc
        if i < len(toks):
            if toks[i] == "+":
                sign = 1
            elif toks[i] == "-":
                sign = -1
            else:
                raise ValueError(f"unexpected '{toks[i]}' in '{expr}'")
            i += 1
            if i >= len(toks):
                raise ValueError(f"dangling operator in '{expr}'")
    return total


@dataclass
class Reference:
    """How the HF reference captures a checkpoint."""

    module: str  # dotted module path, templates expanded
    hook: str  # "forward" (module output) or "pre" (module input)
    index: int  # tuple index into the output / positional inputs; 0 on a bare tensor = the tensor
    transform: list[str]


@dataclass
class Checkpoint:
    """One expanded checkpoint."""

    name: str
    template: str
    steps: str
    shape: list  # ints (resolved dims) and str (run-time symbols such as "tokens")
    layout: str
    kind: Optional[str]
    reference: Reference
    layer: Optional[int]
    order: int


@dataclass
class Contract:
    family: str
    hf_class: Optional[str]
    dims: dict[str, int]
    repeats: dict[str, int]
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def by_name(self) -> dict[str, Checkpoint]:
        return {c.name: c for c in self.checkpoints}


def resolve(data: dict, config: dict) -> Contract:
    """Resolve a parsed contract against a model config (config.json as a dict)."""
    fam = data.get("family", "?")

    def err(msg: str) -> ContractError:
        return ContractError(f"contract '{fam}': {msg}")

    dims: dict[str, int] = {}
    for k, e in (data.get("dims") or {}).items():
        try:
            v = eval_expr(e, lambda t: _config_int(config, t))
        except ValueError as x:
            raise err(f"dim '{k}': {x}") from None
        if v <= 0:
            raise err(f"dim '{k}' = {e} = {v} must be positive")
        dims[k] = v
    repeats: dict[str, int] = {}
    for k, e in (data.get("repeats") or {}).items():
        try:
            v = eval_expr(e, lambda t: _config_int(config, t) if _config_int(config, t) is not None else dims.get(t))
        except ValueError as x:
            raise err(f"repeat '{k}': {x}") from None
        if v <= 0:
            raise err(f"repeat '{k}' = {v} must be positive")
        repeats[k] = v

    out: list[Checkpoint] = []
    for raw in data.get("checkpoints") or []:
        tpl = raw.get("name")
        if not isinstance(tpl, str):
            raise err(f"a checkpoint has no name: {raw!r}")
        steps = raw.get("steps")
        if steps not in STEPS:
            raise err(f"'{tpl}': steps {steps!r} is not one of {STEPS}")
        layout = raw.get("layout")
        if layout not in LAYOUTS:
            raise err(f"'{tpl}': layout {layout!r} is not one of {LAYOUTS}")
        ref = raw.get("reference")
        if not isinstance(ref, dict) or "module" not in ref or "hook" not in ref:
            raise err(f"'{tpl}': no usable 'reference' (need module and hook)")
        if ref["hook"] not in HOOKS:
            raise err(f"'{tpl}': reference hook {ref['hook']!r} is not one of {HOOKS}")
        transforms = list(ref.get("transform") or [])
        for t in transforms:
            if t not in TRANSFORMS:
                raise err(f"'{tpl}': unknown reference transform {t!r} (known: {TRANSFORMS})")
        index = ref.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise err(f"'{tpl}': reference index {index!r} must be a non-negative integer")

        if raw.get("repeat") is not None:
            rep = raw["repeat"]
            if rep not in repeats:
                raise err(f"'{tpl}' repeats over unknown '{rep}'")
            layers: list[Optional[int]] = list(range(repeats[rep]))
        else:
            layers = [None]
        for layer in layers:

            def lookup(t: str, layer=layer) -> Optional[int]:
                if t == "layer":
                    return layer
                if t.startswith("last:"):
                    n = repeats.get(t[5:].strip())
                    return None if n is None else n - 1
                if t in repeats:
                    return repeats[t]
                if t in dims:
                    return dims[t]
                return _config_int(config, t)

            def expand(s: str) -> str:
                res, rest = "", s
                while "{" in rest:
                    o = rest.index("{")
                    c = rest.find("}", o)
                    if c < 0:
                        raise err(f"unclosed '{{' in '{s}'")
                    try:
                        v = eval_expr(rest[o + 1 : c], lookup)
                    except ValueError as x:
                        raise err(f"'{s}': {x}") from None
                    if v < 0:
                        raise err(f"'{s}' expands to a negative index")
                    res += rest[:o] + str(v)
                    rest = rest[c + 1 :]
                return res + rest

            shape: list = []
            for d in raw.get("shape") or []:
                d = str(d)
                if d.isdigit():
                    shape.append(int(d))
                elif d in dims:
                    shape.append(dims[d])
                else:
                    shape.append(d)
            out.append(
                Checkpoint(
                    name=expand(tpl),
                    template=tpl,
                    steps=steps,
                    shape=shape,
                    layout=layout,
                    kind=raw.get("kind"),
                    reference=Reference(expand(ref["module"]), ref["hook"], index, transforms),
                    layer=layer,
                    order=len(out),
                )
            )
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise err(f"checkpoint names expand to duplicates: {sorted(dup)}")
    return Contract(fam, data.get("hf_class"), dims, repeats, out)
