//! Decoding state and greedy generation rules.
//!
//! [`DecoderSession`] is the host side of the "caches are feeds" design: it holds the encoder
//! memory, the per-layer cross-attention K/V projection cache with its validity flag, and the
//! per-layer self-attention K/V cache. The graph never holds them; each formula run takes them as
//! feeds and returns the updated ones as outputs.
//!
//! [`GenerationPlan`] is what generation_config.json makes of greedy decoding: the forced prefix,
//! the suppressed tokens, end of text and the length limit.

use std::collections::HashSet;
use std::path::Path;

use super::{GenerationConfig, WhisperConfig, HF_DEFAULT_MAX_LENGTH};
use crate::error::{Result, RuntimeError};
use crate::faults::FaultPlan;
use crate::graph::Tensor;

/// Host flag of the fault catalogue: installing new encoder memory does not invalidate the
/// cross-attention projection cache (the stale-cache bug).
pub const STALE_CROSS_CACHE: &str = "stale_cross_cache";
/// Host fault: from decode step [`POSITION_AHEAD_FROM`] on, the position fed is one ahead of the
/// cache length (a position counter advanced twice).
pub const POSITION_AHEAD: &str = "position_ahead";
/// The first decode step [`POSITION_AHEAD`] changes.
pub const POSITION_AHEAD_FROM: usize = 3;

/// Decoder state between formula runs.
#[derive(Debug, Default)]
pub struct DecoderSession {
    pub(crate) memory: Option<Tensor>,
    /// Per layer (K, V), head-major `[heads, enc_tokens, head_dim]`.
    pub(crate) cross: Vec<(Tensor, Tensor)>,
    pub(crate) cross_valid: bool,
    /// Per layer (K, V), head-major `[heads, past, head_dim]`.
    pub(crate) self_kv: Vec<(Tensor, Tensor)>,
    pub(crate) past: usize,
}

impl DecoderSession {
    /// An empty session (no memory, invalid caches).
    pub fn new() -> Self {
        DecoderSession::default()
    }

    /// Install new encoder memory. This invalidates the cross-attention K/V projection cache (the
    /// next prefill stores the new memory's projections; a decode step refuses until then) and
    /// drops the self-attention cache, unless the fault plan sets the [`STALE_CROSS_CACHE`] host
    /// flag, which skips the cross-cache invalidation: the next prefill then keeps the previous
    /// memory's projections and the decode steps read them (the stale-cache bug).
    pub fn install_memory(&mut self, memory: Tensor, faults: Option<&FaultPlan>) {
        self.memory = Some(memory);
        if !faults.is_some_and(|f| f.host(STALE_CROSS_CACHE)) {
            self.cross_valid = false;
        }
        self.self_kv.clear();
        self.past = 0;
    }

    /// Whether the cross-attention projection cache may be used.
    pub fn cross_valid(&self) -> bool {
        self.cross_valid
    }

    /// Decoder positions already in the self-attention cache.
    pub fn past_len(&self) -> usize {
        self.past
    }

    /// The installed encoder memory.
    pub fn memory(&self) -> Option<&Tensor> {
        self.memory.as_ref()
    }

    /// The cross-attention projection cache, per layer (K, V).
    pub fn cross_cache(&self) -> &[(Tensor, Tensor)] {
        &self.cross
    }

    /// The self-attention cache, per layer (K, V).
    pub fn self_cache(&self) -> &[(Tensor, Tensor)] {
        &self.self_kv
    }
}

/// Greedy decoding as generation_config.json defines it.
#[derive(Debug, Clone)]
pub struct GenerationPlan {
    /// Forced prefix (decoder_start_token_id + forced ids / language / task / notimestamps).
    pub prefix: Vec<i64>,
    /// Suppressed at every step.
    pub suppress: Vec<usize>,
    /// Suppressed at the first generated position only.
    pub begin_suppress: Vec<usize>,
    /// End-of-text ids.
    pub eos: HashSet<i64>,
    /// generation_config max_length (HF default 20 when absent).
    pub max_length: usize,
    /// config.json max_target_positions.
    pub max_target_positions: usize,
}

