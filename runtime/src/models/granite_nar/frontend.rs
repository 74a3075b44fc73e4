//! Granite NAR frontend: preprocessor_config.json (HF names), the log-mel op (torchaudio
//! `MelSpectrogram` with the NAR framing and log10/clamp/normalise) and the 2-frame stack op.

use std::path::Path;

use serde::Deserialize;

use super::GraniteNarConfig;
use crate::audio::Audio;
use crate::error::{Result, RuntimeError};
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, Shape, Tensor};
use crate::kernels::layout::ports;
use crate::kernels::log_mel::{hann_window, linspace, triangular_filters, MelStft};
use crate::kernels::{data, dims, fixed, rank, tensor};
use crate::models::common::{audio_err, cfg_err, check_sample_rate};

fn default_fe_type() -> String {
    "GraniteSpeechNarFeatureExtractor".to_string()
}
fn default_sr() -> usize {
    16000
}
fn default_n_fft() -> usize {
    512
}
fn default_win() -> usize {
    400
}
fn default_hop() -> usize {
    160
}

/// preprocessor_config.json. Field names are HF's; defaults are `GraniteSpeechFeatureExtractor`'s
/// (the oracle applies the same ones).
#[derive(Debug, Clone, Deserialize)]
pub struct PreprocessorConfig {
    /// `GraniteSpeechNarFeatureExtractor` (default: NAR framing) or `GraniteSpeechFeatureExtractor`
    /// (transformers' AR framing).
    #[serde(default = "default_fe_type")]
    pub feature_extractor_type: String,
    /// Sample rate (only 16000).
    #[serde(default = "default_sr")]
    pub sampling_rate: usize,
    /// FFT size.
    #[serde(default = "default_n_fft")]
    pub n_fft: usize,
    /// Hann window length (zero-padded to n_fft, centred).
    #[serde(default = "default_win")]
    pub win_length: usize,
    /// STFT hop.
    #[serde(default = "default_hop")]
    pub hop_length: usize,
    /// Mel bins.
    #[serde(default)]
    pub n_mels: Option<usize>,
    /// Mel bins (the name `save_pretrained` writes).
    #[serde(default)]
    pub feature_size: Option<usize>,
}

/// How mel frames are kept and normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Framing {
    /// Keep the first `2 * (n // (2 * hop))` frames, then normalise over those (the hub model's
    /// `GraniteSpeechNarFeatureExtractor`).
    Nar,
    /// Normalise over all `n // hop + 1` frames, then drop the last one if the count is odd
    /// (transformers' AR `GraniteSpeechFeatureExtractor`).
    Ar,
}

impl PreprocessorConfig {
    /// Mel bins (`n_mels`, else `feature_size`, else 80).
    pub fn mel_bins(&self) -> usize {
        self.n_mels.or(self.feature_size).unwrap_or(80)
    }

    /// The framing selected by `feature_extractor_type`.
    pub fn framing(&self) -> Option<Framing> {
        match self.feature_extractor_type.as_str() {
            "GraniteSpeechNarFeatureExtractor" => Some(Framing::Nar),
            "GraniteSpeechFeatureExtractor" => Some(Framing::Ar),
            _ => None,
        }
    }

    /// Fewest samples the frontend accepts: one encoder frame, and more than `n_fft / 2` for the
    /// reflect padding.
    pub fn min_samples(&self) -> usize {
        (2 * self.hop_length).max(self.n_fft / 2 + 1)
    }

    /// Fail-closed consistency with config.json.
    pub fn check(&self, path: &Path, config: &GraniteNarConfig) -> Result<()> {
        let e = |r: String| Err(cfg_err(path, r));
        if self.framing().is_none() {
            return e(format!(
                "unsupported feature_extractor_type '{}'",
                self.feature_extractor_type
            ));
        }
        if self.sampling_rate != 16000 {
            return e(format!("sampling_rate {} != 16000", self.sampling_rate));
        }
        if self.hop_length == 0
            || self.n_fft < 2
            || self.win_length == 0
            || self.win_length > self.n_fft
        {
            return e(format!(
                "STFT geometry n_fft {}, win_length {}, hop_length {} is not usable",
                self.n_fft, self.win_length, self.hop_length
            ));
        }
        if 2 * self.mel_bins() != config.encoder_config.input_dim {
            return e(format!(
                "2 * n_mels ({}) != config.json encoder_config.input_dim {} (the encoder reads 2 stacked mel frames)",
                2 * self.mel_bins(),
                config.encoder_config.input_dim
            ));
        }
        Ok(())
    }

