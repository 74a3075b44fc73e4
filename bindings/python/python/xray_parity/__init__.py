"""X-Ray from Python: load dumps and evidence, compare two dumps, gate evidence against a baseline,
render reports, and write a dump from numpy arrays, all through X-Ray's Rust comparison library
(`xray-compare`) and dump writer (`xray-core`), the code the `xray` CLI runs.

    import xray_parity as xp
    ev = xp.compare("ref_dump", "my_engine_dump", policy="policy.json")
    print(ev.headline())                       # xray: verdict pass (292/292 checkpoints pass)
    ev.write("out/evidence.json")
    g = xp.gate(ev, "baseline.evidence.json")  # or two corpus evidence directories
    assert g.passed, g.text()

The `xray` command (installed with this package) is the full CLI: `xray check` runs the HF
reference in-process when the `[oracle]` extra is installed (torch, transformers), or reads it
from `--reference-cache DIR` without them. The pytest plugin (`xray_parity.pytest_plugin`,
registered as a `pytest11` entry point) offers `xray_check` and `xray_gate` fixtures.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from . import _native
from ._native import XrayError

__all__ = [
    "XrayError", "Dump", "Evidence", "GateResult", "DumpWriter", "load_dump", "load_evidence",
    "compare", "gate", "render_html", "render_markdown", "xray_executable", "run_xray", "__version__",
]

__version__ = _native.version()

PathLike = Union[str, os.PathLike]

LAYOUTS = ("token_major", "head_major", "channel_major", "plain")


class Dump:
    """A loaded `xray.dump` directory, checked end to end (manifest, file hashes, shapes)."""

    def __init__(self, native):
        self._d = native
        self.manifest: dict = json.loads(native.manifest_json())

    @property
    def dir(self) -> Path:
        return Path(self._d.dir)

    @property
    def family(self) -> str:
        return self.manifest["family"]

    @property
    def stats_only(self) -> bool:
        return bool(self.manifest.get("stats_only"))

    @property
    def unlisted(self) -> list[str]:
        """Files in the directory that the manifest does not list (never read)."""
        return list(self._d.unlisted)

    def keys(self) -> list[tuple[str, int]]:
        """`(name, step)` of every checkpoint, in manifest order."""
        return list(self._d.keys())

    def array(self, name: str, step: int) -> np.ndarray:
        """The checkpoint's tensor (float32, a copy); KeyError when the dump does not hold it."""
        return self._d.array(name, step)

    def __contains__(self, key) -> bool:
        return tuple(key) in set(self.keys())

    def __repr__(self) -> str:
        return f"Dump({str(self.dir)!r}, family={self.family!r}, {len(self.keys())} checkpoints)"


class Evidence:
    """An `xray.evidence/v1` document (what `xray check` and `xray compare` write)."""

    def __init__(self, native, console: Sequence[str] = (), path: Optional[Path] = None):
        self._e = native
        #: The lines `xray compare` prints before its summary (notes), in order.
        self.console: list[str] = list(console)
        #: Where it was read from or last written to.
        self.path: Optional[Path] = path

    @property
    def verdict(self) -> str:
        return self._e.verdict

    @property
    def passed(self) -> bool:
        return self._e.passed

    def to_json(self) -> str:
        return self._e.to_json()

    def to_dict(self) -> dict:
        return json.loads(self._e.to_json())

    @property
    def first_divergence(self) -> Optional[dict]:
        return self.to_dict().get("first_divergence")

    def summary(self) -> str:
        """What the CLI prints on stderr: `xray: verdict ...` and the lines after it."""
        return self._e.summary()

    def headline(self) -> str:
        """One line: the verdict and the first divergence (checkpoint, producer, signature)."""
        return self._e.headline()

    def html(self) -> str:
        return self._e.html()

    def markdown(self) -> str:
        return self._e.markdown()

    def write(self, path: PathLike) -> Path:
        """Writes the evidence JSON atomically; returns the path."""
        p = Path(path)
        self._e.write(p)
        self.path = p
        return p

    def __repr__(self) -> str:
        return f"Evidence(verdict={self.verdict!r})"


