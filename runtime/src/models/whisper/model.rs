//! The loaded Whisper model (spec + state + contract + tokenizer) and its formulas on the one
//! graph: encode (pcm -> memory), prefill, decode step, full window; plus greedy decoding
//! ([`SpeechModel::run`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;

use ndarray::{Array1, Array3, Axis};

use super::decode::{DecoderSession, GenerationPlan};
use super::graph::{self as wgraph, names, WhisperEdges};
use super::{GenerationConfig, ModelFiles, PreprocessorConfig, WhisperConfig};
use crate::audio::Audio;
use crate::error::{Result, RuntimeError};
use crate::graph::{Feeds, RunCtx, Tensor};
use crate::models::common::{next_output, pcm_feeds, read_json, Tokenizer};
use crate::models::{Loaded, RunHooks, RunOptions, RunOutput, SpeechModel};
use crate::weights::Weights;

/// A loaded Whisper checkpoint.
pub struct WhisperModel {
    loaded: Loaded,
    files: ModelFiles,
    config: WhisperConfig,
    generation: GenerationConfig,
    preprocessor: PreprocessorConfig,
    plan: GenerationPlan,
    edges: WhisperEdges,
    tokenizer: Tokenizer,
    /// The session [`SpeechModel::run`] uses: it persists across runs like a serving worker's
    /// decoder state, so installing the next input's memory is what invalidates its cross cache.
    session: Mutex<DecoderSession>,
}

impl std::fmt::Debug for WhisperModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhisperModel")
            .field("dir", &self.loaded.dir)
            .field("config", &self.config)
            .finish()
    }
}

fn ids_tensor(ids: impl IntoIterator<Item = i64>) -> Tensor {
    Array1::from_iter(ids.into_iter().map(|i| i as f32)).into_dyn()
}

impl WhisperModel {
    /// Load a HF `WhisperForConditionalGeneration` directory: config.json (sanity-checked, fail
    /// closed), preprocessor_config.json (consistent with it), generation_config.json, the graph
    /// built from them, model.safetensors checked against the graph (missing, mismatched and
    /// unused keys are errors), the checkpoint contract checked against the graph, tokenizer.json.
    pub fn load(dir: &Path) -> Result<WhisperModel> {
        let files = ModelFiles::of(dir)?;
        let (config, config_json): (WhisperConfig, _) = read_json(&files.config)?;
        config.check(&files.config)?;
        let (preprocessor, _): (PreprocessorConfig, _) = read_json(&files.preprocessor)?;
        preprocessor.check(&files.preprocessor, &config)?;
        let (generation, _): (GenerationConfig, _) = read_json(&files.generation)?;
        let plan = GenerationPlan::new(&generation, &config, &files.generation)?;
        let weights = Weights::load(&files.weights)?;
        // The layer counts decide the graph's size: checked against the checkpoint before the
        // graph is built (a config claiming a million layers is refused, not built).
        for (key, prefix, n) in [
            (
                "encoder_layers",
                "model.encoder.layers.",
                config.encoder_layers,
            ),
            (
                "decoder_layers",
                "model.decoder.layers.",
                config.decoder_layers,
            ),
        ] {
            let present = weights.layer_count(prefix);
            if present != n {
                return Err(RuntimeError::Config {
                    path: files.config.clone(),
                    reason: format!(
                        "{key} is {n} but {} holds {present} layers ({prefix}N.*)",
                        files.weights.display()
                    ),
                });
            }
        }
        let (graph, edges) = wgraph::build(&config, &preprocessor, &files.preprocessor)?;
        let mut loaded = Loaded::check(dir, super::NAME, graph, weights, &config_json)?;
        // Exact f16 mirrors for the row-stable (decoder) projections: same bits, half the bytes.
        loaded.graph.mirror_f16_weights(&mut loaded.weights);
        let tokenizer = Tokenizer::load(&files.tokenizer)?;
        Ok(WhisperModel {
            loaded,
            files,
            config,
            generation,
            preprocessor,
            plan,
            edges,
            tokenizer,
            session: Mutex::new(DecoderSession::new()),
        })
    }

    /// This model with another weight table (what-if experiments: the graph is the spec and
    /// stays; the table is state). The table is checked against the graph like a loaded one and
    /// used as given: its f16 mirrors, if any, are used, and none are added (see
    /// [`Graph::mirror_f16_weights`]). The session's caches are dropped.
    pub fn with_weights(mut self, weights: Weights) -> Result<WhisperModel> {
        self.loaded.graph.check_weights(&weights)?;
        self.loaded.weights = weights;
        self.session = Mutex::new(DecoderSession::new());
        Ok(self)
    }

