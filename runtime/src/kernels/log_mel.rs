//! Whisper's log-mel frontend as an op: 16 kHz pcm samples -> `[n_mels, frames]` channel-major;
//! and the pieces every log-mel frontend shares ([`MelStft`], [`linspace`],
//! [`triangular_filters`], [`hann_window`]), computed in f64.

use std::sync::Arc;

use realfft::RealFftPlanner;

use super::{data, dims, rank, tensor};
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, Shape, Tensor};
use crate::kernels::layout::ports;

/// Log-mel spectrogram exactly as `transformers.WhisperFeatureExtractor` defines it, computed in
/// f64 (the reference's numpy path) and rounded to f32 at the end:
/// zero-pad (or refuse if longer) to `n_samples`; STFT with `center=True` reflect padding, periodic
/// Hann window of `n_fft`, hop `hop_length`; drop the last frame; power spectrum; Slaney-scale,
/// Slaney-normalised mel filters over 0..8000 Hz; `log10(max(x, 1e-10))`; clamp to `max - 8`;
/// `(x + 4) / 4`.
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/feature_extraction_whisper.py
/// `WhisperFeatureExtractor.__call__`, `_np_extract_fbank_features`; src/transformers/audio_utils.py
/// `mel_filter_bank`, `spectrogram`.
#[derive(Clone)]
pub struct LogMel {
    n_fft: usize,
    hop: usize,
    n_samples: usize,
    n_mels: usize,
    sampling_rate: usize,
    stft: MelStft,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel")
            .field("n_fft", &self.n_fft)
            .field("hop", &self.hop)
            .field("n_samples", &self.n_samples)
            .field("n_mels", &self.n_mels)
            .finish()
    }
}

/// Upstream: transformers v5.24.0 src/transformers/audio_utils.py `hertz_to_mel` (mel_scale="slaney").
fn hertz_to_mel(f: f64) -> f64 {
    let logstep = 27.0 / 6.4f64.ln();
    if f >= 1000.0 {
        15.0 + (f / 1000.0).ln() * logstep
    } else {
        3.0 * f / 200.0
    }
}

/// Upstream: transformers v5.24.0 src/transformers/audio_utils.py `mel_to_hertz` (mel_scale="slaney").
fn mel_to_hertz(m: f64) -> f64 {
    let logstep = 6.4f64.ln() / 27.0;
    if m >= 15.0 {
        1000.0 * (logstep * (m - 15.0)).exp()
    } else {
        200.0 * m / 3.0
    }
}

/// `numpy.linspace(start, stop, num)` / `torch.linspace` (f64): `start + i * step`, the last one
/// exactly `stop`.
pub(crate) fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if let Some(l) = v.last_mut() {
        *l = stop;
    }
    v
}

/// The `[n_freq, n_mels]` triangular filters between consecutive `filter_freqs` (Hz, `n_mels + 2`
/// of them) at the FFT bin frequencies `fft_freqs`, unnormalised: `max(0, min(down, up))`.
///
/// Upstream: transformers v5.24.0 src/transformers/audio_utils.py `_create_triangular_filter_bank`;
/// torchaudio 2.11 `functional._create_triangular_fbank` (the same arithmetic).
pub(crate) fn triangular_filters(fft_freqs: &[f64], filter_freqs: &[f64]) -> Vec<Vec<f64>> {
    let n_mels = filter_freqs.len().saturating_sub(2);
    let diff: Vec<f64> = filter_freqs.windows(2).map(|w| w[1] - w[0]).collect();
    fft_freqs
        .iter()
        .map(|&f| {
            (0..n_mels)
                .map(|m| {
                    let down = -(filter_freqs[m] - f) / diff[m];
                    let up = (filter_freqs[m + 2] - f) / diff[m + 1];
                    0f64.max(down.min(up))
                })
                .collect()
        })
        .collect()
}

