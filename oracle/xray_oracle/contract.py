"""Checkpoint contracts (core/contracts/<family>.json, doc: docs/checkpoint-contracts.md) as the
oracle reads them: dims, repeats and lists resolved against a model config, `{...}` templates
expanded, and each checkpoint's HF capture recipe (`reference`). One resolver for every family;
core/src/contract.rs resolves the same text on the Rust side.

Expressions: integers and names (dims, repeats, dotted config keys, `layer`, `last:REPEAT`,
`each:LIST`) combined with `+ - * /`; `*` and `/` bind tighter, evaluated left to right; `/` is
exact integer division. The Rust grammar stops there; this one also accepts parentheses, unary
minus and `ceil_div`, `floor_div`, `min`, `max`, which only the granite_nar `symbols` block uses
(symbols are checked here after a run).

The format extensions the granite_nar contract needs (docs/granite_nar.md, "Contract format
extensions"):
- `lists`: named integer lists read from the config and wrapped Python-style (`-1` = last); a
  placeholder `{each:NAME ...}` in `inputs` expands once per element.
- `range`: `[start_expr, end_expr]` restricts a repeated template to layers `start..end-1`;
  `inputs_at_first` applies to the first layer of the range.
- `symbols`: data-dependent dims with an expression over dims and other symbols.
- `reference.kwarg`: a pre-hook captures a keyword argument instead of positional `index`.
- transform `flatten_windows`: `[windows, per_window, C]` -> `[windows * per_window, C]`.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import ContractError

SCHEMA = "xray.contract/v1"
STEPS = ("once", "prefill", "every")
LAYOUTS = ("token_major", "head_major", "channel_major", "plain")
HOOKS = ("forward", "pre")
TRANSFORMS = ("squeeze_batch", "split_heads", "flatten_windows")


def default_contract_path(family: str = "whisper") -> Path:
    """core/contracts/<family>.json of the repository this package lives in."""
    return Path(__file__).resolve().parents[2] / "core" / "contracts" / f"{family}.json"


def load_contract_text(contract_json: str | os.PathLike | dict) -> dict:
    """The contract as parsed JSON: given parsed, as JSON text, or as a path to a JSON file.
    The schema must be `xray.contract/v1`."""
    if isinstance(contract_json, dict):
        data: Any = contract_json
    else:
        text = str(contract_json)
        if not text.lstrip().startswith("{") and os.path.isfile(text):
            text = Path(text).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ContractError(f"contract JSON does not parse: {e}") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else None
        raise ContractError(f"contract schema is {found!r}, expected {SCHEMA!r}")
    return data


def config_value(config: dict, key: str) -> Any:
    """A dotted config key (`encoder_config.hidden_dim`), or None if absent."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _config_int(config: dict, key: str) -> Optional[int]:
    v = config_value(config, key)
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_.:]*)|(\S))")