    /// Refuse audio the frontend cannot take (rate checked at load; length here).
    pub fn check_audio(&self, audio: &Audio) -> Result<()> {
        check_sample_rate(audio, self.sampling_rate, "")?;
        if audio.samples.len() < self.min_samples() {
            return Err(audio_err(
                audio,
                format!(
                    "{} samples; at least {} are needed for one encoder frame",
                    audio.samples.len(),
                    self.min_samples()
                ),
            ));
        }
        Ok(())
    }

    /// The log-mel op for this config.
    pub fn log_mel(&self) -> Result<GraniteLogMel> {
        let framing = self.framing().ok_or_else(|| RuntimeError::Config {
            path: "preprocessor_config.json".into(),
            reason: format!(
                "unsupported feature_extractor_type '{}'",
                self.feature_extractor_type
            ),
        })?;
        Ok(GraniteLogMel::new(
            self.n_fft,
            self.win_length,
            self.hop_length,
            self.mel_bins(),
            self.sampling_rate,
            framing,
        ))
    }
}

/// HTK mel scale. Upstream: torchaudio 2.11 `functional._hz_to_mel` (mel_scale="htk").
fn hz_to_mel(f: f64) -> f64 {
    2595.0 * (1.0 + f / 700.0).log10()
}

/// Upstream: torchaudio 2.11 `functional._mel_to_hz` (mel_scale="htk").
fn mel_to_hz(m: f64) -> f64 {
    700.0 * (10f64.powf(m / 2595.0) - 1.0)
}

/// The `[n_freq, n_mels]` HTK triangular filter bank without normalisation, f_min 0, f_max
/// `sample_rate // 2`.
///
/// Upstream: torchaudio 2.11 `functional.melscale_fbanks`, `_create_triangular_fbank`.
pub fn htk_filter_bank(n_freq: usize, n_mels: usize, sample_rate: usize) -> Vec<Vec<f64>> {
    let f_max = (sample_rate / 2) as f64;
    let all_freqs = linspace(0.0, f_max, n_freq);
    let m_pts = linspace(hz_to_mel(0.0), hz_to_mel(f_max), n_mels + 2);
    let f_pts: Vec<f64> = m_pts.into_iter().map(mel_to_hz).collect();
    triangular_filters(&all_freqs, &f_pts)
}

/// pcm `[samples]` -> normalised log-mel `[mel_frames, n_mels]` (token-major: one row per mel
/// frame), computed in f64 and rounded to f32 at the end:
/// torchaudio `MelSpectrogram(sample_rate, n_fft, win_length, hop_length, n_mels)` = periodic
/// Hann(win_length) zero-padded to n_fft (centred), `center=True` reflect padding by `n_fft / 2`,
/// power 2, HTK mel filters over 0..sr/2 without normalisation; then the framing
/// ([`Framing`]); `x = log10(max(mel, 1e-10))`; `x = max(x, max_all(x) - 8) / 4 + 1`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarFrontend.__call__` (NAR framing, port
/// `feature_extraction_granite_speech_nar.py` `_extract_features`); transformers v5.24.0
/// src/transformers/models/granite_speech/feature_extraction_granite_speech.py
/// `_extract_mel_spectrograms` (AR framing); torchaudio 2.11 `transforms.MelSpectrogram`.
#[derive(Clone)]
pub struct GraniteLogMel {
    n_fft: usize,
    win_length: usize,
    hop: usize,
    n_mels: usize,
    sample_rate: usize,
    framing: Framing,
    /// Hann(win_length) centred in n_fft, the HTK filters.
    stft: MelStft,
}

impl std::fmt::Debug for GraniteLogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraniteLogMel")
            .field("n_fft", &self.n_fft)
            .field("win_length", &self.win_length)
            .field("hop", &self.hop)
            .field("n_mels", &self.n_mels)
            .field("framing", &self.framing)
            .finish()
    }
}

impl GraniteLogMel {
    /// A log-mel op (geometry checked by [`PreprocessorConfig::check`]).
    pub fn new(
        n_fft: usize,
        win_length: usize,
        hop: usize,
        n_mels: usize,
        sample_rate: usize,
        framing: Framing,
    ) -> Self {
        let fb = htk_filter_bank(n_fft / 2 + 1, n_mels, sample_rate);
        // torch.hann_window(win_length, periodic=True), centred in n_fft by torch.stft.
        let stft = MelStft::new(&fb, hann_window(win_length, n_fft));
        GraniteLogMel {
            n_fft,
            win_length,
            hop,
            n_mels,
            sample_rate,
            framing,
            stft,
        }
    }

    /// Mel frames kept for `n` samples.
    pub fn kept_frames(&self, n: usize) -> usize {
        match self.framing {
            Framing::Nar => 2 * (n / (2 * self.hop)),
            Framing::Ar => {
                let all = n / self.hop + 1;
                all - all % 2
            }
        }
    }

