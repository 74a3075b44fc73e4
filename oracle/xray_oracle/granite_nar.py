"""granite_nar reference: IBM Granite Speech NAR (`ibm-granite/granite-speech-4.1-2b-nar`) in PyTorch.

transformers 5.24 ships the autoregressive granite_speech family and the Granite LM but not the
non-autoregressive model, whose code lives on the hub behind trust_remote_code (never run here).
This module rebuilds it from transformers' own pieces and writes only the NAR-specific parts.

Pinned upstream references (the code each class mirrors):

- transformers 5.24.0 `models/granite_speech/modeling_granite_speech.py`: `GraniteSpeechCTCEncoder`
  (input linear, Conformer blocks, `out`/`out_mid` self-conditioning heads) -- reused as-is
  through subclassing; only `forward` is rewritten.
- transformers 5.24.0 `models/granite_speech/feature_extraction_granite_speech.py`:
  `GraniteSpeechFeatureExtractor` -- its torchaudio `MelSpectrogram` is reused.
- transformers 5.24.0 `models/granite/modeling_granite.py`: `GraniteForCausalLM` -- the LM,
  reused as-is, run with an explicit all-attend 4D mask (bidirectional).
- huggingface/transformers@032cc088e138f2a7001ad63f3f09057bdf3a64f9
  `src/transformers/models/granite_speech_nar/{modeling,configuration,feature_extraction}_granite_speech_nar.py`
  (the native port of the hub model, not in any release yet): source of the NAR-specific math
  written here (posterior-weighted BPE pooling, projector, insertion slots, frame count) and of
  the config field names. Parameter names follow the *original* hub namespace the port's
  `convert_granite_speech_nar_to_hf.py` documents (`encoder.*`, `encoder.out_bpe`,
  `projector.*`, `language_model.model.*`).
- Forward map: /work/shared/seeds/002_0f0743365d363473.txt. Where it disagrees with the port,
  the port wins; every disagreement is listed in docs/granite_nar.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from transformers import GraniteConfig, GraniteForCausalLM
from transformers.models.granite_speech.configuration_granite_speech import GraniteSpeechEncoderConfig
from transformers.models.granite_speech.feature_extraction_granite_speech import GraniteSpeechFeatureExtractor
from transformers.models.granite_speech.modeling_granite_speech import GraniteSpeechCTCEncoder

from . import audio as _audio
from .contract import load_resolved
from .dump import file_sha256
from .errors import OracleInputError
from .modeldir import FIXES, check_model_dir
from .ops import OpRecorder, parse_ops
from .recorder import Recorder, select

FIXES_TOKENIZER = FIXES["tokenizer.json"]

FAMILY = "granite_nar"
SAMPLE_RATE = 16000

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class GraniteNarInputError(OracleInputError, ValueError):
    """Audio, model directory or argument the granite_nar oracle refuses, with the reason (an
    `OracleInputError`: `xray` shows it as one line)."""


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@dataclass
class GraniteNarProjectorConfig:
    """`projector_config` of the hub config.json (field names of the native port)."""

    encoder_dim: int = 1024
    llm_dim: int = 2048
    downsample_rate: int = 5
    num_encoder_layers: int = 4
    hidden_size: int = 2048
    num_heads: int = 32
    num_layers: int = 2
    block_size: int = 15
    mlp_ratio: int = 2
    layernorm_eps: float = 1e-6
    attn_bias: bool = True
    mlp_bias: bool = True
    dropout_prob: float = 0.1  # inactive at inference

    @classmethod
    def from_dict(cls, d: dict) -> "GraniteNarProjectorConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class GraniteNarConfig:
    """The whole-model config.json: encoder, projector and text sections plus top-level NAR fields."""

    encoder: GraniteSpeechEncoderConfig
    projector: GraniteNarProjectorConfig
    text: GraniteConfig
    encoder_layer_indices: list[int]
    self_conditioning_layer: int
    bpe_output_dim: int
    bpe_pooling_window: int
    blank_token_id: int
    min_edit_sequence_length: int
    scale_projected_embeddings: bool
    raw: dict

    @classmethod
    def from_dict(cls, d: dict) -> "GraniteNarConfig":
        for key in ("encoder_config", "projector_config", "text_config"):
            if not isinstance(d.get(key), dict):
                raise GraniteNarInputError(f"config.json: missing section '{key}'")
        enc = dict(d["encoder_config"])
        enc.pop("model_type", None)
        txt = dict(d["text_config"])
        if txt.pop("model_type", "granite") != "granite":
            raise GraniteNarInputError("config.json: text_config.model_type must be 'granite'")
        try:
            encoder = GraniteSpeechEncoderConfig(**enc)
            projector = GraniteNarProjectorConfig.from_dict(d["projector_config"])
            text = GraniteConfig(**txt)
        except (TypeError, ValueError) as e:
            raise GraniteNarInputError(f"config.json: {e}") from e
        text._attn_implementation = "eager"
        n_layers = encoder.num_layers
        sc = enc.get("self_conditioning_layer")
        sc = n_layers // 2 if sc is None else int(sc)
        if not 1 <= sc <= n_layers:
            raise GraniteNarInputError(f"config.json: self_conditioning_layer {sc} not in [1, {n_layers}]")
        indices = d.get("encoder_layer_indices", [4, 8, 12, -1])
        for i in indices:
            if not -(n_layers + 1) <= i <= n_layers:
                raise GraniteNarInputError(f"config.json: encoder_layer_indices element {i} out of range")
        blank = d.get("blank_token_id")
        if blank is None:
            blank = text.eos_token_id
        if isinstance(blank, list) or blank is None:
            raise GraniteNarInputError("config.json: blank_token_id (or a single text eos_token_id) is required")
        cfg = cls(
            encoder=encoder,
            projector=projector,
            text=text,
            encoder_layer_indices=[int(i) for i in indices],
            self_conditioning_layer=sc,
            bpe_output_dim=int(enc.get("bpe_output_dim", text.vocab_size)),
            bpe_pooling_window=int(enc.get("bpe_pooling_window", 4)),
            blank_token_id=int(blank),
            min_edit_sequence_length=int(d.get("min_edit_sequence_length", 8)),
            scale_projected_embeddings=bool(d.get("scale_projected_embeddings", True)),
            raw=d,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        p, e, t = self.projector, self.encoder, self.text
        checks = [
            (p.num_encoder_layers == len(self.encoder_layer_indices), "projector num_encoder_layers != len(encoder_layer_indices)"),
            (p.encoder_dim == e.hidden_dim, "projector encoder_dim != encoder hidden_dim"),
            (p.llm_dim == t.hidden_size, "projector llm_dim != text hidden_size"),
            (p.block_size % p.downsample_rate == 0, "projector block_size not a multiple of downsample_rate"),
            (p.hidden_size % p.num_heads == 0, "projector hidden_size not a multiple of num_heads"),
            (self.bpe_output_dim in (t.vocab_size, t.vocab_size + 1), "bpe_output_dim must be vocab_size (or vocab_size + 1, legacy)"),
            (0 <= self.blank_token_id < t.vocab_size, "blank_token_id outside the text vocabulary"),
            (t.tie_word_embeddings, "text_config.tie_word_embeddings must be true"),
        ]
        for ok, why in checks:
            if not ok:
                raise GraniteNarInputError(f"config.json: {why}")

    @property
    def bpe_blank_channel(self) -> int:
        """BPE-CTC blank channel: `blank_token_id` when channels are LLM ids; 0 in the legacy
        `vocab_size + 1` layout (channel c > 0 is LLM id c - 1)."""
        return self.blank_token_id if self.bpe_output_dim == self.text.vocab_size else 0


# --------------------------------------------------------------------------------------------
# Frontend
# --------------------------------------------------------------------------------------------


def read_wav(path: str | Path) -> tuple[np.ndarray, bytes]:
    """Read a 16 kHz mono 16-bit PCM WAV; returns (float32 samples in [-1, 1), file bytes).
    The one standalone reader (`xray_oracle.audio.read_wav`) shared with Whisper; refusals are
    GraniteNarInputError naming the file and the reason."""
    try:
        a = _audio.read_wav(path)
    except GraniteNarInputError:
        raise
    except OracleInputError as e:
        raise GraniteNarInputError(str(e)) from None
    return a.samples, Path(path).read_bytes()


class GraniteNarFrontend:
    """Log-mel + 2-frame stack. The STFT/mel filterbank is transformers' own
    `GraniteSpeechFeatureExtractor.mel_filters` (torchaudio MelSpectrogram: hann periodic window
    400 zero-padded to n_fft 512, hop 160, center/reflect, HTK mel, no filter norm, power 2).

    `feature_extractor_type` selects the framing:

    - `GraniteSpeechNarFeatureExtractor` (the hub model's, default): keep the first
      `2 * (n_samples // 320)` mel frames, *then* log10/clamp/normalise (the max is taken over the
      kept frames only) -- port `feature_extraction_granite_speech_nar.py` `_extract_features`.
    - `GraniteSpeechFeatureExtractor`: transformers 5.24's AR extractor called as-is (normalise
      over all `n_samples // 160 + 1` frames, then drop the last one if the count is odd). It
      yields one more encoder frame whenever `n_samples // 160` is odd.
    """

    def __init__(self, preprocessor: dict):
        self.kind = preprocessor.get("feature_extractor_type", "GraniteSpeechNarFeatureExtractor")
        if self.kind not in ("GraniteSpeechNarFeatureExtractor", "GraniteSpeechFeatureExtractor"):
            raise GraniteNarInputError(f"preprocessor_config.json: unsupported feature_extractor_type '{self.kind}'")
        self.sampling_rate = int(preprocessor.get("sampling_rate", SAMPLE_RATE))
        if self.sampling_rate != SAMPLE_RATE:
            raise GraniteNarInputError(f"preprocessor_config.json: sampling_rate {self.sampling_rate} != {SAMPLE_RATE}")
        self.hop_length = int(preprocessor.get("hop_length", 160))
        self.n_fft = int(preprocessor.get("n_fft", 512))
        self.n_mels = int(preprocessor.get("n_mels", preprocessor.get("feature_size", 80)))
        self.fe = GraniteSpeechFeatureExtractor(
            sampling_rate=self.sampling_rate,
            n_fft=self.n_fft,
            win_length=int(preprocessor.get("win_length", 400)),
            hop_length=self.hop_length,
            n_mels=self.n_mels,
        )

    def __call__(self, audio: np.ndarray) -> torch.Tensor:
        """float32 samples -> `[1, enc_frames, 2 * n_mels]` float32."""
        wav = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))[None]
        shortest = max(2 * self.hop_length, self.n_fft // 2 + 1)  # one encoder frame; reflect padding
        if wav.shape[-1] < shortest:
            raise GraniteNarInputError(f"audio too short: {wav.shape[-1]} samples, need at least {shortest}")
        if self.kind == "GraniteSpeechFeatureExtractor":
            feats = self.fe(wav, device="cpu")["input_features"]
        else:
            with torch.no_grad():
                keep = 2 * (wav.shape[-1] // (2 * self.hop_length))
                mel = self.fe.mel_filters(wav.float())[..., :keep]
                logmel = mel.transpose(-1, -2).clamp_min(1e-10).log10()
                mx = logmel.amax(dim=(-2, -1), keepdim=True)
                logmel = torch.maximum(logmel, mx - 8.0) / 4 + 1
                feats = logmel.reshape(1, -1, 2 * self.n_mels)
        if feats.shape[1] == 0:
            raise GraniteNarInputError(f"audio too short: {wav.shape[-1]} samples give no encoder frame")
        return feats.contiguous()


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------


def posterior_weighted_pool(hidden: torch.Tensor, importance: torch.Tensor, window: int) -> torch.Tensor:
    """`[B, T, D]`, `[B, T]` -> `[B, ceil(T / window), D]`.

    Right-pads T with zero frames of zero importance to whole windows, then per window
    `sum_t h_t * w_t` with `w_t = imp_t / (sum_window imp + 1e-8)`. A short tail window is thus
    normalised by its own frames only; an all-blank window pools to ~0 (its logits ~ the bias).
    Port: `_posterior_weighted_pool`.
    """
    b, t, d = hidden.shape
    pad = (window - t % window) % window
    if pad:
        hidden = F.pad(hidden, (0, 0, 0, pad))
        importance = F.pad(importance, (0, pad))
    n = hidden.shape[1] // window
    hidden = hidden.view(b, n, window, d)
    importance = importance.view(b, n, window)
    weights = importance / (importance.sum(dim=-1, keepdim=True) + 1e-8)
    return (hidden * weights.unsqueeze(-1)).sum(dim=2)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """The port computes the mid softmax and the pooling in float32; keep float64 runs float64."""
    return x if x.dtype == torch.float64 else x.float()


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # [1, T, H]
    hidden_states: list[torch.Tensor]  # [input_linear out, block 1 out, ..., block n out]
    mid_logits: torch.Tensor  # [1, T, output_dim]
    blank_probs: torch.Tensor  # [1, T]
    bpe_logits: torch.Tensor  # [1, ceil(T / window), bpe_output_dim]


class GraniteNarEncoder(GraniteSpeechCTCEncoder):
    """transformers' `GraniteSpeechCTCEncoder` (input_linear, Conformer `layers`, `out`, `out_mid`)
    plus the NAR BPE-CTC head `out_bpe` and a rewritten forward (port `GraniteSpeechNarCTCEncoder`):

    - self-conditioning after 1-based block `self_conditioning_layer` (5.24 hard-codes n // 2);
    - the mid softmax's blank column (char channel 0) is kept as the BPE pooling importance;
    - `hidden_states[k]` follows HF's convention (0 = input_linear output, k = block k output), and
      the self-conditioning block's entry is the value *after* the bypass add (the port gets this
      through an in-place `+=` on the recorded tensor; written out-of-place here).
    """

    def __init__(self, config: GraniteSpeechEncoderConfig, self_conditioning_layer: int, bpe_output_dim: int, bpe_pooling_window: int):
        super().__init__(config)
        self.self_conditioning_layer = self_conditioning_layer
        self.bpe_pooling_window = bpe_pooling_window
        self.out_bpe = nn.Linear(config.hidden_dim, bpe_output_dim, bias=True)
        # Hook point only (no parameters): softmax(out(h_mid))[..., 0].
        self.mid_blank_probs = nn.Identity()
        # Test switch: False drops the `h += out_mid(softmax(out(h)))` add (blank probs still computed).
        self.use_self_conditioning = True

    def forward(self, input_features: torch.Tensor) -> EncoderOutput:  # type: ignore[override]
        h = self.input_linear(input_features)
        hidden_states = [h]
        mid_logits = blank_probs = None
        for idx, layer in enumerate(self.layers, start=1):
            h = layer(h, attention_dists=self.attention_dists)
            if idx == self.self_conditioning_layer:
                mid_logits = self.out(h)
                mid_probs = torch.softmax(_wide(mid_logits), dim=-1)
                blank_probs = self.mid_blank_probs(mid_probs[..., 0])
                if self.use_self_conditioning:
                    h = h + self.out_mid(mid_probs.to(h.dtype))
            hidden_states.append(h)
        assert mid_logits is not None and blank_probs is not None
        pooled = posterior_weighted_pool(_wide(h), 1.0 - blank_probs, self.bpe_pooling_window).to(h.dtype)
        bpe_logits = self.out_bpe(pooled)
        return EncoderOutput(h, hidden_states, mid_logits, blank_probs, bpe_logits)


# --------------------------------------------------------------------------------------------
# Projector (NLE simplified Q-Former)
# --------------------------------------------------------------------------------------------


class GraniteNarCrossAttention(nn.Module):
    """Multi-head cross-attention, softmax scale 1/sqrt(head_dim), no mask (padded window rows are
    attended). Port `GraniteSpeechNarQFormerCrossAttention`."""

    def __init__(self, cfg: GraniteNarProjectorConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, h, bias=cfg.attn_bias)
        self.k_proj = nn.Linear(h, h, bias=cfg.attn_bias)
        self.v_proj = nn.Linear(h, h, bias=cfg.attn_bias)
        self.o_proj = nn.Linear(h, h, bias=cfg.attn_bias)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        b, q_len, h = hidden_states.shape
        k_len = encoder_hidden_states.shape[1]
        q = self.q_proj(hidden_states).view(b, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(encoder_hidden_states).view(b, k_len, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(encoder_hidden_states).view(b, k_len, self.num_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, h))


class GraniteNarQFormerMLP(nn.Module):
    def __init__(self, cfg: GraniteNarProjectorConfig):
        super().__init__()
        inner = int(cfg.hidden_size * cfg.mlp_ratio)
        self.fc1 = nn.Linear(cfg.hidden_size, inner, bias=cfg.mlp_bias)
        self.act = nn.SiLU()
        self.fc2 = nn.Linear(inner, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class GraniteNarQFormerLayer(nn.Module):
    """Pre-LN cross-attention + residual, pre-LN SiLU MLP + residual; no self-attention."""

    def __init__(self, cfg: GraniteNarProjectorConfig):
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.cross_attention = GraniteNarCrossAttention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.mlp = GraniteNarQFormerMLP(cfg)

    def forward(self, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        x = x + self.cross_attention(self.attn_norm(x), kv)
        return x + self.mlp(self.mlp_norm(x))


class GraniteNarQFormer(nn.Module):
    def __init__(self, cfg: GraniteNarProjectorConfig):
        super().__init__()
        self.layers = nn.ModuleList([GraniteNarQFormerLayer(cfg) for _ in range(cfg.num_layers)])

    def forward(self, query_embeds: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        x = query_embeds
        for layer in self.layers:
            x = layer(x, encoder_hidden_states)
        return x


class GraniteNarProjector(nn.Module):
    """Windowed Q-Former projector (port `GraniteSpeechNarProjector`, hub parameter names).

    `[1, T, L * E]` -> per-slice LayerNorm (eps layernorm_eps) -> `layer_projector` -> exact (erf)
    GELU -> zero right-pad to whole blocks of `block_size` -> K/V = window + `window_positions`,
    Q = `query` + mean over each run of `downsample_rate` rows of the (un-positioned, zero-padded)
    window -> Q-Former -> `[1, nblocks * n_query, hidden]` -> `out_norm` -> `out_linear`.
    """

    def __init__(self, cfg: GraniteNarProjectorConfig):
        super().__init__()
        self.cfg = cfg
        self.layer_norms = nn.ModuleList(
            [nn.LayerNorm(cfg.encoder_dim, eps=cfg.layernorm_eps) for _ in range(cfg.num_encoder_layers)]
        )
        self.layer_projector = nn.Linear(cfg.encoder_dim * cfg.num_encoder_layers, cfg.hidden_size)
        self.projector_act = nn.GELU()
        self.qformer = GraniteNarQFormer(cfg)
        n_query = cfg.block_size // cfg.downsample_rate
        self.query = nn.Parameter(torch.zeros(1, n_query, cfg.hidden_size))
        self.window_positions = nn.Parameter(torch.zeros(1, cfg.block_size, cfg.hidden_size))
        self.out_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
        self.out_linear = nn.Linear(cfg.hidden_size, cfg.llm_dim)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, t, _ = hidden_states.shape
        x = hidden_states.view(b, t, cfg.num_encoder_layers, cfg.encoder_dim)
        x = torch.cat([ln(x[:, :, i]) for i, ln in enumerate(self.layer_norms)], dim=-1)
        x = self.projector_act(self.layer_projector(x))
        nblocks = math.ceil(t / cfg.block_size)
        pad = nblocks * cfg.block_size - t
        if pad:
            x = F.pad(x, (0, 0, 0, pad), "constant", 0)
        x = x.view(b * nblocks, cfg.block_size, cfg.hidden_size)
        n_query = self.query.shape[1]
        mean_pool = x.view(b * nblocks, n_query, cfg.downsample_rate, cfg.hidden_size).mean(dim=-2)
        q = self.qformer(query_embeds=self.query + mean_pool, encoder_hidden_states=x + self.window_positions)
        q = q.view(b, nblocks * n_query, -1)
        return self.out_linear(self.out_norm(q))


# --------------------------------------------------------------------------------------------
# Host logic
# --------------------------------------------------------------------------------------------


def ctc_greedy_decode(logits: torch.Tensor, blank: int) -> list[int]:
    """`[N, V]` -> argmax per row (first maximum wins), collapse repeats, then drop `blank`
    (so `a blank a` gives `a a`). Port `_ctc_greedy_decode`."""
    pred = torch.unique_consecutive(logits.argmax(dim=-1))
    return [int(i) for i in pred[pred != blank]]


def add_insertion_slots(token_ids: Sequence[int], blank: int, min_length: int) -> list[int]:
    """`blank` at every even index, hypothesis at odd indices, length `max(2n + 1, min_length)`.
    Port `_add_insertion_slots`."""
    out = [int(blank)] * max(2 * len(token_ids) + 1, min_length)
    for i, tok in enumerate(token_ids):
        out[2 * i + 1] = int(tok)
    return out


def top2_margins(logits: torch.Tensor) -> np.ndarray:
    """Per-row top-1 minus top-2 logit."""
    top = torch.topk(logits.detach().double(), k=2, dim=-1).values
    return (top[..., 0] - top[..., 1]).cpu().numpy()


@dataclass
class GraniteNarOutput:
    tokens: list[int]
    hypothesis: list[int]
    template: list[int]
    text_logits: torch.Tensor  # [1, n_text, vocab], raw lm_head
    bpe_logits: torch.Tensor  # [1, bpe_frames, bpe_output_dim]
    n_audio: int


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class GraniteNARForConditionalGeneration(nn.Module):
    """Encoder -> BPE-CTC hypothesis -> projector -> one bidirectional Granite LM pass.

    Parameter names mirror the hub checkpoint: `encoder.*` (with `encoder.out_bpe`), `projector.*`,
    `language_model.model.*`; `language_model.lm_head.weight` is tied to
    `language_model.model.embed_tokens.weight` and not stored.
    """

    def __init__(self, config: GraniteNarConfig):
        super().__init__()
        self.config = config
        self.encoder = GraniteNarEncoder(
            config.encoder, config.self_conditioning_layer, config.bpe_output_dim, config.bpe_pooling_window
        )
        self.projector = GraniteNarProjector(config.projector)
        self.language_model = GraniteForCausalLM(config.text)
        for layer in self.language_model.model.layers:
            layer.self_attn.is_causal = False
        # Test switch: False runs the LM with transformers' auto-built causal mask.
        self.bidirectional = True
        self.eval()

    def capture_features(self, enc: EncoderOutput) -> torch.Tensor:
        """`enc.cat_out`: HF hidden states at `encoder_layer_indices` (0 = input_linear output,
        k = 1-based block k, negative from the end) concatenated along channels."""
        return torch.cat([enc.hidden_states[i] for i in self.config.encoder_layer_indices], dim=-1)

    def bpe_hypothesis(self, bpe_logits: torch.Tensor) -> list[int]:
        """CTC-decode the BPE head into LLM token ids."""
        cfg = self.config
        ids = ctc_greedy_decode(bpe_logits[0], cfg.bpe_blank_channel)
        if cfg.bpe_output_dim == cfg.text.vocab_size + 1:
            ids = [i - 1 for i in ids]  # legacy layout: channel 0 is a synthetic blank
        return ids

    def decode_text(self, audio_embeds: torch.Tensor, n_audio: int, template: list[int]) -> torch.Tensor:
        """One LM pass over `cat(audio_embeds[:n_audio], embed_tokens(template))`; raw lm_head
        logits of the text positions, `[1, n_text, vocab]`."""
        lm = self.language_model
        text_emb = lm.model.embed_tokens(torch.tensor(template, dtype=torch.long)[None])
        flat = torch.cat([audio_embeds[:, :n_audio].to(text_emb.dtype), text_emb], dim=1)
        n_total = flat.shape[1]
        positions = torch.arange(n_total)[None]
        if self.bidirectional:
            # An explicit 4D additive mask is used as-is by transformers (masking_utils returns a 4D
            # mask unchanged), so every position attends to every position. Passing None instead
            # would make GraniteModel build a causal mask even with is_causal=False.
            mask = torch.zeros(1, 1, n_total, n_total, dtype=flat.dtype)
        else:
            mask = None
        hidden = lm.model(inputs_embeds=flat, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
        return lm.lm_head(hidden[:, n_audio:])

    @torch.no_grad()
    def forward(self, input_features: torch.Tensor, teacher_hypothesis: Sequence[int] | None = None) -> GraniteNarOutput:
        cfg = self.config
        enc = self.encoder(input_features)
        hypothesis = self.bpe_hypothesis(enc.bpe_logits)
        audio_embeds = self.projector(self.capture_features(enc))
        if cfg.scale_projected_embeddings:
            audio_embeds = audio_embeds / cfg.text.embedding_multiplier
        # The LM sees floor(T / downsample_rate) audio rows; the projector's zero-padded tail
        # tokens beyond that are dropped (port GraniteSpeechNarModel.forward, `audio_lengths`).
        n_audio = input_features.shape[1] // cfg.projector.downsample_rate
        text_ids = list(teacher_hypothesis) if teacher_hypothesis is not None else hypothesis
        template = add_insertion_slots(text_ids, cfg.blank_token_id, cfg.min_edit_sequence_length)
        text_logits = self.decode_text(audio_embeds, n_audio, template)
        tokens = ctc_greedy_decode(text_logits[0], cfg.blank_token_id)
        return GraniteNarOutput(tokens, hypothesis, template, text_logits, enc.bpe_logits, n_audio)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

_OPTIONAL_KEYS = ("language_model.lm_head.weight",)


def load_state_dict_strict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load with every key accounted for: missing, unexpected or mis-shaped keys are an error
    (the tied lm_head and BatchNorm's `num_batches_tracked` counters may be absent)."""
    own = model.state_dict()
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked") and k not in _OPTIONAL_KEYS]
    unexpected = [k for k in state if k not in own]
    shape = [f"{k}: file {list(v.shape)} != model {list(own[k].shape)}" for k, v in state.items() if k in own and v.shape != own[k].shape]
    if missing or unexpected or shape:
        raise GraniteNarInputError(
            "model.safetensors does not match the config: "
            + "; ".join(p for p in (f"missing {missing}" if missing else "", f"unexpected {unexpected}" if unexpected else "", f"shape {shape}" if shape else "") if p)
        )
    model.load_state_dict(state, strict=False)
    model.language_model.tie_weights()


