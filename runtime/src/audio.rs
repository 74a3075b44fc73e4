//! WAV input. 16-bit PCM only, read as `i16 / 32768` exactly as the oracle reads it. Wrong sample
//! rates and channel counts are refused with the command that fixes them, never silently resampled.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};

/// Decoded mono audio.
#[derive(Debug, Clone)]
pub struct Audio {
    /// Source file.
    pub path: PathBuf,
    /// Samples in [-1, 1).
    pub samples: Vec<f32>,
    /// Sample rate in Hz.
    pub sample_rate: u32,
    /// sha256 of the file bytes.
    pub sha256: String,
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

/// Read a 16 kHz mono 16-bit PCM WAV file. `expected_rate` is the model's rate.
pub fn load_wav(path: &Path, expected_rate: u32) -> Result<Audio> {
    let bytes = std::fs::read(path).map_err(|e| RuntimeError::io(path, e))?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let reader = hound::WavReader::new(std::io::Cursor::new(&bytes))
        .map_err(|e| aerr(path, format!("not a readable WAV file: {e}")))?;
    let spec = reader.spec();
    let fix = format!(
        "sox '{}' -r {expected_rate} -c 1 -b 16 out.wav",
        path.display()
    );
    if spec.sample_format != hound::SampleFormat::Int || spec.bits_per_sample != 16 {
        return Err(aerr(
            path,
            format!(
                "{}-bit {:?} samples; 16-bit PCM required (convert: {fix})",
                spec.bits_per_sample, spec.sample_format
            ),
        ));
    }
    if spec.channels != 1 {
        return Err(aerr(
            path,
            format!("{} channels; mono required (convert: {fix})", spec.channels),
        ));
    }
    if spec.sample_rate != expected_rate {
        return Err(aerr(
            path,
            format!(
                "sample rate {} Hz; the model expects {expected_rate} Hz (resample: {fix})",
                spec.sample_rate
            ),
        ));
    }
    let samples = reader
        .into_samples::<i16>()
        .map(|s| s.map(|v| v as f32 / 32768.0))
        .collect::<std::result::Result<Vec<f32>, _>>()
        .map_err(|e| aerr(path, format!("corrupt or truncated sample data: {e}")))?;
    if samples.is_empty() {
        return Err(aerr(path, "no samples"));
    }
    Ok(Audio {
        path: path.to_path_buf(),
        samples,
        sample_rate: spec.sample_rate,
        sha256,
    })
}
