//! Whisper (HF `WhisperForConditionalGeneration`): config structs with HF field names verbatim,
//! their fail-closed sanity checks, the graph builder ([`graph`]), the frontend facts
//! ([`frontend`]), the model and its formulas ([`model`]) and greedy decoding ([`decode`]).
//!
//! ```no_run
//! use xray_runtime::models::{whisper::WhisperModel, RunHooks, RunOptions, SpeechModel};
//! use xray_runtime::capture::Recorder;
//! # fn main() -> xray_runtime::Result<()> {
//! let model = WhisperModel::load(std::path::Path::new("fixtures/whisper-tiny-en"))?;
//! let audio = xray_runtime::audio::load_wav(std::path::Path::new("fixtures/audio/fox.wav"), 16000)?;
//! let mut rec = Recorder::new();
//! let out = model.run(&audio, &RunOptions::default(), &mut RunHooks { observer: Some(&mut rec), ..Default::default() })?;
//! println!("{} ({} checkpoints)", out.transcript, rec.captured.len());
//! # Ok(()) }
//! ```

pub mod decode;
pub mod faults;
pub mod frontend;
pub mod graph;
pub mod model;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::Result;
use crate::models::common::{
    cfg_err, check_layers, check_model_type, check_positive, config_facts, model_files,
};

pub use crate::models::common::TokenIds;
pub use decode::DecoderSession;
pub use frontend::PreprocessorConfig;
pub use model::WhisperModel;

/// The family's name: its contract (`core/contracts/whisper.json`), dumps and evidence.
pub const NAME: &str = "whisper";

/// The family's registration ([`crate::models::families`]).
pub const FAMILY: super::Registration = super::Registration {
    name: NAME,
    load: |dir| Ok(Box::new(WhisperModel::load(dir)?)),
    catalogue: faults::catalogue,
    alignment: super::Alignment::ReferenceTokens,
};

/// LayerNorm epsilon of every Whisper LayerNorm (`nn.LayerNorm(d)`, torch's default; not in
/// config.json).
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// (`nn.LayerNorm(self.embed_dim)`).
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// `max_length` when generation_config.json has none (`transformers.GenerationConfig` default).
pub const HF_DEFAULT_MAX_LENGTH: usize = 20;

fn default_activation() -> String {
    "gelu".to_string()
}

fn default_true() -> bool {
    true
}

/// config.json of a Whisper checkpoint. Field names are HF's. Geometry has no default here: a
/// missing geometry key is an error, never a guess. Defaults only where HF's WhisperConfig has one
/// that does not change the geometry.
#[derive(Debug, Clone, Deserialize)]
pub struct WhisperConfig {
    /// Must be `whisper`.
    pub model_type: String,
    /// Hidden size.
    pub d_model: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Encoder attention heads.
    pub encoder_attention_heads: usize,
    /// Decoder attention heads.
    pub decoder_attention_heads: usize,
    /// Encoder MLP width.
    pub encoder_ffn_dim: usize,
    /// Decoder MLP width.
    pub decoder_ffn_dim: usize,
    /// Mel bins of the input features.
    pub num_mel_bins: usize,
    /// Encoder positions (= encoder memory length, half the mel frames).
    pub max_source_positions: usize,
    /// Decoder positions (longest decoder sequence).
    pub max_target_positions: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Activation (HF default `gelu`; the only one supported).
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// Multiply decoder token embeddings by sqrt(d_model) (HF default false; true is refused).
    #[serde(default)]
    pub scale_embedding: bool,
    /// proj_out shares model.decoder.embed_tokens.weight (HF default true).
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Legacy forced ids in config.json (used by HF when generation_config.json has none).
    #[serde(default)]
    pub forced_decoder_ids: Option<Vec<(usize, Option<i64>)>>,
}

