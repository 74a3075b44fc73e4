"""Checkpoint contracts as the oracle receives them: resolved by xray-core (core/src/contract/,
doc: docs/checkpoint-contracts.md) against the model's config and handed over as JSON
(`xray.contract.resolved/v1`). Python evaluates nothing: names, reference modules, shapes and
inputs arrive expanded, dims and repeats as numbers, and the vocabularies a field is checked
against (steps, step references, layouts, hooks, sides, transforms) arrive with them (`vocabulary`). The shape relations between run-time
symbols (the granite_nar `symbols` block) are checked on the Rust side when the run returns.

The Rust side passes the resolved JSON to `xray_oracle.run`; for `python -m xray_oracle`, make it
with `xray contract --model DIR --out FILE` (Python-free).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import transforms as _transforms
from .errors import ContractError

SCHEMA = "xray.contract.resolved/v1"


@dataclass(frozen=True)
class Vocabulary:
    """The names the resolved contract speaks in, as xray-core ships them (`vocabulary`:
    xray-core's `contract::vocabulary`, the serde names of its enums `Steps`, `StepRef`, `Layout`,
    `Hook`, `ops::Side` and `Transform`, a keyed transform by its key). Read from the JSON, never
    typed here."""

    steps: tuple[str, ...]
    step_refs: tuple[str, ...]
    layouts: tuple[str, ...]
    hooks: tuple[str, ...]
    sides: tuple[str, ...]
    transforms: tuple[str, ...]


def _vocabulary(data: dict) -> Vocabulary:
    """The shipped vocabulary; each a non-empty list of distinct names. A transform the oracle
    does not implement (`xray_oracle.transforms`) is refused here, naming it, before anything runs."""
    where = "resolved contract vocabulary"
    v = _field(data, "vocabulary", dict, "resolved contract")
    lists = {}
    for key in Vocabulary.__dataclass_fields__:
        names = _field(v, key, list, where)
        if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise ContractError(f"{where}: '{key}' {names!r} is not a non-empty list of distinct names")
        lists[key] = tuple(names)
    missing = [t for t in lists["transforms"] if t not in _transforms.NAMES + _transforms.KEYED]
    if missing:
        raise ContractError(f"{where}: xray-core declares transform(s) {missing} that this oracle does not implement "
                            "(xray_oracle/transforms.py)")
    return Vocabulary(**lists)


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
    """One resolved checkpoint."""

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
class PointRule:
    """How the reference's op-level points of matching modules map to the engine's layout
    (xray-core's `contract::PointRule`): `module` is a dotted pattern, `*` one segment, `**` one
    or more segments."""

    module: str
    sides: list[str]
    layout: str
    transform: list
    kwarg: Optional[str] = None  # `in` is this keyword argument, not the first positional input

    def matches(self, point: str) -> bool:
        module, sep, side = point.rpartition(":")
        return bool(sep) and side in self.sides and _glob(self.module.split("."), module.split("."))


@dataclass
class Operand:
    """One operand of an attention core (xray-core's `contract::Operand`): a point relative to the
    attention module, or chunk `index` of `count` along its last axis."""

    point: str
    chunk: Optional[tuple[int, int]] = None

    def take(self, t):
        """This operand of `t`, the module's tensor at `point` (a torch tensor or an array)."""
        if self.chunk is None:
            return t
        i, n = self.chunk
        d = t.shape[-1]
        if d % n:
            raise ContractError(f"attention operand {self.point}: its last axis {d} is no {n} equal chunks")
        return t[..., i * (d // n):(i + 1) * (d // n)]


@dataclass
class AttentionRule:
    """Which points feed and leave the core of the attention modules `module` matches (xray-core's
    `contract::AttentionRule`): queries, keys and values, each a sub-module's point or a chunk
    of one; `output`, the point the core's output is."""

    module: str
    queries: Operand
    keys: Operand
    values: Operand
    output: str

    def matches(self, module: str) -> bool:
        return _glob(self.module.split("."), module.split("."))


def _glob(p: list[str], m: list[str]) -> bool:
    if not p:
        return not m
    if p[0] == "**":
        return any(_glob(p[1:], m[k:]) for k in range(1, len(m) + 1))
    return bool(m) and (p[0] == "*" or p[0] == m[0]) and _glob(p[1:], m[1:])


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
    sha256: str = ""
    points: list[PointRule] = field(default_factory=list)
    attention: list[AttentionRule] = field(default_factory=list)
    vocabulary: Optional[Vocabulary] = None  # always set by `load_resolved`

    def attention_rule(self, module: str) -> Optional[AttentionRule]:
        """The first attention rule matching module path `module`, or None (not a declared core)."""
        return next((r for r in self.attention if r.matches(module)), None)

    def point_rule(self, point: str) -> PointRule:
        """The first rule declaring op-level point `point`; a ContractError naming it when none
        does (a point's layout is declared, never guessed)."""
        for r in self.points:
            if r.matches(point):
                return r
        raise ContractError(f"op-level point {point!r}: no rule of the contract's 'points' declares its layout")

    def point_kwarg(self, point: str) -> Optional[str]:
        """The keyword argument the first rule declaring `point` takes its `in` from, if any (no
        rule: None; `points()` then refuses the point by name)."""
        return next((r.kwarg for r in self.points if r.matches(point)), None)

    def declares(self, point: str) -> bool:
        """Whether a rule declares op-level point `point`."""
        return any(r.matches(point) for r in self.points)

    def by_name(self) -> dict[str, Checkpoint]:
        return {c.name: c for c in self.checkpoints}

    def get(self, name: str) -> Checkpoint:
        for c in self.checkpoints:
            if c.name == name:
                return c
        raise KeyError(name)


def _read(contract_json: str | os.PathLike | dict) -> dict:
    if isinstance(contract_json, dict):
        return contract_json
    if isinstance(contract_json, os.PathLike):
        p = Path(contract_json)
        if not p.is_file():
            raise ContractError(f"contract file {p} does not exist (make it with `xray contract --model DIR --out {p}`)")
        contract_json = p.read_text(encoding="utf-8")
    try:
        data = json.loads(contract_json)
    except json.JSONDecodeError as e:
        raise ContractError(f"the resolved contract is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ContractError("the resolved contract is not a JSON object")
    return data


def _field(obj: dict, key: str, kind: type | tuple, where: str) -> Any:
    if key not in obj:
        raise ContractError(f"{where}: no '{key}'")
    v = obj[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise ContractError(f"{where}: '{key}' is {type(v).__name__}, not {kind}")
    return v


def _named(raw: Any, key: str, where: str) -> str:
    """The string `raw[key]` that names an entry of a list, `raw` being an object (a ContractError
    naming the entry by `where`, its place in the list, otherwise)."""
    if not isinstance(raw, dict):
        raise ContractError(f"{where} is not an object")
    return _field(raw, key, str, where)


def _one_of(obj: dict, key: str, choices: tuple, what: str, where: str) -> str:
    """`obj[key]`, a string among `choices` (a ContractError naming `where` otherwise)."""
    v = _field(obj, key, str, where)
    if v not in choices:
        raise ContractError(f"{where}: {what} {v!r} is not one of {choices}")
    return v


def _transform_list(raw: dict, voc: Vocabulary, where: str) -> list:
    """`raw["transform"]`: each in the shipped vocabulary (a keyed one by its key) and well formed."""
    transforms = raw.get("transform") or []
    if not isinstance(transforms, list):
        raise ContractError(f"{where}: transform {transforms!r} is not a list")
    for t in transforms:
        name = t if isinstance(t, str) else next(iter(t)) if isinstance(t, dict) and len(t) == 1 else None
        if name not in voc.transforms:
            raise ContractError(f"{where}: unknown reference transform {t!r} (known: {voc.transforms})")
        _transforms.check(t, where)
    return list(transforms)


def _reference(raw: dict, voc: Vocabulary, where: str) -> Reference:
    ref = _field(raw, "reference", dict, where)
    hook = _one_of(ref, "hook", voc.hooks, "reference hook", where)
    transforms = _transform_list(ref, voc, where)
    index = ref.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ContractError(f"{where}: reference index {index!r} must be a non-negative integer")
    return Reference(_field(ref, "module", str, where), hook, index, transforms, ref.get("kwarg"))


def _checkpoint(raw: Any, i: int, voc: Vocabulary) -> Checkpoint:
    name = _named(raw, "name", f"resolved contract checkpoint {i}")
    where = f"resolved contract checkpoint '{name}'"
    steps = _one_of(raw, "steps", voc.steps, "steps", where)
    layout = _one_of(raw, "layout", voc.layouts, "layout", where)
    shape = _field(raw, "shape", list, where)
    if not all(isinstance(d, (int, str)) and not isinstance(d, bool) for d in shape):
        raise ContractError(f"{where}: shape {shape!r} holds something that is not a number or a symbol")
    inputs = []
    for inp in _field(raw, "inputs", list, where):
        if not (isinstance(inp, list) and len(inp) == 2 and inp[1] in voc.step_refs):
            raise ContractError(f"{where}: input {inp!r} is not [name, step reference]")
        inputs.append(inp[0] if inp[1] == "same" else f"{inp[0]}@{inp[1]}")
    layer = raw.get("layer")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)):
        raise ContractError(f"{where}: layer {layer!r} is not an integer")
    return Checkpoint(
        name=name,
        template=_field(raw, "template", str, where),
        steps=steps,
        shape=list(shape),
        layout=layout,
        kind=raw.get("kind"),
        reference=_reference(raw, voc, where),
        layer=layer,
        order=_field(raw, "order", int, where),
        producer=_field(raw, "producer", str, where),
        inputs=inputs,
    )


def load_resolved(contract_json: str | os.PathLike | dict, family: Optional[str] = None) -> Contract:
    """Read a resolved contract (JSON text, a path to it, or the parsed dict). Fails closed on a
    missing or mistyped field, an unknown schema, or (with `family`) another family's contract."""
    data = _read(contract_json)
    schema = data.get("schema")
    if schema != SCHEMA:
        hint = " (a contract file as written, not resolved: make it with `xray contract --model DIR`)" if schema == "xray.contract/v1" else ""
        raise ContractError(f"resolved contract schema is {schema!r}, expected {SCHEMA!r}{hint}")
    fam = _field(data, "family", str, "resolved contract")
    if family is not None and fam != family:
        raise ContractError(f"the resolved contract is for family {fam!r}, not {family!r}")

    def ints(key: str) -> dict[str, int]:
        d = data.get(key) or {}
        if not isinstance(d, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in d.values()):
            raise ContractError(f"resolved contract: '{key}' is not a map of integers")
        return dict(d)

    voc = _vocabulary(data)
    cks = [_checkpoint(raw, i, voc) for i, raw in enumerate(_field(data, "checkpoints", list, "resolved contract"))]
    names = [c.name for c in cks]
    if len(set(names)) != len(names):
        raise ContractError("resolved contract: duplicate checkpoint names")
    if [c.order for c in cks] != list(range(len(cks))):
        raise ContractError("resolved contract: checkpoints are not in graph order")
    return Contract(
        family=fam,
        hf_class=data.get("hf_class"),
        dims=ints("dims"),
        repeats=ints("repeats"),
        lists={k: list(v) for k, v in (data.get("lists") or {}).items()},
        symbols=dict(data.get("symbols") or {}),
        checkpoints=cks,
        sha256=str(data.get("contract_sha256", "")),
        points=[_point_rule(r, i, voc) for i, r in enumerate(data.get("points") or [])],
        attention=[_attention_rule(r, i) for i, r in enumerate(data.get("attention") or [])],
        vocabulary=voc,
    )


def _attention_rule(raw: Any, i: int) -> AttentionRule:
    module = _named(raw, "module", f"resolved contract attention rule {i}")
    where = f"resolved contract attention rule {module!r}"

    def operand(role: str) -> Operand:
        o = _field(raw, role, dict, where)
        point = _named(o, "point", f"{where} {role}")
        chunk = o.get("chunk")
        if chunk is not None:
            ok = (isinstance(chunk, list) and len(chunk) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) for x in chunk)
                  and chunk[1] >= 2 and 0 <= chunk[0] < chunk[1])
            if not ok:
                raise ContractError(f"{where}: {role} chunk {chunk!r} is not [index, count] of two or more chunks")
            chunk = (chunk[0], chunk[1])
        return Operand(point, chunk)

    return AttentionRule(module, operand("queries"), operand("keys"), operand("values"), _named(raw, "output", where))


def _point_rule(raw: Any, i: int, voc: Vocabulary) -> PointRule:
    module = _named(raw, "module", f"resolved contract points rule {i}")
    where = f"resolved contract points rule {module!r}"
    sides = _field(raw, "sides", list, where)
    if not sides or any(s not in voc.sides for s in sides):
        raise ContractError(f"{where}: sides {sides!r} are not a non-empty list of {voc.sides}")
    layout = _one_of(raw, "layout", voc.layouts, "layout", where)
    kwarg = raw.get("kwarg")
    if kwarg is not None and (not isinstance(kwarg, str) or not kwarg or sides != ["in"]):
        raise ContractError(f"{where}: kwarg {kwarg!r} needs a non-empty name and the side 'in' alone")
    return PointRule(module, list(sides), layout, _transform_list(raw, voc, where), kwarg)