class GateResult:
    """What `xray gate` decides: `passed`, the findings, its text and JUnit XML."""

    def __init__(self, native):
        self._g = native

    @property
    def passed(self) -> bool:
        return self._g.passed

    @property
    def checked(self) -> list[str]:
        return list(self._g.checked)

    @property
    def findings(self) -> list[tuple[bool, str]]:
        """`(failing, message)` per finding."""
        return list(self._g.findings)

    def text(self) -> str:
        return self._g.text()

    def junit_xml(self) -> str:
        return self._g.junit_xml()

    def __bool__(self) -> bool:
        return self.passed


def load_dump(path: PathLike) -> Dump:
    """Loads and checks a dump directory (`XrayError` naming the file on any inconsistency)."""
    return Dump(_native.load_dump(os.fspath(path)))


def load_evidence(path: PathLike) -> Evidence:
    """Loads and checks an evidence file (its verdict must follow from its checkpoints)."""
    return Evidence(_native.load_evidence(os.fspath(path)), path=Path(path))


def compare(ref_dir: PathLike, got_dir: PathLike, *, policy: Optional[PathLike] = None,
            model: Optional[PathLike] = None, require_all: bool = False,
            isolated: Iterable[PathLike] = (), variants: Iterable[PathLike] = ()) -> Evidence:
    """`xray compare REF GOT`: the evidence of the dump under test against the reference.

    `policy` is a tolerance policy file (`--policy`); `model` a model directory whose config.json
    resolves the contract and whose generation_config.json gives the suppress lists (default:
    the reference dump's `extra.config`); the rest as the CLI's flags. Op-level localization runs
    on the reference's points in firing order; runtime-graph suspects and reference replay need
    the CLI (`xray compare --model DIR`).
    """
    config_json = config_source = generation = None
    if model is not None:
        m = Path(model)
        cfg = m / "config.json"
        try:
            config_json = cfg.read_text(encoding="utf-8")
        except OSError as e:
            raise XrayError(f"{cfg}: {e.strerror or e} (a model directory holds config.json)") from None
        config_source = str(cfg)
        if (m / "generation_config.json").is_file():
            generation = os.fspath(m / "generation_config.json")
    native, console = _native.compare(
        os.fspath(ref_dir), os.fspath(got_dir),
        policy=None if policy is None else os.fspath(policy), require_all=require_all,
        isolated=[os.fspath(p) for p in isolated], variants=[os.fspath(p) for p in variants],
        config_json=config_json, config_source=config_source, generation_config=generation,
    )
    return Evidence(native, console)


def gate(new: Union[Evidence, PathLike], baseline: Union[Evidence, PathLike], *,
         factor: Optional[float] = None, rel_l2_floor: Optional[float] = None,
         max_abs_floor: Optional[float] = None, allow_different_input: bool = False) -> GateResult:
    """`xray gate --evidence NEW --baseline OLD`: each an `Evidence` or an evidence file, or both
    corpus evidence directories (gated clip by clip). Different runs (family, contract, weights,
    audio) are an `XrayError`, as the CLI's exit 2."""
    def arg(x):
        return x._e if isinstance(x, Evidence) else os.fspath(x)
    return GateResult(_native.gate_evidence(
        arg(new), arg(baseline), factor=factor, rel_l2_floor=rel_l2_floor,
        max_abs_floor=max_abs_floor, allow_different_input=allow_different_input,
    ))


def render_html(evidence: Union[Evidence, PathLike]) -> str:
    """The self-contained HTML report of an evidence object or file (`xray report`)."""
    e = evidence if isinstance(evidence, Evidence) else load_evidence(evidence)
    return e.html()


def render_markdown(evidence: Union[Evidence, PathLike]) -> str:
    """The Markdown report of an evidence object or file."""
    e = evidence if isinstance(evidence, Evidence) else load_evidence(evidence)
    return e.markdown()


def _check_sha(what: str, v) -> None:
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise XrayError(f"{what} must be a sha256 (64 lowercase hex digits), got {v!r}")


