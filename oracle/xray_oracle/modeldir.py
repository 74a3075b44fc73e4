"""One model-directory check for every family, run before torch is imported: a local directory
with safetensors weights and the files the family's reference reads; never a pickle (refused even
when safetensors are present: the directory is not what it says), never remote code (`auto_map`).
The model types and files per family are the family descriptor's (`xray_oracle.families`).
Pure Python (json + pathlib)."""
from __future__ import annotations

from pathlib import Path

from .errors import FIXTURES_HINT, OracleInputError, read_json_object
from .families import descriptor

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")

FIXES = {
    "tokenizer.json": "copy the model's tokenizer.json next to its config.json (the transcript is decoded with it)",
}


def check_model_dir(model_dir: str | Path, family: str, for_run: bool = True) -> tuple[Path, dict]:
    """Refuse anything but a local safetensors directory of `family`. Returns (dir, config).
    `for_run=False` skips the files only a full run reads (loading the model alone)."""
    d = Path(model_dir)
    desc = descriptor(family)
    if not d.exists():
        raise OracleInputError(f"model directory {d} does not exist; {FIXTURES_HINT}")
    if not d.is_dir():
        raise OracleInputError(f"model directory {d} is not a directory")
    pickles = sorted(p.name for p in d.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise OracleInputError(
            f"{d} contains pickle-format weights {pickles}; the oracle loads safetensors only and never unpickles. "
            "Remove them (keep model.safetensors)"
        )
    if not sorted(d.glob("*.safetensors")):
        raise OracleInputError(f"{d} has no .safetensors weights; {FIXTURES_HINT}")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise OracleInputError(f"{cfg_path} is missing; {FIXTURES_HINT}")
    config = read_json_object(cfg_path, OracleInputError)
    if "auto_map" in config:
        raise OracleInputError(f"{cfg_path} has an auto_map (remote code); the oracle never runs remote code")
    mt = config.get("model_type")
    if mt not in desc["model_types"]:
        raise OracleInputError(f"{cfg_path}: model_type is {mt!r}, expected one of {desc['model_types']} for {family}")
    for f in desc["required_files"] + (desc["run_files"] if for_run else []):
        if not (d / f).is_file():
            raise OracleInputError(f"{d / f} is missing; {FIXES.get(f, FIXTURES_HINT)}")
    return d, config
