"""X-Ray oracle: the HuggingFace transformers reference, run in-process (from Rust through pyo3, or
as `python -m xray_oracle`), returning the checkpoint contract's tensors as numpy arrays.

Pure Python; imports torch/transformers lazily so that `xray_oracle.dump` works with numpy alone.
"""
from .errors import CaptureError, ContractError, DumpError, OracleError, OracleInputError

__version__ = "0.1.0"

__all__ = [
    "run",
    "run_whisper",
    "write_dump",
    "read_dump",
    "OracleError",
    "OracleInputError",
    "ContractError",
    "CaptureError",
    "DumpError",
]


def run(family: str, model_dir: str, audio_path: str, contract_json: str, *, dtype: str = "float32",
        max_new_tokens=None, teacher=None, only=None, threads=None, samples=None, audio_sha256=None,
        ops=None, summarize=None, weights_variant=None) -> dict:
    """One entry for the Rust side: dispatch on the family name with the common options.

    `teacher` is the runtime's hypothesis to force (families whose descriptor grants
    `teacher_forcing`; an autoregressive reference's generate is its own token stream). `samples` (float32, 16 kHz mono) and
    `audio_sha256` are the audio as the runtime's reader decoded and converted it: the reference
    is fed the same samples and never reads `audio_path`. `ops` selects op-level points
    (`xray_oracle.ops`: None, "all" or a list of point names), returned as `op_points`.
    `summarize` makes the run stats-only (families whose descriptor grants `stats_only`).
    Arguments, the model directory and the audio are checked here, before torch is imported (one
    check for every family).
    """
    from .modeldir import check_model_dir
    from .ops import parse_ops

    if dtype not in ("float32", "float64"):
        raise OracleInputError(f"dtype {dtype!r} is not 'float32' or 'float64'")
    for name, v in (("max_new_tokens", max_new_tokens), ("threads", threads)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise OracleInputError(f"{name} must be a positive integer, got {v!r}")
    from .families import descriptor, module, with_capability

    caps = descriptor(family)["capabilities"]
    for given, cap, what in ((summarize is not None, "stats_only", "stats-only capture (drop --stats-only)"),
                             (weights_variant is not None, "reference_variants", "reference variants (weights_variant)"),
                             (teacher is not None, "teacher_forcing", "a teacher-forced reference (teacher)")):
        if given and not caps[cap]:
            raise OracleInputError(f"{family}: its descriptor grants no {what}; the families that have it: "
                                   f"{', '.join(with_capability(cap)) or 'none'}")
    ops = parse_ops(ops)
    check_model_dir(model_dir, family)
    if samples is not None:
        from .audio import from_samples

        from_samples(audio_path, samples, audio_sha256 or "")
    else:
        from .audio import read_wav

        read_wav(audio_path)
    # The family's module (`oracle_module` of its descriptor), each with the same entry.
    return module(family).run_reference(
        model_dir, audio_path, contract_json, dtype=dtype, max_new_tokens=max_new_tokens, teacher=teacher,
        only=only, threads=threads, samples=samples, audio_sha256=audio_sha256, ops=ops, summarize=summarize,
        weights_variant=weights_variant)


def run_whisper(*args, **kwargs):
    """See `xray_oracle.whisper.run_whisper`."""
    from .whisper import run_whisper as _run

    return _run(*args, **kwargs)


def write_dump(*args, **kwargs):
    """See `xray_oracle.dump.write_dump`."""
    from .dump import write_dump as _w

    return _w(*args, **kwargs)


def read_dump(*args, **kwargs):
    """See `xray_oracle.dump.read_dump`."""
    from .dump import read_dump as _r

    return _r(*args, **kwargs)