    /// config.json.
    pub fn config(&self) -> &WhisperConfig {
        &self.config
    }

    /// generation_config.json.
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// preprocessor_config.json.
    pub fn preprocessor(&self) -> &PreprocessorConfig {
        &self.preprocessor
    }

    /// The greedy decoding plan (forced prefix, suppression, limits).
    pub fn plan(&self) -> &GenerationPlan {
        &self.plan
    }

    /// Feed/output edge ids.
    pub fn edges(&self) -> &WhisperEdges {
        &self.edges
    }

    /// The files this model was loaded from.
    pub fn files(&self) -> &ModelFiles {
        &self.files
    }

    /// A fresh decoder session (no memory, invalid caches).
    pub fn new_session(&self) -> DecoderSession {
        DecoderSession::new()
    }

    fn layers(&self) -> usize {
        self.config.decoder_layers
    }

    fn empty_cache(&self) -> Tensor {
        Array3::<f32>::zeros((
            self.config.decoder_attention_heads,
            0,
            self.config.decoder_head_dim(),
        ))
        .into_dyn()
    }

    /// Formula `frontend`: pcm samples (at most one window) -> log-mel `[mel_bins, frames]`.
    pub fn log_mel(&self, pcm: &[f32], ctx: &mut RunCtx) -> Result<Tensor> {
        let feeds = pcm_feeds(names::PCM, pcm);
        self.loaded.run_one(feeds, self.edges.mel, ctx)
    }

    /// Formula `encode`: pcm samples (at most one window) -> encoder memory `[enc_tokens, d_model]`.
    pub fn encode(&self, pcm: &[f32], ctx: &mut RunCtx) -> Result<Tensor> {
        let feeds = pcm_feeds(names::PCM, pcm);
        self.loaded.run_one(feeds, self.edges.memory, ctx)
    }

    /// Formula `encode` from features: log-mel `[mel_bins, frames]` -> encoder memory (the
    /// frontend op does not run).
    pub fn encode_mel(&self, mel: Tensor, ctx: &mut RunCtx) -> Result<Tensor> {
        let feeds: Feeds = HashMap::from([(names::MEL.to_string(), mel)]);
        self.loaded.run_one(feeds, self.edges.memory, ctx)
    }

    /// Formula `prefill` (the populate phase of the cross-attention projection cache): encoder
    /// memory + the forced prefix tokens at positions `0..T` + empty self-attention caches ->
    /// logits `[T, vocab]`, the self caches, and the cross K/V projections of the installed memory.
    /// The projections are stored as the session's cross cache when it is invalid (after new
    /// memory was installed); a cache that is still valid is kept as it is, so the cross K/V are
    /// projected once per memory.
    pub fn prefill(
        &self,
        sess: &mut DecoderSession,
        tokens: &[i64],
        ctx: &mut RunCtx,
    ) -> Result<Tensor> {
        if tokens.is_empty() {
            return Err(RuntimeError::Feed {
                edge: names::INPUT_IDS.into(),
                reason: "prefill needs at least one token".into(),
            });
        }
        if tokens.len() > self.config.max_target_positions {
            return Err(RuntimeError::Feed {
                edge: names::INPUT_IDS.into(),
                reason: format!(
                    "{} tokens exceed max_target_positions {}",
                    tokens.len(),
                    self.config.max_target_positions
                ),
            });
        }
        let memory = sess.memory.clone().ok_or_else(|| RuntimeError::Feed {
            edge: names::MEMORY.into(),
            reason:
                "no encoder memory installed: run the encoder and install its memory before prefill"
                    .into(),
        })?;
        let l = self.layers();
        let mut feeds: Feeds = HashMap::new();
        feeds.insert(names::MEMORY.into(), memory);
        feeds.insert(names::INPUT_IDS.into(), ids_tensor(tokens.iter().copied()));
        feeds.insert(
            names::POSITION_IDS.into(),
            ids_tensor(0..tokens.len() as i64),
        );
        for i in 0..l {
            feeds.insert(names::self_k_past(i), self.empty_cache());
            feeds.insert(names::self_v_past(i), self.empty_cache());
        }
        let mut want = vec![self.edges.logits];
        for c in &self.edges.self_cache {
            want.extend([c[2], c[3]]);
        }
        for c in &self.edges.cross {
            want.extend([c[0], c[1]]);
        }
        let mut outs = self.loaded.run(feeds, &want, ctx)?.into_iter();
        let logits = next_output(&mut outs)?;
        let mut self_kv = Vec::with_capacity(l);
        for _ in 0..l {
            self_kv.push((next_output(&mut outs)?, next_output(&mut outs)?));
        }
        let mut cross = Vec::with_capacity(l);
        for _ in 0..l {
            cross.push((next_output(&mut outs)?, next_output(&mut outs)?));
        }
        sess.self_kv = self_kv;
        sess.past = tokens.len();
        if !sess.cross_valid || sess.cross.len() != l {
            sess.cross = cross;
            sess.cross_valid = true;
        }
        Ok(logits)
    }