fn gen_err(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Config {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl GenerationPlan {
    /// Resolve the plan, refusing what greedy short-form decoding cannot honour (sampling, beams,
    /// timestamps, language detection) and ids outside the vocabulary.
    ///
    /// Upstream: transformers v5.24.0 src/transformers/models/whisper/generation_whisper.py
    /// `WhisperGenerationMixin._retrieve_init_tokens`, `_retrieve_logit_processors`.
    pub fn new(gen: &GenerationConfig, cfg: &WhisperConfig, path: &Path) -> Result<GenerationPlan> {
        if gen.do_sample == Some(true) {
            return Err(gen_err(
                path,
                "do_sample = true: only greedy decoding is implemented",
            ));
        }
        if gen.num_beams.is_some_and(|b| b > 1) {
            return Err(gen_err(
                path,
                "num_beams > 1: only greedy decoding is implemented",
            ));
        }
        if gen.return_timestamps == Some(true) {
            return Err(gen_err(
                path,
                "return_timestamps = true: timestamp decoding is not implemented",
            ));
        }
        let mut prefix: Vec<Option<i64>> = vec![Some(gen.decoder_start_token_id)];
        if gen.task.is_none() && gen.language.is_none() {
            let forced = gen
                .forced_decoder_ids
                .as_ref()
                .or(cfg.forced_decoder_ids.as_ref());
            if let Some(forced) = forced {
                if forced.first().is_some_and(|f| f.0 == 1) {
                    let mut i = 1;
                    let mut rest = forced.as_slice();
                    while let Some(((pos, id), tail)) = rest.split_first() {
                        if *pos != i {
                            break;
                        }
                        prefix.push(*id);
                        rest = tail;
                        i += 1;
                    }
                    if !rest.is_empty() {
                        return Err(gen_err(
                            path,
                            format!("forced_decoder_ids {forced:?} do not follow the prompt pattern (positions 1, 2, ...)"),
                        ));
                    }
                }
            }
        }
        let lang_undefined = prefix.len() <= 1 || prefix[1].is_none();
        if let Some(lang) = &gen.language {
            let table = gen.lang_to_id.as_ref().ok_or_else(|| {
                gen_err(
                    path,
                    format!("language '{lang}' set but no lang_to_id table"),
                )
            })?;
            let l = lang.to_lowercase();
            let key = if table.contains_key(&l) {
                l.clone()
            } else {
                format!("<|{l}|>")
            };
            let id = *table.get(&key).ok_or_else(|| {
                gen_err(
                    path,
                    format!("language '{lang}' is not in lang_to_id (use a code such as 'en')"),
                )
            })?;
            if prefix.len() > 1 {
                prefix[1] = Some(id);
            } else {
                prefix.push(Some(id));
            }
        } else if gen.lang_to_id.is_some() && lang_undefined {
            return Err(gen_err(
                path,
                "multilingual checkpoint without a forced language: language detection is not implemented; \
                 set \"language\" in generation_config.json",
            ));
        }
        if let Some(task) = &gen.task {
            let table = gen.task_to_id.as_ref().ok_or_else(|| {
                gen_err(path, format!("task '{task}' set but no task_to_id table"))
            })?;
            let id = *table
                .get(task)
                .ok_or_else(|| gen_err(path, format!("task '{task}' is not in task_to_id")))?;
            let ids: Vec<i64> = table.values().copied().collect();
            if prefix.iter().any(|t| t.is_some_and(|t| ids.contains(&t))) {
                for t in prefix.iter_mut() {
                    if t.is_some_and(|x| ids.contains(&x)) {
                        *t = Some(id);
                    }
                }
            } else {
                prefix.push(Some(id));
            }
        } else if gen.language.is_some() {
            if let Some(table) = &gen.task_to_id {
                let ids: Vec<i64> = table.values().copied().collect();
                if !prefix.iter().any(|t| t.is_some_and(|t| ids.contains(&t))) {
                    let id = *table
                        .get("transcribe")
                        .ok_or_else(|| gen_err(path, "task_to_id has no 'transcribe'"))?;
                    prefix.push(Some(id));
                }
            }
        }
        if let Some(nt) = gen.no_timestamps_token_id {
            if prefix.last().copied().flatten() != Some(nt) {
                prefix.push(Some(nt));
            }
        }
        let prefix: Vec<i64> = prefix.into_iter().flatten().collect();
        let vocab = cfg.vocab_size as i64;
        let check = |what: &str, ids: &[i64]| -> Result<Vec<usize>> {
            ids.iter()
                .map(|&t| {
                    if (0..vocab).contains(&t) {
                        Ok(t as usize)
                    } else {
                        Err(gen_err(
                            path,
                            format!("{what} id {t} is outside the vocabulary 0..{vocab}"),
                        ))
                    }
                })
                .collect()
        };
        check("prefix", &prefix)?;
        let eos_ids = gen.eos_token_id.to_vec();
        check("eos_token_id", &eos_ids)?;
        let suppress = check(
            "suppress_tokens",
            gen.suppress_tokens.as_deref().unwrap_or(&[]),
        )?;
        let begin_suppress = check(
            "begin_suppress_tokens",
            gen.begin_suppress_tokens.as_deref().unwrap_or(&[]),
        )?;
        if prefix.len() >= cfg.max_target_positions {
            return Err(gen_err(
                path,
                format!(
                    "prefix {prefix:?} does not fit max_target_positions {}",
                    cfg.max_target_positions
                ),
            ));
        }
        Ok(GenerationPlan {
            prefix,
            suppress,
            begin_suppress,
            eos: eos_ids.into_iter().collect(),
            max_length: gen.max_length.unwrap_or(HF_DEFAULT_MAX_LENGTH),
            max_target_positions: cfg.max_target_positions,
        })
    }

    /// Longest total sequence (prefix + generated) for a prefix of `prefix_len` tokens.
    ///
    /// Upstream: transformers v5.24.0 src/transformers/models/whisper/generation_whisper.py
    /// `_set_max_new_tokens_and_length`: without max_new_tokens, `min(max_length +
    /// min(max_target_positions // 2 - 1, prefix_len), max_target_positions)`; with it,
    /// `prefix_len + max_new_tokens`, refused beyond max_target_positions.
    pub fn max_total(&self, prefix_len: usize, max_new_tokens: Option<usize>) -> Result<usize> {
        match max_new_tokens {
            Some(n) => {
                if n == 0 {
                    return Err(RuntimeError::Feed {
                        edge: "max_new_tokens".into(),
                        reason: "must be at least 1".into(),
                    });
                }
                if prefix_len + n > self.max_target_positions {
                    return Err(RuntimeError::Feed {
                        edge: "max_new_tokens".into(),
                        reason: format!(
                            "prefix ({prefix_len}) + max_new_tokens ({n}) exceeds max_target_positions {}",
                            self.max_target_positions
                        ),
                    });
                }
                Ok(prefix_len + n)
            }
            None => {
                let initial = (self.max_target_positions / 2)
                    .saturating_sub(1)
                    .min(prefix_len);
                Ok((self.max_length + initial).min(self.max_target_positions))
            }
        }
    }

    /// Greedy choice from one logits row at a position: suppress (−inf) `suppress_tokens`, and
    /// `begin_suppress_tokens` when `first` (the first generated position), then the first index
    /// of the maximum (NaN counts as maximal, as torch.argmax).
    ///
    /// Upstream: transformers v5.24.0 src/transformers/generation/logits_process.py
    /// `SuppressTokensLogitsProcessor`, `SuppressTokensAtBeginLogitsProcessor`; greedy
    /// `argmax(-1)` in `GenerationMixin._sample`.
    pub fn choose(&self, row: &[f32], first: bool) -> i64 {
        let mut scores = row.to_vec();
        for &t in &self.suppress {
            if let Some(s) = scores.get_mut(t) {
                *s = f32::NEG_INFINITY;
            }
        }
        if first {
            for &t in &self.begin_suppress {
                if let Some(s) = scores.get_mut(t) {
                    *s = f32::NEG_INFINITY;
                }
            }
        }
        let mut best = 0usize;
        for (i, &v) in scores.iter().enumerate() {
            if v.is_nan() {
                return i as i64;
            }
            if v > scores[best] {
                best = i;
            }
        }
        best as i64
    }
}
