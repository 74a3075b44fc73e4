//! What a reference run is asked for ([`OracleRequest`]): the oracle (`xray-oracle`) runs it,
//! and the reference cache (`xray check --reference-cache`) keys it by content, in an `xray`
//! built without Python too. Plain data: no Python, no model code.

use std::path::{Path, PathBuf};

use crate::contract::Contract;
use crate::ops::PointSelect;

/// One reference run request.
#[derive(Debug, Clone)]
pub struct OracleRequest {
    /// Family (`whisper`, `granite_nar`).
    pub family: String,
    /// HF model directory.
    pub model_dir: PathBuf,
    /// The audio file (named in messages; read by Python only when `samples` is `None`).
    pub audio: PathBuf,
    /// The decoded, converted 16 kHz mono samples (`xray_runtime::audio::load_wav`): the
    /// oracle is fed exactly what the runtime is fed and never decodes the file itself.
    pub samples: Option<Vec<f32>>,
    /// sha256 of the audio FILE bytes (with `samples`).
    pub audio_sha256: Option<String>,
    /// How the file became `samples` (recorded as `extra.audio` in the reference's dump).
    pub audio_conversion: Option<serde_json::Value>,
    /// The family's contract resolved against the model's config: Python receives its
    /// [`Contract::resolved_json`] and evaluates nothing; the captured shapes are checked
    /// against it (symbols and their relations) when the run returns.
    pub contract: Contract,
    /// `float32` (default) or `float64` (calibration).
    pub dtype: String,
    /// Cap on generated tokens.
    pub max_new_tokens: Option<usize>,
    /// Teacher forcing (granite: CTC hypothesis ids).
    pub teacher: Option<Vec<i64>>,
    /// Only these checkpoint globs.
    pub only: Option<Vec<String>>,
    /// torch thread count.
    pub threads: Option<usize>,
    /// Op-level points to capture besides the contract's checkpoints (`xray_core::ops`):
    /// [`PointSelect::None`] (default) captures none.
    pub ops: PointSelect,
    /// Summarize each checkpoint as it is captured ([`crate::dump::Stats::of`] and [`crate::dump::content_sha256`], the
    /// functions the runtime's `StatsRecorder` uses, called from Python through a Rust
    /// callable) and keep no tensor: the run's `summaries` instead of
    /// its `checkpoints`. Whisper only; float32 only; no op-level points.
    pub stats_only: bool,
    /// A reference variant (`xray_oracle.variants`: `int8`, `int8_conv`, `int8_w8a8`, `f16`,
    /// `bf16`): the HF model's weights on that grid, a counterfactual reference
    /// (`extra.reference_variant` in its dump says what was changed). `None`: the reference.
    pub weights_variant: Option<String>,
}

impl OracleRequest {
    /// Feed these already decoded and converted samples instead of the path: `file_sha256` is the
    /// sha256 of the audio FILE bytes, `conversion` how the file became these samples (both are
    /// recorded in the reference's dump).
    pub fn with_samples(
        mut self,
        samples: &[f32],
        file_sha256: &str,
        conversion: serde_json::Value,
    ) -> Self {
        self.samples = Some(samples.to_vec());
        self.audio_sha256 = Some(file_sha256.to_string());
        self.audio_conversion = Some(conversion);
        self
    }

    /// Capture these op-level points too: they follow the contract's checkpoints in
    /// the run's `checkpoints`, in firing order.
    pub fn with_ops(mut self, ops: PointSelect) -> Self {
        self.ops = ops;
        self
    }

    /// A float32 request with no options (the family is the contract's).
    pub fn new(model_dir: &Path, audio: &Path, contract: &Contract) -> Self {
        OracleRequest {
            family: contract.family.clone(),
            model_dir: model_dir.to_path_buf(),
            audio: audio.to_path_buf(),
            samples: None,
            audio_sha256: None,
            audio_conversion: None,
            contract: contract.clone(),
            dtype: "float32".into(),
            max_new_tokens: None,
            teacher: None,
            only: None,
            threads: None,
            ops: PointSelect::None,
            stats_only: false,
            weights_variant: None,
        }
    }
}