class DumpWriter:
    """Writes a dump from numpy arrays through the Rust `xray_core::dump::DumpWriter` (the bytes
    `xray run` writes); the same API as `xray_oracle.dump.DumpWriter`:

        w = DumpWriter(family="whisper", model_id="my/model", producer="my-engine",
                       weights_sha256=..., audio_sha256=...)
        w.add("audio.encoder.memory", 0, "token_major", memory)
        w.tokens, w.transcript = tokens, text
        w.write("out/dump")              # atomic; an existing dump only with overwrite=True

    Every tensor is stored as f32. `producer` names your engine (`oracle` and `runtime` are
    X-Ray's own); `weights_sha256` / `audio_sha256` identify the HF weights and the audio file.
    """

    def __init__(self, *, family: str, model_id: str, producer: str, weights_sha256: str,
                 audio_sha256: str, tools: Optional[dict] = None,
                 engine_weights: Optional[dict] = None, stats_only: bool = False):
        _check_sha("weights_sha256", weights_sha256)
        _check_sha("audio_sha256", audio_sha256)
        for key, v in (("family", family), ("model_id", model_id), ("producer", producer)):
            if not isinstance(v, str) or not v:
                raise XrayError(f"{key} must be a non-empty string")
        if producer in ("oracle", "runtime"):
            raise XrayError(f"producer {producer!r} is X-Ray's own; name your engine")
        if engine_weights is not None:
            if not isinstance(engine_weights, dict) or not {"format", "sha256"} <= set(engine_weights):
                raise XrayError("engine_weights needs at least 'format' and 'sha256'")
            _check_sha("engine_weights.sha256", engine_weights["sha256"])
        self.family, self.model_id, self.producer = family, model_id, producer
        self.weights_sha256, self.audio_sha256 = weights_sha256, audio_sha256
        self.tools = dict(tools or {})
        self.engine_weights = None if engine_weights is None else dict(engine_weights)
        self.stats_only = bool(stats_only)
        self.tokens: list[int] = []
        self.transcript: str = ""
        self.extra: dict = {}
        self._entries: list[tuple] = []

    def add(self, name: str, step: int, layout: str, array, *, token_positions: Optional[str] = None,
            logits_processed: Optional[str] = None) -> None:
        """One tensor per (contract checkpoint, step), batch squeezed, in the contract's shape."""
        if not isinstance(name, str) or not name:
            raise XrayError("checkpoint name must be a non-empty string")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise XrayError(f"checkpoint {name}: step {step!r} must be a non-negative integer")
        if layout not in LAYOUTS:
            raise XrayError(f"checkpoint {_native.key(name, step)}: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        a = np.asarray(array)
        if a.dtype.kind not in "fiub":
            raise XrayError(f"checkpoint {_native.key(name, step)}: dtype {a.dtype} is not numeric")
        self._entries.append((name, step, layout, np.ascontiguousarray(a, dtype=np.float32),
                              token_positions, logits_processed))

    def write(self, out_dir: PathLike, *, overwrite: bool = False) -> Path:
        """Writes atomically (temporary sibling + rename); returns the absolute path."""
        manifest = {
            "schema": "xray.dump", "version": 1, "family": self.family, "model_id": self.model_id,
            "producer": self.producer, "weights_sha256": self.weights_sha256,
            "audio_sha256": self.audio_sha256, "tools": {str(k): str(v) for k, v in self.tools.items()},
            "tokens": [int(t) for t in self.tokens], "transcript": str(self.transcript),
            "stats_only": self.stats_only, "checkpoints": [], "extra": dict(self.extra),
        }
        if self.engine_weights is not None:
            manifest["engine_weights"] = self.engine_weights
        try:
            text = json.dumps(manifest, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise XrayError(f"manifest: {e}") from None
        return Path(_native.write_dump(os.fspath(out_dir), text, self._entries, overwrite=overwrite))


def xray_executable() -> Path:
    """The `xray` executable this package carries (what the `xray` command runs)."""
    from ._cli import executable
    return executable()


def run_xray(args: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    """Runs the bundled `xray` with `args` (`subprocess.run`'s keyword arguments pass through;
    `env`, when given, is extended as the `xray` command extends the environment). The
    executable is started directly, never through `python -m` (which would put the working
    directory on the path of the Python it starts)."""
    from ._cli import environment, executable
    kwargs["env"] = environment(kwargs.get("env"))
    return subprocess.run([os.fspath(executable()), *map(os.fspath, args)], **kwargs)