    /// Formula `decode step`: one token at position `past`, the self caches and the cross
    /// projection cache as feeds -> logits `[1, vocab]` and the updated self caches (the cross
    /// cache's producers do not run). Refuses with [`RuntimeError::StaleCache`] when the cross
    /// cache is invalid (new memory installed since the last prefill).
    pub fn decode_step(
        &self,
        sess: &mut DecoderSession,
        token: i64,
        ctx: &mut RunCtx,
    ) -> Result<Tensor> {
        let l = self.layers();
        if !sess.cross_valid || sess.cross.len() != l {
            return Err(RuntimeError::StaleCache(
                "the cross-attention K/V projection cache is invalid (new encoder memory was installed after the last \
                 prefill, or no prefill ran); run prefill to repopulate it before a decode step"
                    .into(),
            ));
        }
        if sess.self_kv.len() != l {
            return Err(RuntimeError::Feed {
                edge: names::self_k_past(0),
                reason: "no self-attention cache: run prefill before a decode step".into(),
            });
        }
        if sess.past >= self.config.max_target_positions {
            return Err(RuntimeError::Feed {
                edge: names::POSITION_IDS.into(),
                reason: format!(
                    "position {} is beyond max_target_positions {}",
                    sess.past, self.config.max_target_positions
                ),
            });
        }
        let mut feeds: Feeds = HashMap::new();
        feeds.insert(names::INPUT_IDS.into(), ids_tensor([token]));
        let ahead = ctx.step >= super::decode::POSITION_AHEAD_FROM
            && ctx
                .faults
                .is_some_and(|f| f.host(super::decode::POSITION_AHEAD));
        feeds.insert(
            names::POSITION_IDS.into(),
            ids_tensor([sess.past as i64 + i64::from(ahead)]),
        );
        for (i, (k, v)) in std::mem::take(&mut sess.self_kv).into_iter().enumerate() {
            feeds.insert(names::self_k_past(i), k);
            feeds.insert(names::self_v_past(i), v);
        }
        for (i, (k, v)) in std::mem::take(&mut sess.cross).into_iter().enumerate() {
            feeds.insert(names::cross_k(i), k);
            feeds.insert(names::cross_v(i), v);
        }
        let mut want = vec![self.edges.logits];
        for c in &self.edges.self_cache {
            want.extend([c[2], c[3]]);
        }
        // Fed edges asked for come back untouched: the cross cache round-trips without a copy.
        for c in &self.edges.cross {
            want.extend([c[0], c[1]]);
        }
        let mut outs = match self.loaded.run(feeds, &want, ctx) {
            Ok(o) => o.into_iter(),
            Err(e) => {
                sess.cross_valid = false;
                sess.past = 0;
                return Err(e);
            }
        };
        let logits = next_output(&mut outs)?;
        for _ in 0..l {
            let kv = (next_output(&mut outs)?, next_output(&mut outs)?);
            sess.self_kv.push(kv);
        }
        for _ in 0..l {
            let kv = (next_output(&mut outs)?, next_output(&mut outs)?);
            sess.cross.push(kv);
        }
        sess.past += 1;
        Ok(logits)
    }

    /// Formula `full window`: encoder memory + all tokens at positions `0..T`, no past -> logits
    /// `[T, vocab]` for every position (the check that incremental decode must equal bit for bit).
    pub fn full_window(&self, memory: &Tensor, tokens: &[i64], ctx: &mut RunCtx) -> Result<Tensor> {
        if tokens.is_empty() || tokens.len() > self.config.max_target_positions {
            return Err(RuntimeError::Feed {
                edge: names::INPUT_IDS.into(),
                reason: format!(
                    "{} tokens: need 1..={}",
                    tokens.len(),
                    self.config.max_target_positions
                ),
            });
        }
        let mut feeds: Feeds = HashMap::new();
        feeds.insert(names::MEMORY.into(), memory.clone());
        feeds.insert(names::INPUT_IDS.into(), ids_tensor(tokens.iter().copied()));
        feeds.insert(
            names::POSITION_IDS.into(),
            ids_tensor(0..tokens.len() as i64),
        );
        for i in 0..self.layers() {
            feeds.insert(names::self_k_past(i), self.empty_cache());
            feeds.insert(names::self_v_past(i), self.empty_cache());
        }
        self.loaded.run_one(feeds, self.edges.logits, ctx)
    }

