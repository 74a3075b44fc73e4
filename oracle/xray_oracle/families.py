"""The family descriptors (`core/families/<family>.json`), as the Rust side hands them over.

X-Ray's Rust side reads the descriptors and, before it calls anything here, passes them all to
`register` (oracle crate, `with_python`). Python lists no family of its own: the model types and
files `modeldir` checks, the capabilities `run` checks and the module it dispatches to all come from
here. Run without the Rust side (pytest, `python -m xray_oracle`), the same files are read from the
source tree (`core/families/`, JSON only: nothing is imported or executed from there).
Pure Python (json + pathlib).
"""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

from .errors import OracleError, OracleInputError

SCHEMA = "xray.family/v1"
_FIELDS = {"schema", "family", "about", "model_types", "required_files", "run_files", "capabilities",
           "reference_extras", "oracle_module", "selftest"}
_CAPABILITIES = {"stats_only", "teacher_forcing", "reference_variants", "bench"}
_MODULE = re.compile(r"[a-z0-9_]+")
_registered: dict | None = None


def _check(name: str, d) -> dict:
    if not isinstance(d, dict) or set(d) != _FIELDS:
        got = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise OracleError(f"family descriptor {name!r}: fields {got}, expected {sorted(_FIELDS)}")
    if d["schema"] != SCHEMA or d["family"] != name:
        raise OracleError(f"family descriptor {name!r}: schema {d['schema']!r} / family {d['family']!r}")
    caps = d["capabilities"]
    if not isinstance(caps, dict) or set(caps) != _CAPABILITIES or not all(isinstance(v, bool) for v in caps.values()):
        raise OracleError(f"family descriptor {name!r}: capabilities {caps!r} are not {sorted(_CAPABILITIES)} booleans")
    if not isinstance(d["oracle_module"], str) or not _MODULE.fullmatch(d["oracle_module"]):
        raise OracleError(f"family descriptor {name!r}: oracle_module {d['oracle_module']!r} is not a module name")
    for k in ("model_types", "required_files", "run_files"):
        if not isinstance(d[k], list) or not all(isinstance(x, str) and x for x in d[k]):
            raise OracleError(f"family descriptor {name!r}: {k} is not a list of names")
    return d


def register(text: str) -> None:
    """Take the descriptors `{family: descriptor}` (JSON text) from the Rust side."""
    global _registered
    ds = json.loads(text)
    if not isinstance(ds, dict) or not ds:
        raise OracleError("family descriptors: expected a non-empty object {family: descriptor}")
    _registered = {name: _check(name, d) for name, d in ds.items()}


def _from_source_tree() -> dict:
    root = Path(__file__).resolve().parent.parent.parent / "core" / "families"
    files = sorted(root.glob("*.json")) if root.is_dir() else []
    if not files:
        raise OracleError(f"no family descriptors: none registered by the Rust side and none in {root}")
    return {f.stem: _check(f.stem, json.loads(f.read_text())) for f in files}


def all_descriptors() -> dict:
    """Every family's descriptor, by name."""
    global _registered
    if _registered is None:
        _registered = _from_source_tree()
    return _registered


def descriptor(family: str) -> dict:
    """The descriptor of `family`, or an error naming the known families."""
    ds = all_descriptors()
    if family not in ds:
        raise OracleInputError(f"unknown family '{family}' (known: {', '.join(sorted(ds))})")
    return ds[family]


def module(family: str):
    """The family's oracle module, `xray_oracle.<oracle_module>` (inside this package only)."""
    return importlib.import_module(f"{__package__}.{descriptor(family)['oracle_module']}")


def with_capability(cap: str) -> list[str]:
    """The families whose descriptor grants `cap`."""
    return sorted(n for n, d in all_descriptors().items() if d["capabilities"][cap])
