//! IBM Granite Speech NAR (`ibm-granite/granite-speech-4.1-2b-nar`): a Conformer CTC encoder with
//! a self-conditioned bypass and a BPE-CTC head, a windowed Q-Former projector, and a Granite LM
//! run once, bidirectionally, over `[audio prefix | insertion-slot template]` to edit the CTC
//! hypothesis. No autoregressive loop and no cache: every checkpoint is at step 0.
//!
//! Files: config structs with the hub config.json's field names verbatim and their fail-closed
//! checks (here), the frontend ([`frontend`]), granite-specific kernels ([`kernels`]), the graph
//! builder ([`graph`]), host logic (CTC decode, insertion slots: [`host`]) and the loaded model with
//! its two formulas ([`model`]).
//!
//! The PyTorch reference is `oracle/xray_oracle/granite_nar.py` (`GraniteNARForConditionalGeneration`,
//! `run_granite_nar`); docs/granite_nar.md lists where it departs from the forward map.
//!
//! ```no_run
//! use xray_runtime::models::{granite_nar::GraniteNarModel, RunHooks, RunOptions, SpeechModel};
//! # fn main() -> xray_runtime::Result<()> {
//! let model = GraniteNarModel::load(std::path::Path::new("fixtures/build/granite-nar-tiny"))?;
//! let audio = xray_runtime::audio::load_wav(std::path::Path::new("fixtures/audio/fox.wav"), 16000)?;
//! let out = model.run(&audio, &RunOptions::default(), &mut RunHooks::default())?;
//! println!("{} (hypothesis {:?})", out.transcript, out.extra["hypothesis"]);
//! # Ok(()) }
//! ```

pub mod faults;
pub mod frontend;
pub mod graph;
pub mod host;
pub mod kernels;
pub mod model;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::Result;
use crate::models::common::{
    cfg_err, check_layers, check_model_type, check_positive, config_facts, model_files,
};

pub use crate::models::common::TokenIds;
pub use frontend::PreprocessorConfig;
pub use model::GraniteNarModel;

/// The family's name: its contract (`core/contracts/granite_nar.json`), dumps and evidence.
pub const NAME: &str = "granite_nar";

/// The family's registration ([`crate::models::families`]).
pub const FAMILY: super::Registration = super::Registration {
    name: NAME,
    load: |dir| Ok(Box::new(GraniteNarModel::load(dir)?)),
    catalogue: faults::catalogue,
    alignment: super::Alignment::OnRequest {
        extra_key: "hypothesis",
    },
};

/// LayerNorm epsilon of every encoder LayerNorm (`nn.LayerNorm(hidden_dim)`, torch's default) and
/// of the conv module's BatchNorm (`nn.BatchNorm1d`, torch's default). Not in config.json.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// (`GraniteSpeechConformerFeedForward`, `GraniteSpeechConformerAttention`,
/// `GraniteSpeechConformerConvModule`, `GraniteSpeechConformerBlock`).
pub const ENCODER_NORM_EPS: f32 = 1e-5;

/// Added to the per-window importance sum of the BPE-CTC pooling.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `posterior_weighted_pool` (port
/// `_posterior_weighted_pool`).
pub const POOL_EPS: f32 = 1e-8;

fn default_bpe_window() -> usize {
    4
}
fn default_layer_indices() -> Vec<i64> {
    vec![4, 8, 12, -1]
}
fn default_min_edit() -> usize {
    8
}
fn default_true() -> bool {
    true
}
fn default_ln_eps() -> f64 {
    1e-6
}
fn default_one() -> f64 {
    1.0
}
fn default_silu() -> String {
    "silu".to_string()
}
fn default_max_pos() -> usize {
    2048
}
fn default_rope_theta() -> f64 {
    10000.0
}