    /// Compute `[kept_frames, n_mels]` row-major.
    pub fn compute(&self, pcm: &[f32]) -> std::result::Result<Vec<f32>, String> {
        let n = pcm.len();
        let half = self.n_fft / 2;
        if n <= half || n < 2 * self.hop {
            return Err(format!(
                "{n} samples: at least {} are needed",
                (half + 1).max(2 * self.hop)
            ));
        }
        let total_frames = n / self.hop + 1;
        let kept = self.kept_frames(n);
        // Frames the normalising max runs over.
        let norm_frames = match self.framing {
            Framing::Nar => kept,
            Framing::Ar => total_frames,
        };
        // Reflect padding: x[-i] = x[i], x[n - 1 + i] = x[n - 1 - i].
        let at = |i: isize| -> f64 {
            let n = n as isize;
            let j = if i < 0 {
                -i
            } else if i >= n {
                2 * (n - 1) - i
            } else {
                i
            };
            pcm[j as usize] as f64
        };
        let mut logmel = vec![0f64; norm_frames * self.n_mels];
        self.stft.energies(
            norm_frames,
            |f, k| at((f * self.hop) as isize - half as isize + k as isize),
            |f, m, e| logmel[f * self.n_mels + m] = e.max(1e-10).log10(),
        )?;
        let mx = logmel.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Ok(logmel[..kept * self.n_mels]
            .iter()
            .map(|&x| (x.max(mx - 8.0) / 4.0 + 1.0) as f32)
            .collect())
    }
}

impl Kernel for GraniteLogMel {
    ports!("granite_log_mel", [pcm: Plain] -> [mel: TokenMajor]);
    fn infer(
        &self,
        inputs: &[Shape],
        _weights: &[Vec<usize>],
    ) -> std::result::Result<Vec<Shape>, String> {
        rank(&inputs[0], 1, "pcm")?;
        Ok(vec![vec![Dim::sym("mel_frames"), Dim::Fixed(self.n_mels)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let n = dims(inputs[0], 1, "pcm")?[0];
        let v = self.compute(data(inputs[0], "pcm")?)?;
        tensor(&[self.kept_frames(n), self.n_mels], v).map(|t| vec![t])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "n_fft": self.n_fft, "win_length": self.win_length, "hop_length": self.hop, "n_mels": self.n_mels,
            "sample_rate": self.sample_rate, "mel_scale": "htk", "power": 2.0, "framing": self.framing,
        })
    }
}

/// `[mel_frames, n_mels]` -> `[mel_frames / 2, 2 * n_mels]`: encoder frame t = `[x[2t] | x[2t+1]]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarFrontend.__call__`
/// (`logmel.reshape(1, -1, 2 * n_mels)`).
#[derive(Debug, Clone, Default)]
pub struct StackFrames;

impl Kernel for StackFrames {
    ports!("stack_frames", [mel: TokenMajor] -> [y: TokenMajor]);
    fn infer(
        &self,
        inputs: &[Shape],
        _weights: &[Vec<usize>],
    ) -> std::result::Result<Vec<Shape>, String> {
        rank(&inputs[0], 2, "mel")?;
        let m = fixed(&inputs[0][1], "mel bins")?;
        Ok(vec![vec![Dim::sym("enc_frames"), Dim::Fixed(2 * m)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "mel")?;
        if s[0] % 2 != 0 {
            return Err(format!(
                "{} mel frames: the 2-frame stack needs an even count",
                s[0]
            ));
        }
        // Row-major [2t, m] and [t, 2m] are the same buffer.
        tensor(&[s[0] / 2, 2 * s[1]], data(inputs[0], "mel")?.to_vec()).map(|t| vec![t])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framings_keep_the_documented_frame_counts() {
        // fox.wav: 56503 samples -> NAR 176 encoder frames, AR 177 (docs/granite_nar.md).
        let nar = GraniteLogMel::new(512, 400, 160, 80, 16000, Framing::Nar);
        let ar = GraniteLogMel::new(512, 400, 160, 80, 16000, Framing::Ar);
        assert_eq!(nar.kept_frames(56503), 2 * 176);
        assert_eq!(ar.kept_frames(56503), 2 * 177);
        assert_eq!(nar.kept_frames(320), 2);
    }

    #[test]
    fn htk_filters_are_triangles_over_0_to_nyquist() {
        let fb = htk_filter_bank(257, 80, 16000);
        for m in 0..80 {
            let col: Vec<f64> = fb.iter().map(|r| r[m]).collect();
            let peak = col.iter().copied().fold(0f64, f64::max);
            assert!(peak > 0.0 && peak <= 1.0 + 1e-12, "filter {m} peak {peak}");
        }
        // DC and Nyquist sit on the outer triangle edges.
        assert!(fb[0][0].abs() < 1e-9 && fb[256][79].abs() < 1e-9);
    }
}
