"""Exceptions raised by the oracle. Every message names the file, key or checkpoint at fault and,
where there is one, the command that fixes it."""

FIXTURES_HINT = "run `make fixtures` (or `.venv/bin/python fixtures/build.py`)"


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
