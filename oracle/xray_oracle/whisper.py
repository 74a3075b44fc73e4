"""The Whisper reference run: transformers' own feature extractor and greedy `generate`, with the
contract's checkpoints captured by forward hooks / pre-hooks at each decode step.

Pinned upstream: transformers 5.24.0, `models/whisper/modeling_whisper.py` and
`models/whisper/generation_whisper.py`. Facts this module relies on (checked by the tests):
- the decoder (`model.model.decoder`) runs once per decode step; step K = its K-th call, step 0
  is the prefill of the whole forced prefix <|startoftranscript|> <|notimestamps|>;
- the encoder runs once, before the first decoder call, so encoder checkpoints are at step 0;
- `encoder_attn.k_proj` / `v_proj` run at step 0 only (the cross-attention cache is reused);
- `proj_out` runs on every position of the step's input (no `logits_to_keep` in Whisper's forward);
- decoder and encoder layers return a bare tensor; attention modules return a tuple.
"""
from __future__ import annotations

import hashlib
import platform
import threading
from pathlib import Path
from typing import Optional

import numpy as np

from .audio import from_samples, read_wav, samples_sha256
from .dump import hf_weights_sha256
from .contract import Checkpoint, Contract, load_resolved
from .errors import CaptureError, OracleInputError, read_json_object
from .modeldir import PICKLE_SUFFIXES  # noqa: F401  (re-exported)
from .modeldir import check_model_dir as _shared_check
from .ops import OpRecorder, parse_ops
from .recorder import Recorder, StepBy, select
from . import variants

DTYPES = ("float32", "float64")
# The module whose every call is one decode step (`recorder.StepBy`).
DECODER = "model.decoder"

_sha_cache: dict[tuple[str, int, int], str] = {}


def _sha256_file(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _sha_cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _sha_cache[key] = h.hexdigest()
    return _sha_cache[key]


def check_model_dir(model_dir: str | Path) -> tuple[Path, dict, str]:
    """Refuse anything but a local safetensors Whisper directory. Returns (dir, config, weights sha256)."""
    d, config = _shared_check(model_dir, "whisper")
    # One rule for every writer: the single file's sha256, or of the sorted shards' list.
    weights_sha = hf_weights_sha256(d, _sha256_file)
    return d, config, weights_sha


def _chunk_length(d: Path) -> float:
    """preprocessor_config.json's window length in seconds (read without transformers)."""
    p = d / "preprocessor_config.json"
    pre = read_json_object(p, OracleInputError)
    chunk = pre.get("chunk_length", 30)
    if not isinstance(chunk, (int, float)) or chunk <= 0:
        raise OracleInputError(f"{p}: chunk_length {chunk!r} is not a positive number of seconds")
    return float(chunk)


def tool_versions() -> dict:
    import numpy
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }


def log_mel_float64(feature_extractor, samples: np.ndarray):
    """WhisperFeatureExtractor's torch path in float64, for calibration runs.

    Port of transformers 5.24.0 `WhisperFeatureExtractor.__call__` (pad with zeros / truncate to
    n_samples) + `_torch_extract_fbank_features` (models/whisper/feature_extraction_whisper.py),
    which hard-codes float32; every operation is the same, in float64."""
    import torch

    fe = feature_extractor
    if fe.dither != 0.0:
        raise OracleInputError("the float64 oracle path does not implement dither; preprocessor_config.json has dither != 0")
    x = np.zeros(fe.n_samples, dtype=np.float64)
    n = min(len(samples), fe.n_samples)
    x[:n] = samples[:n]
    waveform = torch.from_numpy(x)
    window = torch.hann_window(fe.n_fft, dtype=torch.float64)
    stft = torch.stft(waveform, fe.n_fft, fe.hop_length, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    mel_filters = torch.from_numpy(np.asarray(fe.mel_filters, dtype=np.float64))
    mel_spec = mel_filters.T @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    log_spec = (log_spec + 4.0) / 4.0
    return log_spec.unsqueeze(0)


def run_whisper(
    model_dir: str,
    audio_path: str,
    contract_json: str,
    max_new_tokens: Optional[int] = None,
    dtype: str = "float32",
    only: Optional[list[str]] = None,
    attn_implementation: str = "eager",
    threads: Optional[int] = 1,
    samples=None,
    audio_sha256: Optional[str] = None,
    ops=None,
    summarize=None,
    weights_variant: Optional[str] = None,
) -> dict:
    """Run the HF Whisper reference on one WAV and capture the contract's checkpoints.

    - model_dir: a local HF Whisper directory with safetensors weights (no pickles, no hub).
    - audio_path: 16 kHz mono 16-bit PCM WAV no longer than the model's chunk_length.
    - contract_json: the resolved contract (xray-core's `Contract::resolved_json`, or `xray contract`'s
      output), as JSON text, a path or a dict.
    - max_new_tokens: passed to generate (None: the generation config's max_length).
    - dtype: "float32" (the reference) or "float64" (model.double(), log-mel in f64; calibration).
    - only: restrict capture to these checkpoint names (expanded names or templates).
    - attn_implementation: "eager" (default: the plain matmul/softmax path) or "sdpa".
    - threads: torch intra-op threads for this call (restored afterwards); None keeps torch's
      setting. The default 1 makes the reference independent of the host's core count and immune
      to oversubscription: on a busy 2-core machine torch's 2-thread CPU ops (e.g. torch.isin in
      generate's suppress-tokens processor) ran up to 100x slower than with one thread.
    - samples / audio_sha256: 16 kHz mono float32 samples already decoded and converted by the
      caller (`xray`, the runtime's reader) and the audio FILE's sha256; audio_path is then only
      named in messages and never read.
    - ops: op-level points (`xray_oracle.ops`): None (default) captures none; "all" every module
      that has parameters of its own, both sides; a list of point names (`{module}:in|out`)
      exactly those. Points are captured per decode step like the checkpoints (the encoder's at
      step 0, cross-attention k/v_proj at step 0 only, decoder modules every step). An unknown
      module is an OracleInputError raised before generate runs.
    - summarize: stats-only capture (`xray check --stats-only`): a callable taking each captured
      float32 array as it is produced and returning an int (the caller keeps the summary); the
      array is not kept, and each checkpoint entry carries "shape" and "summary" (that int)
      instead of "array". float32 only, no op-level points.

    - weights_variant: a reference variant (`xray_oracle.variants`: "int8", "int8_conv",
      "int8_w8a8", "f16", "bf16"): the model's weights put on that grid after loading; the result
      then carries "weights_variant" (what was changed). None (default): the reference itself.

    Returns {"family", "tokens", "transcript", "checkpoints": [{"name", "step", "layout",
    "array"}], "op_points": [same keys, in firing order; [] without ops], "tools",
    "weights_sha256", "audio_sha256", "config", "dims", "dtype", "step_tokens"}; arrays are C-contiguous float32 (float64 when dtype="float64"), batch squeezed,
    in the contract's canonical shape. `tokens` is the full decoder sequence: forced prefix +
    generated tokens, including the final EOS when generation stopped on it.
    """
    if dtype not in DTYPES:
        raise OracleInputError(f"dtype {dtype!r} is not one of {DTYPES}")
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise OracleInputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise OracleInputError(f"threads must be a positive integer or None, got {threads!r}")
    if attn_implementation not in ("eager", "sdpa"):
        raise OracleInputError(f"attn_implementation {attn_implementation!r} is not 'eager' or 'sdpa'")
    ops = parse_ops(ops)
    variants.check(weights_variant)
    if weights_variant is not None and dtype != "float32":
        raise OracleInputError("a weights variant is a float32 reference (dtype float32)")
    if summarize is not None and (dtype != "float32" or ops is not None):
        raise OracleInputError("stats-only capture (summarize) is float32 with no op-level points")
    d, config, weights_sha = check_model_dir(model_dir)
    contract = load_resolved(contract_json, "whisper")
    selected = select(contract, only)
    # The audio is checked before torch loads: a bad file costs no model load.
    chunk = _chunk_length(d)
    np_dtype = np.float64 if dtype == "float64" else np.float32
    if samples is not None:
        audio = from_samples(audio_path, samples, audio_sha256 or "", dtype=np_dtype, max_seconds=chunk)
    else:
        audio = read_wav(audio_path, max_seconds=chunk, dtype=np_dtype)

    import torch

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(d, config, weights_sha, contract, selected, audio, max_new_tokens, dtype, attn_implementation, ops,
                    summarize, weights_variant)
    finally:
        torch.set_num_threads(previous_threads)


# Models loaded by `_run`, keyed by what they were loaded from: the directory, the weights'
# content hash, dtype and attention implementation. A corpus run (`xray check` over many clips,
# one process) loads the model once; a changed weights file is a new key. Hooks are removed after
# every run, so a cached model carries no state between runs.
_loaded: dict[tuple, tuple] = {}
# One reference run at a time in this process: a cached model is shared, and the hooks of two
# concurrent runs (two Rust threads each holding the interpreter in turn; torch releases the GIL)
# would both fire on it and take each other's tensors.
_run_lock = threading.Lock()


def _load(d: Path, weights_sha: str, dtype: str, attn_implementation: str, weights_variant=None):
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

    key = (str(d.resolve()), weights_sha, dtype, attn_implementation, weights_variant)
    if key not in _loaded:
        fe = WhisperFeatureExtractor.from_pretrained(str(d), local_files_only=True)
        tokenizer = WhisperTokenizer.from_pretrained(str(d), local_files_only=True)
        model = WhisperForConditionalGeneration.from_pretrained(
            str(d),
            local_files_only=True,
            use_safetensors=True,
            dtype=torch.float32,
            attn_implementation=attn_implementation,
        )
        model.eval()
        if dtype == "float64":
            model = model.double()
        variant = variants.apply(model, weights_variant) if weights_variant is not None else None
        model._xray_variant = variant
        if len(_loaded) >= 2:  # at most two (f32 and f64 of one model)
            _loaded.pop(next(iter(_loaded)))
        _loaded[key] = (fe, tokenizer, model)
    return _loaded[key]



def _run(d: Path, config: dict, weights_sha: str, contract: Contract, selected: list[Checkpoint], audio,
         max_new_tokens: Optional[int], dtype: str, attn_implementation: str, ops=None, summarize=None,
         weights_variant=None) -> dict:
    with _run_lock:
        return _run_locked(d, config, weights_sha, contract, selected, audio, max_new_tokens, dtype,
                           attn_implementation, ops, summarize, weights_variant)


def _run_locked(d: Path, config: dict, weights_sha: str, contract: Contract, selected: list[Checkpoint], audio,
                max_new_tokens: Optional[int], dtype: str, attn_implementation: str, ops, summarize,
                weights_variant=None) -> dict:
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tdtype = torch.float64 if dtype == "float64" else torch.float32

    fe, tokenizer, model = _load(d, weights_sha, dtype, attn_implementation, weights_variant)
    if fe.sampling_rate != audio.sample_rate:
        raise OracleInputError(f"{d / 'preprocessor_config.json'}: sampling_rate {fe.sampling_rate}, the oracle feeds 16000 Hz")
    expected_frames = 2 * model.config.max_source_positions
    if fe.nb_max_frames != expected_frames:
        raise OracleInputError(
            f"{d}: preprocessor_config.json makes {fe.nb_max_frames} mel frames (chunk_length {fe.chunk_length} s), "
            f"config.json's max_source_positions {model.config.max_source_positions} needs {expected_frames}"
        )

    if dtype == "float64":
        feats = log_mel_float64(fe, audio.samples)
    else:
        feats = fe(audio.samples, sampling_rate=audio.sample_rate, return_tensors="pt").input_features
    feats = feats.to(tdtype)

    step_ids: list[list[int]] = []  # each decode step's input ids

    def on_decoder(args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise CaptureError("the decoder was called without input_ids; cannot tell the step's tokens")
        step_ids.append([int(t) for t in ids[0].tolist()])

    # Step K is the decoder's K-th call (the encoder's checkpoints fire before the first: step 0).
    rec = Recorder(model, contract, selected, step_by=StepBy(DECODER, on_decoder), summarize=summarize)
    # Module names are checked here, before generate: the module tree exists once loaded.
    oprec = OpRecorder(model, ops, contract, step=lambda: rec.step)
    rec.install()
    # After the contract recorder: the decoder's pre-hook sets the step before any op hook of a
    # decode step fires.
    oprec.install()
    try:
        with torch.inference_mode():
            kwargs = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
            out = model.generate(feats, do_sample=False, num_beams=1, return_dict_in_generate=True, **kwargs)
    finally:
        oprec.remove()
        rec.remove()

    seq = [int(t) for t in out.sequences[0].tolist()]
    _check_steps(step_ids, seq, rec.steps)
    prefix_len = len(step_ids[0])
    # `tokens`: the step's input positions (the forced prefix at step 0, then one); `past+tokens`:
    # every position so far (self-attention keys: the cache plus this step's).
    checkpoints = rec.collect(lambda s: {"tokens": prefix_len if s == 0 else 1, "past+tokens": prefix_len + s})
    op_points = oprec.points()
    transcript = tokenizer.decode(seq, skip_special_tokens=True)
    return {
        "family": "whisper",
        "tokens": seq,
        "transcript": transcript,
        "checkpoints": checkpoints,
        "op_points": op_points,
        "tools": tool_versions(),
        "weights_sha256": weights_sha,
        "audio_sha256": audio.sha256,
        "samples_sha256": samples_sha256(audio.samples),
        "config": config,
        "dims": dict(contract.dims),
        "dtype": dtype,
        "weights_variant": getattr(model, "_xray_variant", None),
        "attn_implementation": attn_implementation,
        "step_tokens": step_ids,
    }


def _check_steps(step_ids: list[list[int]], seq: list[int], steps: int) -> None:
    """The decoder's per-step inputs must be the returned sequence: prefix at step 0, then each
    generated token fed back one step later."""
    if steps == 0:
        raise CaptureError("generate() never called the decoder")
    fed = list(step_ids[0])
    for k, ids in enumerate(step_ids[1:], start=1):
        if len(ids) != 1:
            raise CaptureError(f"decoder step {k} got {len(ids)} input tokens, expected 1 (KV-cached decoding)")
        fed += ids
    if seq[: len(fed)] != fed or len(seq) != len(fed) + 1:
        raise CaptureError(
            f"generate() returned {seq}, but the decoder was fed {fed} over {steps} steps "
            "(expected the returned sequence to be the fed tokens plus the last step's token)"
        )


def run_reference(model_dir, audio_path, contract_json, *, dtype, max_new_tokens, teacher, only, threads,
                  samples, audio_sha256, ops, summarize, weights_variant) -> dict:
    """The family's entry for `xray_oracle.run` (arguments and capabilities already checked there:
    Whisper's reference is never teacher-forced, its generate is the reference token stream)."""
    if teacher is not None:
        raise OracleInputError("whisper: the reference is not teacher-forced; teacher must be None")
    kw = {} if threads is None else {"threads": threads}
    if weights_variant is not None:
        kw["weights_variant"] = weights_variant
    return run_whisper(model_dir, audio_path, contract_json, max_new_tokens=max_new_tokens, dtype=dtype,
                       only=only, samples=samples, audio_sha256=audio_sha256, ops=ops, summarize=summarize, **kw)


def load_reference(d: Path, dtype: str):
    """For replay (`xray_oracle.replay.load_model`): (cache key, loader of the eval-mode model)."""
    _, _, sha = check_model_dir(d)
    return (str(d.resolve()), sha, dtype), lambda: _load(d, sha, dtype, "eager")[2]
