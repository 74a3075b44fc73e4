"""PyTorch-eager timing half of `xray bench`: the Rust side calls these one repetition at a time,
interleaved with its own runtime, so both sides see the same machine noise.

Each call returns wall seconds of exactly one operation; the caller takes medians.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .audio import from_samples, read_wav


class WhisperBench:
    """HF Whisper (eager attention, f32) loaded once; features computed once."""

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
        self.model = WhisperForConditionalGeneration.from_pretrained(
            str(d), local_files_only=True, use_safetensors=True, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        feats = self.fe(np.asarray(audio.samples, dtype=np.float32), sampling_rate=16000, return_tensors="pt")
        self.features = feats.input_features.to(torch.float32)
        self.threads = int(threads)

    def encoder(self) -> float:
        """One encoder forward on the padded window."""
        import torch

        with torch.inference_mode():
            t0 = time.perf_counter()
            self.model.model.encoder(self.features)
            return time.perf_counter() - t0

    def decode(self, max_new_tokens: int) -> tuple[float, int]:
        """One greedy generate on precomputed encoder outputs (the encoder is not timed):
        (seconds, number of generated tokens)."""
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        with torch.inference_mode():
            if getattr(self, "_memory", None) is None:
                self._memory = self.model.model.encoder(self.features).last_hidden_state
            enc = BaseModelOutput(last_hidden_state=self._memory)
            t0 = time.perf_counter()
            out = self.model.generate(encoder_outputs=enc, do_sample=False, num_beams=1,
                                      max_new_tokens=int(max_new_tokens))
            dt = time.perf_counter() - t0
        return dt, int(out.shape[-1])

    def generate(self, max_new_tokens: int) -> tuple[float, int]:
        """One greedy generate capped at max_new_tokens: (seconds, number of generated tokens)."""
        import torch

        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(self.features, do_sample=False, num_beams=1, max_new_tokens=int(max_new_tokens))
            dt = time.perf_counter() - t0
        return dt, int(out.shape[-1])