/// generation_config.json, the fields greedy decoding follows. HF names verbatim.
#[derive(Debug, Clone, Deserialize)]
pub struct GenerationConfig {
    /// First decoder token (<|startoftranscript|>).
    pub decoder_start_token_id: i64,
    /// End of text.
    pub eos_token_id: TokenIds,
    /// Legacy forced prefix `[[position, id], ...]`.
    #[serde(default)]
    pub forced_decoder_ids: Option<Vec<(usize, Option<i64>)>>,
    /// Suppressed at every step.
    #[serde(default)]
    pub suppress_tokens: Option<Vec<i64>>,
    /// Suppressed at the first generated position.
    #[serde(default)]
    pub begin_suppress_tokens: Option<Vec<i64>>,
    /// Generated-token budget (HF adds the prefix length, capped by max_target_positions).
    #[serde(default)]
    pub max_length: Option<usize>,
    /// `<|notimestamps|>`.
    #[serde(default)]
    pub no_timestamps_token_id: Option<i64>,
    /// Timestamp prediction (refused when true).
    #[serde(default)]
    pub return_timestamps: Option<bool>,
    /// Multilingual checkpoint.
    #[serde(default)]
    pub is_multilingual: Option<bool>,
    /// Forced language (`en`, `<|en|>`).
    #[serde(default)]
    pub language: Option<String>,
    /// Forced task (`transcribe`, `translate`).
    #[serde(default)]
    pub task: Option<String>,
    /// Language token ids.
    #[serde(default)]
    pub lang_to_id: Option<BTreeMap<String, i64>>,
    /// Task token ids.
    #[serde(default)]
    pub task_to_id: Option<BTreeMap<String, i64>>,
    /// Sampling (refused when true).
    #[serde(default)]
    pub do_sample: Option<bool>,
    /// Beams (refused when > 1).
    #[serde(default)]
    pub num_beams: Option<usize>,
}

impl WhisperConfig {
    /// Fail-closed geometry checks (the ones HF makes and the ones it would only hit later).
    pub fn check(&self, path: &Path) -> Result<()> {
        let e = |r: String| Err(cfg_err(path, r));
        check_model_type(path, &self.model_type, NAME)?;
        check_positive(
            path,
            &config_facts!(self; d_model, encoder_layers, decoder_layers, encoder_attention_heads,
                decoder_attention_heads, encoder_ffn_dim, decoder_ffn_dim, num_mel_bins,
                max_source_positions, max_target_positions, vocab_size),
            " (an encoder-decoder graph needs every geometry fact)",
        )?;
        check_layers(path, &config_facts!(self; encoder_layers, decoder_layers))?;
        for (name, h) in [
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
        ] {
            let hd = self.d_model / h;
            if hd * h != self.d_model {
                return e(format!(
                    "{name} ({h}) * head_dim ({hd}) != d_model ({}): d_model must split evenly into heads",
                    self.d_model
                ));
            }
        }
        if self.activation_function != "gelu" {
            return e(format!(
                "activation_function '{}' is not supported (only 'gelu', exact erf)",
                self.activation_function
            ));
        }
        if self.scale_embedding {
            return e(
                "scale_embedding = true is not supported (no Whisper checkpoint uses it)".into(),
            );
        }
        Ok(())
    }

    /// Decoder head dim.
    pub fn decoder_head_dim(&self) -> usize {
        self.d_model / self.decoder_attention_heads
    }

    /// Encoder head dim.
    pub fn encoder_head_dim(&self) -> usize {
        self.d_model / self.encoder_attention_heads
    }
}

/// Paths of a Whisper model directory.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// config.json
    pub config: PathBuf,
    /// generation_config.json
    pub generation: PathBuf,
    /// preprocessor_config.json
    pub preprocessor: PathBuf,
    /// model.safetensors
    pub weights: PathBuf,
    /// tokenizer.json
    pub tokenizer: PathBuf,
}

impl ModelFiles {
    /// The files of `dir`; each must exist.
    pub fn of(dir: &Path) -> Result<ModelFiles> {
        let [config, generation, preprocessor, weights, tokenizer] = model_files(
            dir,
            "a Whisper directory",
            [
                "config.json",
                "generation_config.json",
                "preprocessor_config.json",
                "model.safetensors",
                "tokenizer.json",
            ],
        )?;
        Ok(ModelFiles {
            config,
            generation,
            preprocessor,
            weights,
            tokenizer,
        })
    }
}