def load_granite_nar(model_dir: str | Path, dtype: str = "float32") -> tuple[GraniteNARForConditionalGeneration, GraniteNarFrontend, dict]:
    """Model, frontend and raw config from a directory with config.json, model.safetensors and
    preprocessor_config.json. Safetensors only: nothing is unpickled, nothing is fetched."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    if dtype not in _DTYPES:
        raise GraniteNarInputError(f"dtype '{dtype}' not one of {sorted(_DTYPES)}")
    check_model_dir(model_dir, FAMILY, for_run=False)
    try:
        raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        pre = json.loads((model_dir / "preprocessor_config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise GraniteNarInputError(f"{model_dir}: config JSON does not parse: {e}") from e
    cfg = GraniteNarConfig.from_dict(raw)
    model = GraniteNARForConditionalGeneration(cfg)
    load_state_dict_strict(model, load_file(str(model_dir / "model.safetensors")))
    model.to(_DTYPES[dtype]).eval()
    return model, GraniteNarFrontend(pre), raw


def _tokenizer(model_dir: Path):
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def tool_versions() -> dict[str, str]:
    import tokenizers
    import torchaudio
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchaudio": torchaudio.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }


# --------------------------------------------------------------------------------------------
# Oracle entry point
# --------------------------------------------------------------------------------------------


def run_granite_nar(
    model_dir: str | Path,
    audio_path: str | Path,
    contract_json: str | dict,
    dtype: str = "float32",
    teacher_hypothesis: Sequence[int] | None = None,
    only: Sequence[str] | None = None,
    *,
    model: GraniteNARForConditionalGeneration | None = None,
    frontend: GraniteNarFrontend | None = None,
    samples=None,
    audio_sha256: str | None = None,
    ops=None,
) -> dict[str, Any]:
    """Run the reference on one clip and capture the contract's checkpoints.

    Returns `{"family", "tokens", "hypothesis", "template", "transcript", "checkpoints": [{"name",
    "step": 0, "layout", "array"}], "op_points": [same keys, firing order], "tools", "weights_sha256", "audio_sha256", "config"}` with
    C-contiguous arrays in the contract's canonical shapes (`recorder.Recorder`: float32, float64
    in a float64 run). `teacher_hypothesis` replaces the CTC hypothesis in the LM template (token
    ids); `hypothesis` stays the CTC one. `only` restricts capture to the named checkpoints
    (expanded names or templates, `recorder.select`). `model`/`frontend` reuse an already
    loaded model (tests); they must come from `model_dir`. `samples`/`audio_sha256`: 16 kHz mono
    float32 samples decoded and converted by the caller (`xray`) and the file's sha256;
    `audio_path` is then only named in messages. `ops`: op-level points (`xray_oracle.ops`; None,
    "all" or a list of point names), all at step 0 (one forward pass).
    """
    ops = parse_ops(ops)
    model_dir = Path(model_dir)
    if samples is not None:
        audio = _audio.from_samples(audio_path, samples, audio_sha256 or "").samples
        audio_sha = audio_sha256 or ""
    else:
        audio, audio_bytes = read_wav(audio_path)
        audio_sha = hashlib.sha256(audio_bytes).hexdigest()
    if model is None or frontend is None:
        model, frontend, raw_config = load_granite_nar(model_dir, dtype)
    else:
        raw_config = model.config.raw
    if teacher_hypothesis is not None:
        vocab = model.config.text.vocab_size
        bad = [t for t in teacher_hypothesis if not 0 <= int(t) < vocab]
        if bad:
            raise GraniteNarInputError(f"teacher_hypothesis: ids {bad} outside [0, {vocab})")
    resolved = load_resolved(contract_json, FAMILY)
    checkpoints = select(resolved, only)

    features = frontend(audio).to(next(model.parameters()).dtype)
    # Unknown modules are refused here, before the forward pass. The conformer attention pads its
    # input to whole context blocks; its points are cropped back to the encoder's frames.
    oprec = OpRecorder(model, ops, resolved, symbols=lambda: {"enc_frames": int(features.shape[1])})
    # One forward pass: every checkpoint at step 0; the symbols bind from the captured shapes.
    with Recorder(model, resolved, checkpoints) as rec, oprec:
        out = model(features, teacher_hypothesis=teacher_hypothesis)
    captured = rec.collect()
    op_points = oprec.points()

    tok = _tokenizer(model_dir)
    if tok is None:
        raise GraniteNarInputError(f"{model_dir / 'tokenizer.json'} is missing; {FIXES_TOKENIZER}")
    transcript = tok.decode(out.tokens, skip_special_tokens=True)
    return {
        "family": FAMILY,
        "tokens": out.tokens,
        "hypothesis": out.hypothesis,
        "template": out.template,
        "transcript": transcript,
        "checkpoints": captured,
        "op_points": op_points,
        "tools": tool_versions(),
        "weights_sha256": file_sha256(model_dir / "model.safetensors"),
        "audio_sha256": audio_sha,
        "samples_sha256": _audio.samples_sha256(audio),
        "config": raw_config,
    }


def run_reference(model_dir, audio_path, contract_json, *, dtype, max_new_tokens, teacher, only, threads,
                  samples, audio_sha256, ops, summarize, weights_variant) -> dict:
    """The family's entry for `xray_oracle.run` (arguments and capabilities already checked there:
    no stats-only capture, no reference variants; one non-autoregressive pass, so max_new_tokens
    does not apply)."""
    if summarize is not None or weights_variant is not None:
        raise OracleInputError("granite_nar: no stats-only capture and no reference variants (its descriptor)")
    if threads is not None:
        torch.set_num_threads(int(threads))
    return run_granite_nar(model_dir, audio_path, contract_json, dtype=dtype, teacher_hypothesis=teacher,
                           only=only, samples=samples, audio_sha256=audio_sha256, ops=ops)


def load_reference(d: Path, dtype: str):
    """For replay (`xray_oracle.replay.load_model`): (cache key, loader of the eval-mode model)."""
    st = (d / "model.safetensors").stat()
    return (str(d.resolve()), st.st_size, st.st_mtime_ns, dtype), lambda: load_granite_nar(d, dtype)[0]
