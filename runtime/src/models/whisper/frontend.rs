//! Whisper frontend facts: preprocessor_config.json (HF names), its consistency with config.json,
//! the log-mel op built from it, and the audio checks made before a run (rate, duration).

use std::path::Path;

use serde::Deserialize;

use super::WhisperConfig;
use crate::audio::Audio;
use crate::error::Result;
use crate::kernels::LogMel;
use crate::models::common::{audio_err, cfg_err, check_sample_rate};

/// preprocessor_config.json of a `WhisperFeatureExtractor`. Field names are HF's.
#[derive(Debug, Clone, Deserialize)]
pub struct PreprocessorConfig {
    /// Mel bins.
    pub feature_size: usize,
    /// Sample rate in Hz.
    pub sampling_rate: usize,
    /// STFT hop.
    pub hop_length: usize,
    /// Window length in seconds.
    pub chunk_length: usize,
    /// FFT size.
    pub n_fft: usize,
    /// `chunk_length * sampling_rate` (HF recomputes it; when present it must agree).
    #[serde(default)]
    pub n_samples: Option<usize>,
    /// `n_samples / hop_length` (HF recomputes it; when present it must agree).
    #[serde(default)]
    pub nb_max_frames: Option<usize>,
    /// Padding sample value (HF default 0.0; only 0.0 is supported).
    #[serde(default)]
    pub padding_value: f64,
    /// Dither amplitude (HF default 0.0; nonzero is refused: it makes features random).
    #[serde(default)]
    pub dither: f64,
}

impl PreprocessorConfig {
    /// Samples per window.
    pub fn window_samples(&self) -> usize {
        self.chunk_length * self.sampling_rate
    }

    /// Fail-closed consistency with config.json: mel bins, window length vs the encoder's
    /// positions (`frames == 2 * max_source_positions`), declared derived values.
    pub fn check(&self, path: &Path, config: &WhisperConfig) -> Result<()> {
        let e = |r: String| Err(cfg_err(path, r));
        if self.feature_size != config.num_mel_bins {
            return e(format!(
                "feature_size {} != config.json num_mel_bins {}",
                self.feature_size, config.num_mel_bins
            ));
        }
        if self.hop_length == 0
            || self.n_fft < 2
            || self.sampling_rate == 0
            || self.chunk_length == 0
        {
            return e("hop_length, n_fft, sampling_rate and chunk_length must be positive".into());
        }
        let n = self.window_samples();
        if let Some(ns) = self.n_samples {
            if ns != n {
                return e(format!(
                    "n_samples {ns} != chunk_length {} * sampling_rate {} = {n}",
                    self.chunk_length, self.sampling_rate
                ));
            }
        }
        if !n.is_multiple_of(self.hop_length) {
            return e(format!(
                "window of {n} samples is not a multiple of hop_length {}",
                self.hop_length
            ));
        }
        let frames = n / self.hop_length;
        if let Some(f) = self.nb_max_frames {
            if f != frames {
                return e(format!(
                    "nb_max_frames {f} != n_samples {n} / hop_length {} = {frames}",
                    self.hop_length
                ));
            }
        }
        if frames != 2 * config.max_source_positions {
            return e(format!(
                "chunk_length {} s gives {frames} mel frames, but config.json max_source_positions {} needs {} \
                 (the encoder's stride-2 conv halves the frames into encoder positions)",
                self.chunk_length,
                config.max_source_positions,
                2 * config.max_source_positions
            ));
        }
        if self.padding_value != 0.0 {
            return e(format!(
                "padding_value {} is not supported (only 0.0)",
                self.padding_value
            ));
        }
        if self.dither != 0.0 {
            return e(format!(
                "dither {} is not supported: it makes the features random",
                self.dither
            ));
        }
        Ok(())
    }

    /// The log-mel op for this preprocessor.
    pub fn log_mel(&self, path: &Path) -> Result<LogMel> {
        LogMel::new(
            self.n_fft,
            self.hop_length,
            self.window_samples(),
            self.feature_size,
            self.sampling_rate,
        )
        .map_err(|r| cfg_err(path, r))
    }

    /// Refuse audio the frontend would get wrong: another sample rate (never silently resampled)
    /// or longer than one window (never silently truncated).
    pub fn check_audio(&self, audio: &Audio) -> Result<()> {
        let rate = self.sampling_rate;
        let resample = format!(
            " (resample: sox '{}' -r {rate} -c 1 -b 16 out.wav)",
            audio.path.display()
        );
        check_sample_rate(audio, rate, &resample)?;
        if audio.samples.len() > self.window_samples() {
            return Err(audio_err(
                audio,
                format!(
                    "{:.2} s of audio ({} samples); this model takes at most chunk_length = {} s ({} samples) per window. \
                     Long-form audio is not supported: cut it into windows (no silent truncation)",
                    audio.seconds(),
                    audio.samples.len(),
                    self.chunk_length,
                    self.window_samples()
                ),
            ));
        }
        Ok(())
    }
}
