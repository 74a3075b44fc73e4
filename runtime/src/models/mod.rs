//! Model families. Each family lives in its own folder (config + constants in `mod.rs`, graph
//! builder, frontend) and implements [`SpeechModel`], the only interface the harness uses.

pub mod granite_nar;
pub mod whisper;

use std::collections::BTreeMap;
use std::path::Path;

use crate::audio::Audio;
use crate::capture::{Observer, Substitute};
use crate::contract::Contract;
use crate::error::{Result, RuntimeError};
use crate::faults::FaultPlan;
use crate::graph::{Graph, Tensor};
use crate::weights::Weights;

/// Per-run hooks: capture, isolation, faults. All optional; none changes the spec.
#[derive(Default)]
pub struct RunHooks<'a> {
    /// Receives every checkpoint tensor.
    pub observer: Option<&'a mut dyn Observer>,
    /// Substitutes reference tensors at checkpoint edges (isolation).
    pub substitute: Option<&'a dyn Substitute>,
    /// Deliberate faults.
    pub faults: Option<&'a FaultPlan>,
}

/// Per-run options.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Cap on generated tokens (generative families).
    pub max_new_tokens: Option<usize>,
    /// Teacher forcing: the token sequence to feed (Whisper: the full decoder sequence including
    /// the forced prefix; Granite NAR: the CTC hypothesis ids).
    pub teacher_tokens: Option<Vec<i64>>,
}

/// What a run produced.
#[derive(Debug, Clone, Default)]
pub struct RunOutput {
    /// The token sequence that was fed/produced (Whisper: prefix + generated incl. EOS).
    pub tokens: Vec<i64>,
    /// The runtime's own choice at each position (Whisper: greedy argmax per step after
    /// suppression; equals `tokens[prefix..]` when not teacher-forced).
    pub predicted: Vec<i64>,
    /// Decoded text of `predicted` (the runtime's transcript).
    pub transcript: String,
    /// Final outputs for capture-neutrality checks (e.g. logits of every step), in order.
    pub outputs: Vec<Tensor>,
    /// Family-specific extras recorded in dumps/evidence (e.g. the CTC hypothesis).
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A loaded speech model: spec (graph), state (weights), contract.
pub trait SpeechModel {
    /// Family name (`whisper`, `granite_nar`).
    fn family(&self) -> &'static str;
    /// The model directory.
    fn model_dir(&self) -> &Path;
    /// The graph (spec).
    fn graph(&self) -> &Graph;
    /// The weight table (state).
    fn weights(&self) -> &Weights;
    /// The checkpoint contract resolved against this model's config.
    fn contract(&self) -> &Contract;
    /// Run on one input.
    fn run(&self, audio: &Audio, opts: &RunOptions, hooks: &mut RunHooks) -> Result<RunOutput>;
    /// Decode token ids to text.
    fn decode_text(&self, ids: &[i64]) -> Result<String>;
}

/// Detect the family of a model directory from its config.json.
pub fn detect_family(dir: &Path) -> Result<&'static str> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| RuntimeError::File {
        path: p.clone(),
        reason: format!(
            "{e} (is this a HF model directory? run `make fixtures` for the bundled ones)"
        ),
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| RuntimeError::Config {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    match v.get("model_type").and_then(|m| m.as_str()) {
        Some("whisper") => Ok("whisper"),
        Some("granite_speech_nar") | Some("nle_nar") | Some("granite_nar") => Ok("granite_nar"),
        Some(other) => Err(RuntimeError::Config {
            path: p,
            reason: format!("model_type '{other}' is not a supported family"),
        }),
        None => Err(RuntimeError::Config {
            path: p,
            reason: "no model_type".into(),
        }),
    }
}

/// Load any supported model directory.
pub fn load(dir: &Path) -> Result<Box<dyn SpeechModel>> {
    match detect_family(dir)? {
        "whisper" => Ok(Box::new(whisper::WhisperModel::load(dir)?)),
        "granite_nar" => Ok(Box::new(granite_nar::GraniteNarModel::load(dir)?)),
        _ => Err(RuntimeError::Config {
            path: dir.to_path_buf(),
            reason: "family not built yet".into(),
        }),
    }
}