_FUNCS: dict[str, Callable[[int, int], int]] = {
    "ceil_div": lambda a, b: -(-a // b),
    "floor_div": lambda a, b: a // b,
    "min": min,
    "max": max,
}


def _tokenize(expr: str) -> list[str]:
    toks: list[str] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            break
        pos = m.end()
        tok = m.group(1) or m.group(2) or m.group(3)
        if tok:
            toks.append(tok)
    return toks


def eval_expr(expr: str, lookup: Callable[[str], Optional[int]]) -> int:
    """Evaluate a contract expression (see the module doc); `lookup` resolves names (None =
    unknown). Raises ValueError with the reason."""
    toks = _tokenize(expr)
    if not toks:
        raise ValueError(f"empty expression '{expr}'")
    pos = 0

    def peek() -> Optional[str]:
        return toks[pos] if pos < len(toks) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(toks):
            raise ValueError(f"dangling operator or unexpected end of '{expr}'")
        pos += 1
        return toks[pos - 1]

    def atom() -> int:
        t = take()
        if t == "(":
            v = additive()
            if take() != ")":
                raise ValueError(f"missing ')' in '{expr}'")
            return v
        if t == "-":
            return -atom()
        if t.isdigit():
            return int(t)
        if t in _FUNCS and peek() == "(":
            take()
            a = additive()
            if take() != ",":
                raise ValueError(f"'{t}' takes two arguments in '{expr}'")
            b = additive()
            if take() != ")":
                raise ValueError(f"missing ')' in '{expr}'")
            if t in ("ceil_div", "floor_div") and b == 0:
                raise ValueError(f"division by zero in '{expr}'")
            return _FUNCS[t](a, b)
        v = lookup(t)
        if v is None:
            raise ValueError(f"'{t}' is not a known dim, repeat, symbol or config key (in '{expr}')")
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
                    raise ValueError(f"'{expr}': {acc} is not divisible by {rhs}")
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
        raise ValueError(f"unexpected '{toks[pos]}' in '{expr}'")
    return value


@dataclass
class Reference:
    """How the HF reference captures a checkpoint."""

    module: str  # dotted module path, templates expanded
    hook: str  # "forward" (module output) or "pre" (module input)
    index: int  # tuple index into the output / positional inputs; 0 on a bare tensor = the tensor
    transform: list[str]
    kwarg: Optional[str] = None  # pre-hook: capture this keyword argument instead of `index`


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
    producer: str = ""
    inputs: list[str] = field(default_factory=list)  # checkpoint names, `@prefill`/`@previous` kept


@dataclass
class Contract:
    """A contract resolved against one config."""

    family: str
    hf_class: Optional[str]
    dims: dict[str, int]
    repeats: dict[str, int]
    lists: dict[str, list[int]] = field(default_factory=dict)
    symbols: dict[str, str] = field(default_factory=dict)
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def by_name(self) -> dict[str, Checkpoint]:
        return {c.name: c for c in self.checkpoints}

    def get(self, name: str) -> Checkpoint:
        for c in self.checkpoints:
            if c.name == name:
                return c
        raise KeyError(name)


def _reference(raw: dict, tpl: str, err: Callable[[str], ContractError]) -> tuple[dict, list[str], int]:
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
    if "kwarg" in ref and (ref["hook"] != "pre" or not isinstance(ref["kwarg"], str)):
        raise err(f"'{tpl}': reference kwarg needs hook 'pre' and a keyword name")
    return ref, transforms, index


def resolve(data: dict, config: dict) -> Contract:
    """Resolve a parsed contract against a model config (config.json as a dict). Fails closed on
    anything unknown: a missing config key, an inexact division, a bad step/layout/hook/transform,
    a negative expansion, a duplicate name, an input naming no checkpoint."""
    data = load_contract_text(data)
    fam = data.get("family", "?")

    def err(msg: str) -> ContractError:
        return ContractError(f"contract '{fam}': {msg}")

    def ev(what: str, expr: str, lookup: Callable[[str], Optional[int]]) -> int:
        try:
            return eval_expr(expr, lookup)
        except ValueError as x:
            raise err(f"{what}: {x}") from None

    dims: dict[str, int] = {}
    for k, e in (data.get("dims") or {}).items():
        v = ev(f"dim '{k}'", e, lambda t: _config_int(config, t))
        if v <= 0:
            raise err(f"dim '{k}' = {e} = {v} must be positive")
        dims[k] = v
    repeats: dict[str, int] = {}
    for k, e in (data.get("repeats") or {}).items():
        v = ev(f"repeat '{k}'", e, lambda t: _config_int(config, t) if _config_int(config, t) is not None else dims.get(t))
        if v <= 0:
            raise err(f"repeat '{k}' = {v} must be positive")
        repeats[k] = v

    def base_lookup(t: str) -> Optional[int]:
        if t.startswith("last:"):
            r = repeats.get(t[5:].strip())
            return None if r is None else r - 1
        for table in (repeats, dims):
            if t in table:
                return table[t]
        return _config_int(config, t)

    lists: dict[str, list[int]] = {}
    for k, spec in (data.get("lists") or {}).items():
        raw_list = config_value(config, spec.get("config", ""))
        if not isinstance(raw_list, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw_list):
            raise err(f"list '{k}': config key '{spec.get('config')}' is not an integer list")
        wrap = ev(f"list '{k}' wrap", spec.get("wrap", ""), base_lookup)
        wrapped = []
        for x in raw_list:
            if not -wrap <= x < wrap:
                raise err(f"list '{k}': element {x} outside [-{wrap}, {wrap})")
            wrapped.append(x % wrap)
        lists[k] = wrapped

    # Consecutive templates repeating over the same key (and range) form a group, expanded
    # layer-major (layer 0 of each, then layer 1, ...) so the order follows depth, as in
    # core/src/contract.rs and the harness.
    raws = list(data.get("checkpoints") or [])
    group: list[int] = []
    for ti, raw in enumerate(raws):
        same = ti > 0 and raw.get("repeat") is not None and (
            raws[ti - 1].get("repeat") == raw.get("repeat") and raws[ti - 1].get("range") == raw.get("range")
        )
        group.append(group[-1] if same else (group[-1] + 1 if group else 0))
    keys: list[tuple[int, int, int]] = []
    out: list[Checkpoint] = []
    for ti, raw in enumerate(raws):
        tpl = raw.get("name")
        if not isinstance(tpl, str):
            raise err(f"a checkpoint has no name: {raw!r}")
        steps = raw.get("steps")
        if steps not in STEPS:
            raise err(f"'{tpl}': steps {steps!r} is not one of {STEPS}")
        layout = raw.get("layout")
        if layout not in LAYOUTS:
            raise err(f"'{tpl}': layout {layout!r} is not one of {LAYOUTS}")
        ref, transforms, index = _reference(raw, tpl, err)

        rep = raw.get("repeat")
        layers: list[Optional[int]] = [None]
        if rep is not None:
            if rep not in repeats:
                raise err(f"'{tpl}' repeats over unknown '{rep}'")
            start, end = 0, repeats[rep]
            if "range" in raw:
                start, end = (ev(f"range of '{tpl}'", e, base_lookup) for e in raw["range"])
                if not 0 <= start <= end <= repeats[rep]:
                    raise err(f"'{tpl}' range [{start}, {end}) outside [0, {repeats[rep]})")
            layers = list(range(start, end))
        elif "range" in raw:
            raise err(f"'{tpl}' has a range but no repeat")
        first_layer = layers[0] if layers else None

        for layer in layers:

            def expand(s: str, each: Optional[int] = None, _layer: Optional[int] = layer) -> Optional[str]:
                """`s` with every `{expr}` evaluated; None when one is negative."""

                def lookup(t: str) -> Optional[int]:
                    if t == "layer":
                        return _layer
                    if t.startswith("each:"):
                        return each
                    return base_lookup(t)

                res, rest = "", s
                while "{" in rest:
                    o = rest.index("{")
                    c = rest.find("}", o)
                    if c < 0:
                        raise err(f"unclosed '{{' in '{s}'")
                    v = ev(f"'{s}'", rest[o + 1 : c], lookup)
                    if v < 0:
                        return None
                    res += rest[:o] + str(v)
                    rest = rest[c + 1 :]
                return res + rest

            name = expand(tpl)
            if name is None:
                raise err(f"'{tpl}' expands to a negative index")
            module = expand(ref["module"])
            if module is None:
                raise err(f"reference module of '{name}' expands to a negative index")
            producer = expand(raw.get("producer", ""))
            if producer is None:
                raise err(f"producer of '{name}' expands to a negative index")
            if layer is not None and layer == first_layer and "inputs_at_first" in raw:
                tpl_inputs = raw["inputs_at_first"]
            else:
                tpl_inputs = raw.get("inputs") or []
            inputs: list[str] = []
            for itpl in tpl_inputs:
                m = re.search(r"each:([A-Za-z_][A-Za-z0-9_]*)", itpl)
                if m and m.group(1) not in lists:
                    raise err(f"input '{itpl}' of '{name}' uses unknown list '{m.group(1)}'")
                for el in lists[m.group(1)] if m else [None]:
                    n = expand(itpl, el)
                    if n is None:
                        raise err(f"input '{itpl}' of '{name}' expands to a negative layer; declare inputs_at_first")
                    if n not in inputs:
                        inputs.append(n)
            shape: list = []
            for d in raw.get("shape") or []:
                d = str(d)
                if d.isdigit():
                    shape.append(int(d))
                elif d in dims:
                    shape.append(dims[d])
                else:
                    shape.append(d)
            keys.append((group[ti], layer or 0, ti))
            out.append(
                Checkpoint(
                    name=name,
                    template=tpl,
                    steps=steps,
                    shape=shape,
                    layout=layout,
                    kind=raw.get("kind"),
                    reference=Reference(module, ref["hook"], index, transforms, ref.get("kwarg")),
                    layer=layer,
                    order=len(out),
                    producer=producer,
                    inputs=inputs,
                )
            )
    out = [c for _, c in sorted(zip(keys, out, strict=True), key=lambda kc: kc[0])]
    for i, c in enumerate(out):
        c.order = i
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise err(f"checkpoint names expand to duplicates: {sorted(dup)}")
    known = set(names)
    for c in out:
        for i in c.inputs:
            if i.split("@")[0] not in known:
                raise err(f"'{c.name}' lists unknown input checkpoint '{i}'")
    return Contract(fam, data.get("hf_class"), dims, repeats, lists, dict(data.get("symbols") or {}), out)
