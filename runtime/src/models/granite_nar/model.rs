//! The loaded Granite NAR model (spec + state + contract + tokenizer) and its two formulas on the
//! one graph: `encode` (pcm -> every `enc.*` checkpoint, `enc.cat_out`, `enc.ctc_bpe_logits`) and
//! `edit` (`enc.cat_out` + template ids -> every `proj.*` / `dec.*` checkpoint, `dec.text_logits`).
//! Between them the host CTC-decodes the BPE head (or takes a teacher hypothesis) and builds the
//! insertion-slot template, whose length is data-dependent.
//!
//! Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.forward`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ndarray::Array1;

use super::graph::{self as ggraph, names, GraniteEdges};
use super::host::{add_insertion_slots, ctc_greedy_decode};
use super::{Derived, GraniteNarConfig, ModelFiles, PreprocessorConfig};
use crate::audio::Audio;
use crate::error::{Result, RuntimeError};
use crate::graph::{Feeds, RunCtx, Tensor};
use crate::models::common::{next_output, pcm_feeds, read_json, Tokenizer};
use crate::models::{Loaded, RunHooks, RunOptions, RunOutput, SpeechModel};
use crate::weights::Weights;

/// A loaded Granite Speech NAR checkpoint.
pub struct GraniteNarModel {
    loaded: Loaded,
    config: GraniteNarConfig,
    derived: Derived,
    preprocessor: PreprocessorConfig,
    edges: GraniteEdges,
    tokenizer: Tokenizer,
}

impl std::fmt::Debug for GraniteNarModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraniteNarModel")
            .field("dir", &self.loaded.dir)
            .field("config", &self.config)
            .finish()
    }
}

/// What the `encode` formula returns.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// `enc.cat_out` `[enc_frames, cat_dim]` (the `edit` formula's feed).
    pub cat_out: Tensor,
    /// `enc.ctc_bpe_logits` `[bpe_frames, bpe_vocab]`.
    pub bpe_logits: Tensor,
}

fn take2(v: Vec<Tensor>) -> Result<(Tensor, Tensor)> {
    let mut it = v.into_iter();
    Ok((next_output(&mut it)?, next_output(&mut it)?))
}

impl GraniteNarModel {
    /// Load a Granite Speech NAR directory: config.json (checked, fail closed),
    /// preprocessor_config.json (consistent with it), the graph built from them, model.safetensors
    /// checked against the graph (missing, mismatched and unused keys are errors), the checkpoint
    /// contract checked against the graph, tokenizer.json.
    pub fn load(dir: &Path) -> Result<GraniteNarModel> {
        let files = ModelFiles::of(dir)?;
        let (config, config_json): (GraniteNarConfig, _) = read_json(&files.config)?;
        let derived = config.check(&files.config)?;
        let (preprocessor, _): (PreprocessorConfig, _) = read_json(&files.preprocessor)?;
        preprocessor.check(&files.preprocessor, &config)?;
        let (graph, edges) = ggraph::build(&config, &derived, &preprocessor)?;
        let weights = Weights::load(&files.weights)?;
        let loaded = Loaded::check(dir, super::NAME, graph, weights, &config_json)?;
        let tokenizer = Tokenizer::load(&files.tokenizer)?;
        Ok(GraniteNarModel {
            loaded,
            config,
            derived,
            preprocessor,
            edges,
            tokenizer,
        })
    }

    /// config.json.
    pub fn config(&self) -> &GraniteNarConfig {
        &self.config
    }

    /// Facts derived from config.json (bypass layer, captures, blank, ...).
    pub fn derived(&self) -> &Derived {
        &self.derived
    }

    /// preprocessor_config.json.
    pub fn preprocessor(&self) -> &PreprocessorConfig {
        &self.preprocessor
    }

    /// Feed/output edge ids.
    pub fn edges(&self) -> &GraniteEdges {
        &self.edges
    }

    /// Formula `encode`: pcm samples -> capture concat and BPE-CTC logits (every `enc.*`
    /// checkpoint is produced on the way).
    pub fn encode(&self, pcm: &[f32], ctx: &mut RunCtx) -> Result<Encoded> {
        let feeds = pcm_feeds(names::PCM, pcm);
        let (cat_out, bpe_logits) = take2(self.loaded.run(
            feeds,
            &[self.edges.cat_out, self.edges.bpe_logits],
            ctx,
        )?)?;
        Ok(Encoded {
            cat_out,
            bpe_logits,
        })
    }