/// `encoder_config` (transformers' `GraniteSpeechEncoderConfig` names plus the NAR fields).
/// Geometry has no default here: a missing geometry key is an error, never a guess (the oracle's
/// and the port's defaults disagree for `dim_head`).
#[derive(Debug, Clone, Deserialize)]
pub struct EncoderConfig {
    /// Encoder input features (`2 * n_mels`, the 2-frame stack).
    pub input_dim: usize,
    /// Conformer blocks.
    pub num_layers: usize,
    /// Hidden width.
    pub hidden_dim: usize,
    /// FF inner width = `hidden_dim * feedforward_mult`.
    pub feedforward_mult: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Head dim.
    pub dim_head: usize,
    /// Char-CTC vocabulary (blank = channel 0).
    pub output_dim: usize,
    /// Block size of the block-local attention.
    pub context_size: usize,
    /// Zero offset of the Shaw relative-position table (`2 * max_pos_emb + 1` rows).
    pub max_pos_emb: usize,
    /// Depthwise conv kernel.
    pub conv_kernel_size: usize,
    /// Conv inner width = `hidden_dim * conv_expansion_factor`.
    pub conv_expansion_factor: usize,
    /// 1-based block after which the self-conditioning bypass runs (default `num_layers // 2`).
    #[serde(default)]
    pub self_conditioning_layer: Option<usize>,
    /// BPE-CTC head width (default `text_config.vocab_size`; `vocab_size + 1` = legacy layout).
    #[serde(default)]
    pub bpe_output_dim: Option<usize>,
    /// Frames per pooled BPE-CTC frame.
    #[serde(default = "default_bpe_window")]
    pub bpe_pooling_window: usize,
}

/// `projector_config` (the native port's names).
#[derive(Debug, Clone, Deserialize)]
pub struct ProjectorConfig {
    /// Width of one captured encoder layer.
    pub encoder_dim: usize,
    /// LM hidden width.
    pub llm_dim: usize,
    /// Window rows per query.
    pub downsample_rate: usize,
    /// Captured encoder layers (`len(encoder_layer_indices)`).
    pub num_encoder_layers: usize,
    /// Projector width.
    pub hidden_size: usize,
    /// Cross-attention heads.
    pub num_heads: usize,
    /// Q-Former layers.
    pub num_layers: usize,
    /// Window rows.
    pub block_size: usize,
    /// MLP inner width = `int(hidden_size * mlp_ratio)`.
    pub mlp_ratio: f64,
    /// LayerNorm epsilon of the projector.
    #[serde(default = "default_ln_eps")]
    pub layernorm_eps: f64,
    /// Biases on q/k/v/o.
    #[serde(default = "default_true")]
    pub attn_bias: bool,
    /// Biases on fc1/fc2.
    #[serde(default = "default_true")]
    pub mlp_bias: bool,
}

/// `rope_parameters` (transformers v5) of the text config.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeParameters {
    /// RoPE base.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Only `default` is supported.
    #[serde(default)]
    pub rope_type: Option<String>,
}

/// `text_config`: a transformers `GraniteConfig`. Defaults are `GraniteConfig`'s where it has one
/// that does not fix the geometry.
#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    /// Vocabulary (tied embeddings / lm_head rows).
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (default = query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Only `silu`.
    #[serde(default = "default_silu")]
    pub hidden_act: String,
    /// Longest position (refused beyond).
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_ln_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base (legacy key).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// RoPE parameters (transformers v5 key).
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Legacy RoPE scaling (refused unless null).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// Biases on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on gate/up/down.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Input embeddings are multiplied by this.
    #[serde(default = "default_one")]
    pub embedding_multiplier: f64,
    /// Attention score scale (replaces `1 / sqrt(head_dim)`).
    #[serde(default = "default_one")]
    pub attention_multiplier: f64,
    /// Every residual branch is multiplied by this.
    #[serde(default = "default_one")]
    pub residual_multiplier: f64,
    /// Applied by `GraniteForCausalLM.forward` only; the NAR model calls `lm_head` directly, so
    /// it is read but not used.
    #[serde(default = "default_one")]
    pub logits_scaling: f64,
    /// Must be true (lm_head = embed_tokens).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// End of text (the default blank / insertion-slot filler).
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
}

/// config.json of a Granite Speech NAR checkpoint (the hub layout: three sections plus top-level
/// NAR fields; docs/granite_nar.md "config.json").
#[derive(Debug, Clone, Deserialize)]
pub struct GraniteNarConfig {
    /// `granite_speech_nar`.
    pub model_type: String,
    /// Encoder.
    pub encoder_config: EncoderConfig,
    /// Projector.
    pub projector_config: ProjectorConfig,
    /// LM.
    pub text_config: TextConfig,
    /// HF hidden-state indices concatenated for the projector (0 = input_linear output, k =
    /// 1-based block k, negative from the end).
    #[serde(default = "default_layer_indices")]
    pub encoder_layer_indices: Vec<i64>,
    /// CTC blank of the BPE head and of the final decode; the insertion-slot filler (default
    /// `text_config.eos_token_id`).
    #[serde(default)]
    pub blank_token_id: Option<i64>,
    /// Minimum template length.
    #[serde(default = "default_min_edit")]
    pub min_edit_sequence_length: usize,
    /// Divide the projector output by `embedding_multiplier` before the LM.
    #[serde(default = "default_true")]
    pub scale_projected_embeddings: bool,
}

