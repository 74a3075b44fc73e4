//! Audio input, decoded and converted ONCE here, and the same samples fed to the runtime and to
//! the reference (the oracle receives these f32 samples through pyo3, never the file).
//!
//! Reads WAV (PCM 8/16/24/32-bit integer or 32-bit float, plain or WAVE_FORMAT_EXTENSIBLE, any
//! channel count) with `hound`. Channels are down-mixed by their mean; a sample rate other than
//! the model's is converted with `rubato`'s synchronous FFT resampler (band-limited, f64). A
//! 16 kHz mono 16-bit file is read exactly as before (`i16 / 32768`) with no conversion. Every
//! step is recorded in [`Conversion`] (the dump manifests and evidence notes carry it).
//!
//! Untrusted input: the sample count the header claims is checked against the file size before
//! anything is allocated, unusual sample rates are refused (the resampler's FFT size grows with
//! the rate's prime factors), and every failure is a [`RuntimeError::Audio`] naming the file.

use std::path::{Path, PathBuf};

use rubato::audioadapter_buffers::owned::InterleavedOwned;
use rubato::{Fft, FixedSync, Resampler, WindowFunction};
use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};

/// Source sample rates the converter accepts (Hz).
pub const SUPPORTED_RATES: [u32; 13] = [
    8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 88200, 96000, 176400, 192000,
];

/// The resampler's input chunk (frames), one FFT block per chunk: a long block gives a sharp
/// anti-aliasing filter (cutoff near the lower Nyquist); the delay is trimmed for a whole clip.
const RESAMPLER_CHUNK: usize = 4096;

/// How a file became the model's samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversion {
    /// The file's sample rate (Hz).
    pub source_rate: u32,
    /// The file's channel count.
    pub source_channels: u16,
    /// The file's sample format (`pcm_s16`, `pcm_s24`, `float32`, ...; `extensible` noted).
    pub source_format: String,
    /// Down-mix applied (`none` or `mean of N channels`).
    pub downmix: String,
    /// Resampler and parameters, `None` when the file was already at the model's rate.
    pub resampler: Option<String>,
    /// sha256 of the converted samples (little-endian f32 bytes), what both engines were fed.
    pub samples_sha256: String,
}

impl Conversion {
    /// The conversion as JSON (dump manifests, evidence notes).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "source_rate": self.source_rate,
            "source_channels": self.source_channels,
            "source_format": self.source_format,
            "downmix": self.downmix,
            "resampler": self.resampler,
            "samples_sha256": self.samples_sha256,
        })
    }

    /// Whether the file needed no conversion at all (16-bit mono at the model's rate).
    pub fn is_identity(&self) -> bool {
        self.resampler.is_none() && self.source_channels == 1 && self.source_format == "pcm_s16"
    }
}

/// Decoded mono audio at the model's sample rate.
#[derive(Debug, Clone)]
pub struct Audio {
    /// Source file.
    pub path: PathBuf,
    /// Samples in [-1, 1] at `sample_rate`.
    pub samples: Vec<f32>,
    /// Sample rate in Hz (the model's).
    pub sample_rate: u32,
    /// sha256 of the file bytes.
    pub sha256: String,
    /// How the file was converted.
    pub conversion: Conversion,
}

impl Audio {
    /// Duration in seconds.
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }
}

fn aerr(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Audio {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// sha256 of f32 samples as little-endian bytes.
pub fn samples_sha256(samples: &[f32]) -> String {
    let mut h = Sha256::new();
    for s in samples {
        h.update(s.to_le_bytes());
    }
    hex::encode(h.finalize())
}

/// Read an audio file and convert it to mono at `target_rate` (the model's rate).
pub fn load_wav(path: &Path, target_rate: u32) -> Result<Audio> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(aerr(path, "is a directory, not an audio file"));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(aerr(path, "does not exist"));
        }
        _ => {}
    }
    let bytes = std::fs::read(path).map_err(|e| RuntimeError::io(path, e))?;
    decode_wav(path, &bytes, target_rate)
}