    /// The runtime's own hypothesis: CTC greedy decode of the BPE head, channels mapped to LLM ids
    /// (identity, or `c - 1` in the legacy `vocab + 1` layout).
    ///
    /// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.bpe_hypothesis`.
    pub fn hypothesis(&self, bpe_logits: &Tensor) -> Result<Vec<i64>> {
        let ids =
            ctc_greedy_decode(bpe_logits, self.derived.bpe_blank_channel).ok_or_else(|| {
                RuntimeError::Op {
                    op: "host.ctc_decode".into(),
                    reason: format!(
                        "BPE-CTC logits of shape {:?} are not [frames, vocab] rows",
                        bpe_logits.shape()
                    ),
                }
            })?;
        Ok(ids
            .into_iter()
            .map(|c| {
                if self.derived.bpe_legacy {
                    c as i64 - 1
                } else {
                    c as i64
                }
            })
            .collect())
    }

    /// The insertion-slot template for a hypothesis (ids checked against the vocabulary).
    pub fn template(&self, hypothesis: &[i64]) -> Result<Vec<i64>> {
        let vocab = self.config.text_config.vocab_size as i64;
        if let Some(bad) = hypothesis.iter().find(|&&t| !(0..vocab).contains(&t)) {
            return Err(RuntimeError::Feed {
                edge: names::TEMPLATE_IDS.into(),
                reason: format!("hypothesis id {bad} outside the vocabulary 0..{vocab}"),
            });
        }
        Ok(add_insertion_slots(
            hypothesis,
            self.derived.blank_token_id as i64,
            self.config.min_edit_sequence_length,
        ))
    }

    /// Formula `edit`: the capture concat and a template -> raw lm_head logits of the text rows
    /// `[n_text, vocab]` (every `proj.*` and `dec.*` checkpoint is produced on the way).
    pub fn edit(&self, cat_out: Tensor, template: &[i64], ctx: &mut RunCtx) -> Result<Tensor> {
        let ids = Array1::from_iter(template.iter().map(|&i| i as f32)).into_dyn();
        let feeds: Feeds = HashMap::from([
            (names::CAT_OUT.to_string(), cat_out),
            (names::TEMPLATE_IDS.to_string(), ids),
        ]);
        self.loaded.run_one(feeds, self.edges.text_logits, ctx)
    }

    /// Final tokens from the text logits: argmax per row, collapse repeats, drop the blank.
    pub fn final_tokens(&self, text_logits: &Tensor) -> Result<Vec<i64>> {
        ctc_greedy_decode(text_logits, self.derived.blank_token_id)
            .map(|v| v.into_iter().map(|i| i as i64).collect())
            .ok_or_else(|| RuntimeError::Op {
                op: "host.final_decode".into(),
                reason: format!(
                    "text logits of shape {:?} are not [n_text, vocab] rows",
                    text_logits.shape()
                ),
            })
    }
}

impl SpeechModel for GraniteNarModel {
    fn loaded(&self) -> &Loaded {
        &self.loaded
    }
    /// Encode, CTC-decode the BPE head (or take `opts.teacher_tokens` as the hypothesis), build
    /// the template, one bidirectional LM pass, argmax-collapse-drop-blank. Everything is step 0.
    /// `tokens` = `predicted` = the final ids; `outputs` = `[dec.text_logits]`; extras:
    /// `hypothesis` (used), `own_hypothesis` (the runtime's CTC), `template`, `teacher_forced`.
    fn run(&self, audio: &Audio, opts: &RunOptions, hooks: &mut RunHooks) -> Result<RunOutput> {
        self.preprocessor.check_audio(audio)?;
        let enc = self.encode(&audio.samples, &mut hooks.ctx(0))?;
        let own = self.hypothesis(&enc.bpe_logits)?;
        let hypothesis = opts.teacher_tokens.clone().unwrap_or_else(|| own.clone());
        let template = self.template(&hypothesis)?;
        let logits = self.edit(enc.cat_out, &template, &mut hooks.ctx(0))?;
        let tokens = self.final_tokens(&logits)?;
        let transcript = self.decode_text(&tokens)?;
        let mut extra = BTreeMap::new();
        extra.insert("hypothesis".to_string(), serde_json::json!(hypothesis));
        extra.insert("own_hypothesis".to_string(), serde_json::json!(own));
        extra.insert("template".to_string(), serde_json::json!(template));
        extra.insert(
            "teacher_forced".to_string(),
            serde_json::json!(opts.teacher_tokens.is_some()),
        );
        Ok(RunOutput {
            tokens: tokens.clone(),
            predicted: tokens,
            transcript,
            outputs: vec![logits],
            extra,
        })
    }
    fn decode_text(&self, ids: &[i64]) -> Result<String> {
        self.tokenizer.decode(ids)
    }
}