/// A periodic Hann window of `win_length` (`torch.hann_window(win_length, periodic=True)`,
/// `0.5 - 0.5 cos(2 pi n / N)`), centred in `n_fft` zeros as `torch.stft` pads it.
pub(crate) fn hann_window(win_length: usize, n_fft: usize) -> Vec<f64> {
    let win = win_length.min(n_fft);
    let left = (n_fft - win) / 2;
    let mut window = vec![0f64; n_fft];
    for n in 0..win {
        window[left + n] =
            0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / win_length as f64).cos();
    }
    window
}

/// The `[n_freq, n_mels]` Slaney mel filter bank (f64), as
/// `mel_filter_bank(1 + n_fft // 2, n_mels, 0.0, 8000.0, sr, norm="slaney", mel_scale="slaney")`.
///
/// Upstream: transformers v5.24.0 src/transformers/audio_utils.py `mel_filter_bank`,
/// `_create_triangular_filter_bank`.
pub fn mel_filter_bank(n_freq: usize, n_mels: usize, sampling_rate: usize) -> Vec<Vec<f64>> {
    let mel_min = hertz_to_mel(0.0);
    let mel_max = hertz_to_mel(8000.0);
    let filter_freqs: Vec<f64> = linspace(mel_min, mel_max, n_mels + 2)
        .into_iter()
        .map(mel_to_hertz)
        .collect();
    let fft_freqs = linspace(0.0, (sampling_rate / 2) as f64, n_freq);
    let mut fb = triangular_filters(&fft_freqs, &filter_freqs);
    for row in &mut fb {
        for (m, v) in row.iter_mut().enumerate() {
            let enorm = 2.0 / (filter_freqs[m + 2] - filter_freqs[m]);
            *v *= enorm;
        }
    }
    fb
}

/// Windowed power-spectrum mel energies in f64: an `n_fft` window, its real FFT plan, and the mel
/// filters kept sparse (per filter: its first nonzero frequency bin and the weights from there).
#[derive(Clone)]
pub(crate) struct MelStft {
    filters: Vec<(usize, Vec<f64>)>,
    window: Vec<f64>,
    fft: Arc<dyn realfft::RealToComplex<f64>>,
}

impl MelStft {
    /// For the `[n_fft / 2 + 1, n_mels]` filter bank `fb` and an `n_fft`-long `window`.
    pub(crate) fn new(fb: &[Vec<f64>], window: Vec<f64>) -> MelStft {
        let n_mels = fb.first().map_or(0, Vec::len);
        let filters = (0..n_mels)
            .map(|m| {
                let nz: Vec<usize> = (0..fb.len()).filter(|&f| fb[f][m] != 0.0).collect();
                match (nz.first(), nz.last()) {
                    (Some(&a), Some(&b)) => (a, (a..=b).map(|f| fb[f][m]).collect()),
                    _ => (0, Vec::new()),
                }
            })
            .collect();
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(window.len());
        MelStft {
            filters,
            window,
            fft,
        }
    }

    /// Mel energies of `frames` frames: frame `t`'s `n_fft` samples are `sample(t, j)`; each is
    /// windowed, transformed, squared to power (`re^2 + im^2`) and summed under each filter in
    /// bin order; `put(t, m, energy)` receives the result.
    pub(crate) fn energies(
        &self,
        frames: usize,
        sample: impl Fn(usize, usize) -> f64,
        mut put: impl FnMut(usize, usize, f64),
    ) -> Result<(), String> {
        let mut input = self.fft.make_input_vec();
        let mut spec = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0f64; spec.len()];
        for t in 0..frames {
            for (j, v) in input.iter_mut().enumerate() {
                *v = sample(t, j) * self.window[j];
            }
            self.fft
                .process_with_scratch(&mut input, &mut spec, &mut scratch)
                .map_err(|e| format!("fft: {e}"))?;
            for (p, c) in power.iter_mut().zip(&spec) {
                *p = c.re * c.re + c.im * c.im;
            }
            for (m, (f0, w)) in self.filters.iter().enumerate() {
                let mut acc = 0f64;
                for (i, wi) in w.iter().enumerate() {
                    acc += wi * power[f0 + i];
                }
                put(t, m, acc);
            }
        }
        Ok(())
    }
}

