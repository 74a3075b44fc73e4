//! The mel filter bank of the checkpoint's HF feature extractor, computed at run time from
//! `preprocessor_config.json` exactly as transformers 5.24 `WhisperFeatureExtractor.__init__`
//! does: `mel_filter_bank(num_frequency_bins = 1 + n_fft // 2, num_mel_filters = feature_size,
//! min_frequency = 0.0, max_frequency = 8000.0, sampling_rate, norm = "slaney",
//! mel_scale = "slaney")` (`audio_utils.py`), in f64, then narrowed to f32 as the extractor's torch
//! path does (`torch.from_numpy(self.mel_filters).to(torch.float32)`).
//!
//! candle's Whisper example ships its filter bank as precomputed bytes; this engine takes the
//! bank of the checkpoint's own feature extractor instead, so a difference in the log-mel is
//! candle's spectrogram, not a different bank. The test `hf_bank_matches_transformers` checks the
//! result against transformers' own array.

use crate::Error;

/// transformers hard-codes this upper edge for Whisper (`max_frequency=8000.0`).
pub const MAX_FREQUENCY: f64 = 8000.0;

fn hertz_to_mel_slaney(freq: f64) -> f64 {
    let min_log_hertz = 1000.0;
    let min_log_mel = 15.0;
    let logstep = 27.0 / 6.4f64.ln();
    if freq >= min_log_hertz {
        min_log_mel + (freq / min_log_hertz).ln() * logstep
    } else {
        3.0 * freq / 200.0
    }
}

fn mel_to_hertz_slaney(mel: f64) -> f64 {
    let min_log_hertz = 1000.0;
    let min_log_mel = 15.0;
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        min_log_hertz * (logstep * (mel - min_log_mel)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

/// `np.linspace(start, stop, num)` (endpoint included), element for element: `i * step + start`,
/// the last element set to `stop`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if let Some(last) = v.last_mut() {
        *last = stop;
    }
    v
}

/// The Slaney-normalised triangular filter bank, f64, shape `[num_frequency_bins,
/// num_mel_filters]` row-major (transformers' orientation).
pub fn mel_filter_bank_f64(
    num_frequency_bins: usize,
    num_mel_filters: usize,
    min_frequency: f64,
    max_frequency: f64,
    sampling_rate: usize,
) -> Result<Vec<f64>, Error> {
    if num_frequency_bins < 2 {
        return Err(Error::Input(format!(
            "mel filter bank: num_frequency_bins {num_frequency_bins} < 2"
        )));
    }
    if num_mel_filters == 0 || min_frequency > max_frequency {
        return Err(Error::Input(format!(
            "mel filter bank: {num_mel_filters} filters from {min_frequency} to {max_frequency} Hz"
        )));
    }
    let mel_freqs = linspace(
        hertz_to_mel_slaney(min_frequency),
        hertz_to_mel_slaney(max_frequency),
        num_mel_filters + 2,
    );
    let filter_freqs: Vec<f64> = mel_freqs.iter().map(|&m| mel_to_hertz_slaney(m)).collect();
    // `sampling_rate // 2` is an integer division in transformers.
    let fft_freqs = linspace(0.0, (sampling_rate / 2) as f64, num_frequency_bins);
    let diff: Vec<f64> = filter_freqs.windows(2).map(|w| w[1] - w[0]).collect();
    let mut bank = vec![0f64; num_frequency_bins * num_mel_filters];
    for (f, &fft) in fft_freqs.iter().enumerate() {
        for m in 0..num_mel_filters {
            let down = -(filter_freqs[m] - fft) / diff[m];
            let up = (filter_freqs[m + 2] - fft) / diff[m + 1];
            let v = 0f64.max(down.min(up));
            let enorm = 2.0 / (filter_freqs[m + 2] - filter_freqs[m]);
            bank[f * num_mel_filters + m] = v * enorm;
        }
    }
    for m in 0..num_mel_filters {
        if (0..num_frequency_bins).all(|f| bank[f * num_mel_filters + m] == 0.0) {
            return Err(Error::Input(format!(
                "mel filter bank: filter {m} of {num_mel_filters} is all zero (feature_size too high for n_fft)"
            )));
        }
    }
    Ok(bank)
}

/// The bank in candle's orientation: f32 `[num_mel_filters, num_frequency_bins]` row-major
/// (`filters[j * n_fft_bins + k]`, what `pcm_to_mel` reads).
pub fn candle_filters(
    n_fft: usize,
    num_mel_filters: usize,
    sampling_rate: usize,
) -> Result<Vec<f32>, Error> {
    let bins = 1 + n_fft / 2;
    let bank = mel_filter_bank_f64(bins, num_mel_filters, 0.0, MAX_FREQUENCY, sampling_rate)?;
    let mut out = vec![0f32; bins * num_mel_filters];
    for f in 0..bins {
        for m in 0..num_mel_filters {
            out[m * bins + f] = bank[f * num_mel_filters + m] as f32;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_scale_round_trips_and_is_linear_below_1khz() {
        for f in [0.0, 200.0, 999.0, 1000.0, 4321.0, 8000.0] {
            let back = mel_to_hertz_slaney(hertz_to_mel_slaney(f));
            assert!((back - f).abs() < 1e-9 * f.max(1.0), "{f} -> {back}");
        }
        assert!((hertz_to_mel_slaney(600.0) - 9.0).abs() < 1e-12);
    }

    #[test]
    fn linspace_ends_exactly() {
        let v = linspace(0.0, 8000.0, 201);
        assert_eq!(v[0], 0.0);
        assert_eq!(v[200], 8000.0);
        assert_eq!(v[1], 40.0);
    }

    #[test]
    fn too_many_filters_fail_closed() {
        assert!(candle_filters(16, 80, 16000).is_err());
    }
}