/// Facts derived from the config once it passed [`GraniteNarConfig::check`].
#[derive(Debug, Clone)]
pub struct Derived {
    /// 1-based self-conditioning block.
    pub sc_layer: usize,
    /// BPE-CTC head width.
    pub bpe_output_dim: usize,
    /// BPE-CTC blank channel (`blank_token_id`, or 0 in the legacy `vocab + 1` layout).
    pub bpe_blank_channel: usize,
    /// Legacy layout: BPE channel c > 0 is LLM id c - 1.
    pub bpe_legacy: bool,
    /// Blank / insertion-slot filler id.
    pub blank_token_id: usize,
    /// `encoder_layer_indices` wrapped into `0..=num_layers`.
    pub captures: Vec<usize>,
    /// Queries per projector window.
    pub n_query: usize,
    /// Projector MLP inner width.
    pub proj_mlp: usize,
    /// LM key/value heads.
    pub kv_heads: usize,
    /// LM head dim.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
}

impl GraniteNarConfig {
    /// Fail-closed checks (the oracle's `GraniteNarConfig.validate` and the ones transformers
    /// makes at construction), returning the derived facts.
    pub fn check(&self, path: &Path) -> Result<Derived> {
        let e = |r: String| Err(cfg_err(path, r));
        let (enc, prj, txt) = (
            &self.encoder_config,
            &self.projector_config,
            &self.text_config,
        );
        check_model_type(path, &self.model_type, NAME)?;
        check_positive(
            path,
            &config_facts!(
                enc, "encoder_config"; input_dim, num_layers, hidden_dim, feedforward_mult,
                    num_heads, dim_head, output_dim, context_size, max_pos_emb, conv_kernel_size,
                    conv_expansion_factor, bpe_pooling_window;
                prj, "projector_config"; encoder_dim, llm_dim, downsample_rate,
                    num_encoder_layers, hidden_size, num_heads, num_layers, block_size;
                txt, "text_config"; vocab_size, hidden_size, intermediate_size,
                    num_hidden_layers, num_attention_heads, max_position_embeddings;
            ),
            "",
        )?;
        check_layers(
            path,
            &config_facts!(
                enc, "encoder_config"; num_layers;
                prj, "projector_config"; num_layers;
                txt, "text_config"; num_hidden_layers;
            ),
        )?;
        // GraniteSpeechConformerAttention.__init__ raises on this.
        if enc.context_size > enc.max_pos_emb {
            return e(format!(
                "encoder_config.context_size {} exceeds max_pos_emb {} (transformers refuses it)",
                enc.context_size, enc.max_pos_emb
            ));
        }
        let n = enc.num_layers;
        let sc_layer = enc.self_conditioning_layer.unwrap_or(n / 2);
        if !(1..=n).contains(&sc_layer) {
            return e(format!(
                "encoder_config.self_conditioning_layer {sc_layer} not in [1, {n}]"
            ));
        }
        let mut captures = Vec::with_capacity(self.encoder_layer_indices.len());
        for &i in &self.encoder_layer_indices {
            let wrapped = if i < 0 { i + n as i64 + 1 } else { i };
            if !(0..=n as i64).contains(&wrapped) {
                return e(format!(
                    "encoder_layer_indices element {i} out of range for {n} blocks"
                ));
            }
            captures.push(wrapped as usize);
        }
        // Facts the projector must agree on with the encoder and the LM.
        for (a, av, b, bv) in [
            (
                "projector_config.num_encoder_layers",
                prj.num_encoder_layers,
                "len(encoder_layer_indices)",
                captures.len(),
            ),
            (
                "projector_config.encoder_dim",
                prj.encoder_dim,
                "encoder hidden_dim",
                enc.hidden_dim,
            ),
            (
                "projector_config.llm_dim",
                prj.llm_dim,
                "text hidden_size",
                txt.hidden_size,
            ),
        ] {
            if av != bv {
                return e(format!("{a} {av} != {b} {bv}"));
            }
        }
        if prj.block_size % prj.downsample_rate != 0 {
            return e(format!(
                "projector_config.block_size {} is not a multiple of downsample_rate {}",
                prj.block_size, prj.downsample_rate
            ));
        }
        if prj.hidden_size % prj.num_heads != 0 {
            return e(format!(
                "projector_config.hidden_size {} does not split into {} heads",
                prj.hidden_size, prj.num_heads
            ));
        }
        if !(prj.mlp_ratio.is_finite() && prj.mlp_ratio > 0.0) {
            return e(format!(
                "projector_config.mlp_ratio {} must be positive",
                prj.mlp_ratio
            ));
        }
        let proj_mlp = (prj.hidden_size as f64 * prj.mlp_ratio) as usize;
        if proj_mlp == 0 {
            return e("projector_config: hidden_size * mlp_ratio rounds to 0".into());
        }
        if !(prj.layernorm_eps.is_finite() && prj.layernorm_eps > 0.0) {
            return e(format!(
                "projector_config.layernorm_eps {} must be positive",
                prj.layernorm_eps
            ));
        }
        if enc.input_dim % 2 != 0 {
            return e(format!(
                "encoder_config.input_dim {} is not 2 * n_mels (the 2-frame stack)",
                enc.input_dim
            ));
        }
        let bpe_output_dim = enc.bpe_output_dim.unwrap_or(txt.vocab_size);
        let bpe_legacy = bpe_output_dim == txt.vocab_size + 1;
        if bpe_output_dim != txt.vocab_size && !bpe_legacy {
            return e(format!(
                "encoder_config.bpe_output_dim {bpe_output_dim} must be text vocab_size {} (or vocab_size + 1, legacy)",
                txt.vocab_size
            ));
        }
        let blank = match (self.blank_token_id, &txt.eos_token_id) {
            (Some(b), _) => b,
            (None, Some(TokenIds::One(b))) => *b,
            _ => {
                return e(
                    "blank_token_id (or a single text_config.eos_token_id) is required".into(),
                )
            }
        };
        if !(0..txt.vocab_size as i64).contains(&blank) {
            return e(format!(
                "blank_token_id {blank} outside the text vocabulary 0..{}",
                txt.vocab_size
            ));
        }
        let blank_token_id = blank as usize;
        if !txt.tie_word_embeddings {
            return e("text_config.tie_word_embeddings must be true (the NAR lm_head is the tied embedding)".into());
        }
        if txt.hidden_act != "silu" {
            return e(format!(
                "text_config.hidden_act '{}' is not supported (only 'silu')",
                txt.hidden_act
            ));
        }
        let heads = txt.num_attention_heads;
        let kv_heads = txt.num_key_value_heads.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return e(format!(
                "text_config.num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            ));
        }
        let head_dim = txt.hidden_size / heads;
        if head_dim * heads != txt.hidden_size || head_dim % 2 != 0 {
            return e(format!(
                "text_config.hidden_size {} does not split into {heads} heads of an even head_dim (RoPE rotates halves)",
                txt.hidden_size
            ));
        }
        if txt.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return e("text_config.rope_scaling is not supported (only default RoPE)".into());
        }
        let mut rope_theta = txt.rope_theta;
        if let Some(p) = &txt.rope_parameters {
            if p.rope_type.as_deref().is_some_and(|t| t != "default") {
                return e(format!(
                    "text_config.rope_parameters.rope_type {:?} is not supported (only 'default')",
                    p.rope_type
                ));
            }
            rope_theta = rope_theta.or(p.rope_theta);
        }
        let rope_theta = rope_theta.unwrap_or_else(default_rope_theta);
        for (name, v) in [
            ("text_config.rms_norm_eps", txt.rms_norm_eps),
            ("text_config.embedding_multiplier", txt.embedding_multiplier),
            ("text_config.attention_multiplier", txt.attention_multiplier),
            ("rope_theta", rope_theta),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return e(format!("{name} must be a positive number, got {v}"));
            }
        }
        if !txt.residual_multiplier.is_finite() {
            return e("text_config.residual_multiplier must be finite".into());
        }
        Ok(Derived {
            sc_layer,
            bpe_output_dim,
            bpe_blank_channel: if bpe_legacy { 0 } else { blank_token_id },
            bpe_legacy,
            blank_token_id,
            captures,
            n_query: prj.block_size / prj.downsample_rate,
            proj_mlp,
            kv_heads,
            head_dim,
            rope_theta,
        })
    }
}

/// Paths of a Granite Speech NAR model directory.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// config.json
    pub config: PathBuf,
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
        let [config, preprocessor, weights, tokenizer] = model_files(
            dir,
            "a Granite Speech NAR directory",
            [
                "config.json",
                "preprocessor_config.json",
                "model.safetensors",
                "tokenizer.json",
            ],
        )?;
        Ok(ModelFiles {
            config,
            preprocessor,
            weights,
            tokenizer,
        })
    }
}