impl LogMel {
    /// A frontend for these preprocessor facts. `n_samples` must be a multiple of `hop`.
    pub fn new(
        n_fft: usize,
        hop: usize,
        n_samples: usize,
        n_mels: usize,
        sampling_rate: usize,
    ) -> Result<LogMel, String> {
        if n_fft < 2
            || hop == 0
            || n_samples == 0
            || n_mels == 0
            || !n_samples.is_multiple_of(hop)
            || n_samples <= n_fft / 2
        {
            return Err(format!(
                "log-mel geometry n_fft {n_fft}, hop {hop}, n_samples {n_samples}, n_mels {n_mels} is not usable"
            ));
        }
        let fb = mel_filter_bank(n_fft / 2 + 1, n_mels, sampling_rate);
        // Periodic Hann: 0.5 - 0.5 cos(2 pi n / N) (torch.hann_window / np.hanning(N + 1)[:-1]).
        let stft = MelStft::new(&fb, hann_window(n_fft, n_fft));
        Ok(LogMel {
            n_fft,
            hop,
            n_samples,
            n_mels,
            sampling_rate,
            stft,
        })
    }

    /// Output frames (`n_samples / hop`).
    pub fn frames(&self) -> usize {
        self.n_samples / self.hop
    }

    /// Compute the log-mel of `pcm` (at most `n_samples` samples), row-major `[n_mels, frames]`.
    pub fn compute(&self, pcm: &[f32]) -> Result<Vec<f32>, String> {
        if pcm.len() > self.n_samples {
            return Err(format!(
                "{} samples ({:.2} s) exceed the {}-sample window ({:.2} s); refusing to truncate",
                pcm.len(),
                pcm.len() as f64 / self.sampling_rate as f64,
                self.n_samples,
                self.n_samples as f64 / self.sampling_rate as f64
            ));
        }
        let (n_fft, hop) = (self.n_fft, self.hop);
        let half = n_fft / 2;
        let total = self.n_samples + 2 * half;
        // Zero-pad to n_samples, then reflect-pad n_fft / 2 on both sides (x[half..1], x[-2..]).
        let mut x = vec![0f64; total];
        for (i, &s) in pcm.iter().enumerate() {
            x[half + i] = s as f64;
        }
        for i in 0..half {
            x[half - 1 - i] = x[half + 1 + i];
            x[half + self.n_samples + i] = x[half + self.n_samples - 2 - i];
        }
        let frames = self.frames();
        let mut mel = vec![0f64; self.n_mels * frames];
        // The last STFT frame (index `frames`) is dropped, so it is never computed.
        self.stft.energies(
            frames,
            |t, j| x[t * hop + j],
            |t, m, e| mel[m * frames + t] = e,
        )?;
        let mut mx = f64::NEG_INFINITY;
        for v in mel.iter_mut() {
            *v = v.max(1e-10).log10();
            mx = mx.max(*v);
        }
        let floor = mx - 8.0;
        Ok(mel
            .iter()
            .map(|&v| ((v.max(floor) + 4.0) / 4.0) as f32)
            .collect())
    }
}

impl Kernel for LogMel {
    ports!("log_mel", [pcm: Plain] -> [mel: ChannelMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 1, "pcm")?;
        Ok(vec![vec![
            Dim::Fixed(self.n_mels),
            Dim::Fixed(self.frames()),
        ]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        dims(inputs[0], 1, "pcm")?;
        let mel = self.compute(data(inputs[0], "pcm")?)?;
        Ok(vec![tensor(&[self.n_mels, self.frames()], mel)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "n_fft": self.n_fft, "hop_length": self.hop, "n_samples": self.n_samples,
            "n_mels": self.n_mels, "sampling_rate": self.sampling_rate,
            "window": "hann_periodic", "center": true, "pad_mode": "reflect", "power": 2.0,
            "mel_scale": "slaney", "norm": "slaney", "f_min": 0.0, "f_max": 8000.0,
            "log": "log10(max(x, 1e-10)), max-8 clamp, (x+4)/4", "precision": "f64"
        })
    }
}