/// Decode WAV bytes (named `path` in errors) and convert to mono at `target_rate`.
pub fn decode_wav(path: &Path, bytes: &[u8], target_rate: u32) -> Result<Audio> {
    let sha256 = hex::encode(Sha256::digest(bytes));
    let reader = hound::WavReader::new(std::io::Cursor::new(bytes))
        .map_err(|e| aerr(path, format!("not a readable WAV file: {e}")))?;
    let spec = reader.spec();
    let channels = spec.channels;
    if channels == 0 {
        return Err(aerr(path, "the WAV header declares 0 channels"));
    }
    let format = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Int, b @ (8 | 16 | 24 | 32)) => format!("pcm_s{b}"),
        (hound::SampleFormat::Float, 32) => "float32".to_string(),
        (f, b) => {
            return Err(aerr(
                path,
                format!(
                    "{b}-bit {f:?} samples are not supported (PCM 8/16/24/32-bit or 32-bit float); \
                     convert: sox '{}' -b 16 out.wav",
                    path.display()
                ),
            ))
        }
    };
    if !SUPPORTED_RATES.contains(&spec.sample_rate) {
        return Err(aerr(
            path,
            format!(
                "sample rate {} Hz is not one X-Ray converts ({:?}); convert: sox '{}' -r {target_rate} out.wav",
                spec.sample_rate,
                SUPPORTED_RATES,
                path.display()
            ),
        ));
    }
    // The header's sample count must fit in the file before anything is allocated for it.
    let claimed = reader.len() as u64;
    let bytes_per_sample = u64::from(spec.bits_per_sample.div_ceil(8));
    if claimed.saturating_mul(bytes_per_sample) > bytes.len() as u64 {
        return Err(aerr(
            path,
            format!(
                "corrupt or truncated WAV file: the header claims {claimed} samples, the file holds {} bytes",
                bytes.len()
            ),
        ));
    }
    if claimed == 0 {
        return Err(aerr(path, "no samples"));
    }
    if !claimed.is_multiple_of(u64::from(channels)) {
        return Err(aerr(
            path,
            format!("corrupt WAV file: {claimed} samples are not a whole number of {channels}-channel frames"),
        ));
    }
    let n = claimed as usize;
    let mut interleaved: Vec<f32> = Vec::with_capacity(n);
    match spec.sample_format {
        hound::SampleFormat::Int => {
            let scale = (1u64 << (spec.bits_per_sample - 1)) as f64;
            for s in reader.into_samples::<i32>() {
                let v =
                    s.map_err(|e| aerr(path, format!("corrupt or truncated sample data: {e}")))?;
                interleaved.push((v as f64 / scale) as f32);
            }
        }
        hound::SampleFormat::Float => {
            for s in reader.into_samples::<f32>() {
                let v =
                    s.map_err(|e| aerr(path, format!("corrupt or truncated sample data: {e}")))?;
                if !v.is_finite() {
                    return Err(aerr(
                        path,
                        format!(
                            "non-finite float sample ({v}) at index {}",
                            interleaved.len()
                        ),
                    ));
                }
                interleaved.push(v);
            }
        }
    }
    if interleaved.len() != n {
        return Err(aerr(
            path,
            format!(
                "corrupt or truncated WAV file: the header claims {n} samples, the data chunk holds {}",
                interleaved.len()
            ),
        ));
    }
    let c = usize::from(channels);
    let mono: Vec<f32> = if c == 1 {
        interleaved
    } else {
        interleaved
            .chunks_exact(c)
            .map(|f| (f.iter().map(|&x| f64::from(x)).sum::<f64>() / c as f64) as f32)
            .collect()
    };
    let (samples, resampler) = if spec.sample_rate == target_rate {
        (mono, None)
    } else {
        let (s, desc) = resample(path, &mono, spec.sample_rate, target_rate)?;
        (s, Some(desc))
    };
    if samples.is_empty() {
        return Err(aerr(path, "no samples after conversion"));
    }
    let conversion = Conversion {
        source_rate: spec.sample_rate,
        source_channels: channels,
        source_format: format,
        downmix: if c == 1 {
            "none".into()
        } else {
            format!("mean of {c} channels")
        },
        resampler,
        samples_sha256: samples_sha256(&samples),
    };
    Ok(Audio {
        path: path.to_path_buf(),
        samples,
        sample_rate: target_rate,
        sha256,
        conversion,
    })
}

/// Band-limited resampling of a whole clip with rubato's synchronous FFT resampler (f64), the
/// start-up delay trimmed, `round(len * to / from)` output frames.
fn resample(path: &Path, mono: &[f32], from: u32, to: u32) -> Result<(Vec<f32>, String)> {
    let rerr = |e: String| aerr(path, format!("resampling {from} Hz -> {to} Hz: {e}"));
    let mut r = Fft::<f64>::new_custom(
        from as usize,
        to as usize,
        RESAMPLER_CHUNK,
        1,
        1,
        WindowFunction::BlackmanHarris2,
        FixedSync::Input,
    )
    .map_err(|e| rerr(e.to_string()))?;
    let input: Vec<f64> = mono.iter().map(|&x| f64::from(x)).collect();
    let n_in = input.len();
    let buf = InterleavedOwned::new_from(input, 1, n_in).map_err(|e| rerr(format!("{e:?}")))?;
    let out = r
        .process_all(&buf, n_in, None)
        .map_err(|e| rerr(e.to_string()))?;
    let want = ((n_in as u128 * to as u128 + from as u128 / 2) / from as u128) as usize;
    let mut data = out.take_data();
    data.truncate(want);
    let samples: Vec<f32> = data.into_iter().map(|x| x as f32).collect();
    let desc = format!(
        "rubato {} Fft<f64> (synchronous FFT, BlackmanHarris2 window, FixedSync::Input, chunk {RESAMPLER_CHUNK}, 1 sub-chunk, fft {} -> {}, cutoff {:.4} of the input Nyquist)",
        RUBATO_VERSION,
        r.fft_size_in(),
        r.fft_size_out(),
        r.cutoff()
    );
    Ok((samples, desc))
}

/// The rubato release this crate is built against (recorded in [`Conversion::resampler`]).
pub const RUBATO_VERSION: &str = "5.1";