    /// Greedy decode (or teacher-force) from installed state; shared by [`SpeechModel::run`].
    pub fn generate(
        &self,
        sess: &mut DecoderSession,
        opts: &RunOptions,
        hooks: &mut RunHooks,
    ) -> Result<RunOutput> {
        let prefix = self.plan.prefix.clone();
        let teacher = match &opts.teacher_tokens {
            Some(t) => {
                if t.len() <= prefix.len() || t[..prefix.len()] != prefix[..] {
                    return Err(RuntimeError::Feed {
                        edge: names::INPUT_IDS.into(),
                        reason: format!(
                            "teacher tokens {:?} must start with this model's forced prefix {prefix:?} and extend it",
                            &t[..t.len().min(prefix.len() + 4)]
                        ),
                    });
                }
                let mut t = t.clone();
                if let Some(n) = opts.max_new_tokens {
                    t.truncate(prefix.len() + n.max(1));
                }
                Some(t)
            }
            None => None,
        };
        let max_total = match &teacher {
            Some(t) => t.len(),
            None => self.plan.max_total(prefix.len(), opts.max_new_tokens)?,
        };
        let mut outputs: Vec<Tensor> = Vec::new();
        let mut predicted = Vec::new();
        let mut tokens = prefix.clone();
        let logits = self.prefill(sess, &prefix, &mut hooks.ctx(0))?;
        outputs.push(logits);
        let mut step = 0usize;
        let stop = loop {
            let last = outputs
                .last()
                .ok_or_else(|| RuntimeError::Graph("no logits".into()))?;
            let row = last.index_axis(Axis(0), last.shape()[0] - 1);
            let row = row
                .as_slice()
                .ok_or_else(|| RuntimeError::Graph("logits row not contiguous".into()))?;
            let choice = self.plan.choose(row, step == 0);
            predicted.push(choice);
            let next_tok = match &teacher {
                Some(t) => t[tokens.len()],
                None => choice,
            };
            tokens.push(next_tok);
            if teacher.is_none() && self.plan.eos.contains(&next_tok) {
                break "eos";
            }
            if tokens.len() >= max_total {
                break if teacher.is_some() {
                    "teacher"
                } else {
                    "max_length"
                };
            }
            step += 1;
            let logits = self.decode_step(sess, next_tok, &mut hooks.ctx(step))?;
            outputs.push(logits);
        };
        let transcript = self.decode_text(&predicted)?;
        let mut extra = BTreeMap::new();
        extra.insert("prefix".to_string(), serde_json::json!(prefix));
        extra.insert("steps".to_string(), serde_json::json!(outputs.len()));
        extra.insert("stop".to_string(), serde_json::json!(stop));
        extra.insert("max_total_length".to_string(), serde_json::json!(max_total));
        Ok(RunOutput {
            tokens,
            predicted,
            transcript,
            outputs,
            extra,
        })
    }
}

impl SpeechModel for WhisperModel {
    fn loaded(&self) -> &Loaded {
        &self.loaded
    }
    /// Step 0: frontend + encoder + prefill of the forced prefix; step K: the K-th single-token
    /// decode step. Greedy per generation_config.json, or teacher-forced on
    /// `opts.teacher_tokens` (then `predicted` is still the runtime's own argmax per step).
    /// `outputs` are the logits of every step.
    fn run(&self, audio: &Audio, opts: &RunOptions, hooks: &mut RunHooks) -> Result<RunOutput> {
        self.preprocessor.check_audio(audio)?;
        let memory = self.encode(&audio.samples, &mut hooks.ctx(0))?;
        let mut guard = match self.session.lock() {
            Ok(g) => g,
            Err(poisoned) => {
                // A panic mid-run left the session in an unknown state: start over.
                let mut g = poisoned.into_inner();
                *g = DecoderSession::new();
                g
            }
        };
        guard.install_memory(memory, hooks.faults);
        self.generate(&mut guard, opts, hooks)
    }
    fn decode_text(&self, ids: &[i64]) -> Result<String> {
        self.tokenizer.decode(ids)
    }
}
