"""Exceptions raised by the oracle. Every message names the file, key or checkpoint at fault and,
where there is one, the command that fixes it."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES_HINT = "run `make fixtures` (or `.venv/bin/python fixtures/build.py`)"


def read_json_object(path: str | Path, error: type[Exception]) -> dict:
    """The JSON object in file `path`; a file that cannot be read, does not parse or holds
    something other than an object raises `error` naming the file."""
    try:
        v = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        raise error(f"{path}: does not parse as JSON ({e})") from None
    if not isinstance(v, dict):
        raise error(f"{path}: is not a JSON object")
    return v


class OracleError(Exception):
    """Base class of every error the oracle raises on purpose."""


class OracleInputError(OracleError):
    """A model directory, audio file, dump or argument is unusable as given."""


class ContractError(OracleError):
    """The checkpoint contract is malformed or does not fit the model's config."""


class CaptureError(OracleError):
    """A captured tensor disagrees with the contract (shape, step, count, hook placement)."""


class DumpError(OracleError):
    """A dump directory does not load: bad manifest, missing file, checksum, header or size."""
