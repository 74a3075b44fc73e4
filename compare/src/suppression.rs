//! Logits suppression: the token ids a generation config suppresses ([`Suppression`]), compared
//! away on entries that declare `logits_processed: suppression` (the align stage,
//! [`crate::align::DumpPairs::apply_declarations`]), and found where an engine suppresses without
//! declaring it ([`SuppressionFound`], named by the explain stage as signature
//! `logits_processed`).

use xray_core::dump::Dump;
use xray_core::{SignatureKind, Step};

use ndarray::ArrayD;

use crate::evidence::int_ranges;
use crate::signatures::Explanation;
use crate::Error;

/// A logits value at or below this is a suppressed id (engines write `-inf`, `f32::MIN`
/// (-3.4e38) or a large negative constant).
pub const SUPPRESSED: f32 = -1e30;

/// The token ids a Whisper generation config suppresses: `suppress_tokens` at every step,
/// `begin_suppress_tokens` at the first generated position (the row step 0's last position
/// predicts), as transformers' `SuppressTokensLogitsProcessor` and
/// `SuppressTokensAtBeginLogitsProcessor` apply them in `generate`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Suppression {
    /// `suppress_tokens`.
    pub every: Vec<usize>,
    /// `begin_suppress_tokens`.
    pub begin: Vec<usize>,
    /// Where the lists come from (for messages).
    pub source: String,
}

impl Suppression {
    /// The lists of a generation config (or config.json) object; `Ok(None)` when it has neither
    /// key, an error naming the key when one is not a list of non-negative integers.
    pub fn from_config(v: &serde_json::Value, source: &str) -> Result<Option<Suppression>, String> {
        let list = |key: &str| -> Result<Option<Vec<usize>>, String> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .filter(|&n| n <= 1 << 24)
                            .map(|n| n as usize)
                            .ok_or_else(|| format!("{source}: {key} holds {x}, not a token id"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some),
                Some(other) => Err(format!(
                    "{source}: {key} is {other}, not a list of token ids"
                )),
            }
        };
        let (every, begin) = (list("suppress_tokens")?, list("begin_suppress_tokens")?);
        if every.is_none() && begin.is_none() {
            return Ok(None);
        }
        Ok(Some(Suppression {
            every: every.unwrap_or_default(),
            begin: begin.unwrap_or_default(),
            source: source.to_string(),
        }))
    }

    /// The suppression the reference's manifest records: `extra.generation_config` (what `xray
    /// oracle` writes), else `extra.config`'s lists.
    pub fn of_dump(d: &Dump) -> Result<Option<Suppression>, Error> {
        let err = |reason: String| Error::Manifest {
            dump: d.dir.display().to_string(),
            reason,
        };
        for key in ["generation_config", "config"] {
            if let Some(v) = d.manifest.extra.get(key) {
                if let Some(s) =
                    Suppression::from_config(v, &format!("extra.{key}")).map_err(err)?
                {
                    return Ok(Some(s));
                }
            }
        }
        Ok(None)
    }

    /// The ids suppressed at `step`, ascending.
    pub fn ids_at(&self, step: Step) -> Vec<usize> {
        let mut v = self.every.clone();
        if step == 0 {
            v.extend(&self.begin);
        }
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Logits of the dump under test holding suppressed values (<= [`SUPPRESSED`]) where the
/// reference is finite, with no `logits_processed` declared: at one (checkpoint, step), the ids
/// so set and the ids the generation config suppresses there.
#[derive(Debug, Clone, PartialEq)]
pub struct SuppressionFound {
    /// The logits checkpoint.
    pub checkpoint: String,
    /// Its step.
    pub step: Step,
    /// Ids the engine set to a suppressed value (in any row), ascending.
    pub ids: Vec<usize>,
    /// The ids the generation config suppresses at this step.
    pub config_ids: Vec<usize>,
    /// Where the lists come from.
    pub source: String,
    /// The vocabulary size.
    pub vocab: usize,
    /// The entry declares `logits_processed: suppression` (its ids inside the config's lists
    /// were compared away; `ids` are then the ones outside them).
    pub declared: bool,
    /// The generation config's `begin_suppress_tokens` (to name them when suppressed at a step
    /// other than 0).
    pub begin: Vec<usize>,
}

impl SuppressionFound {
    /// Whether every suppressed id is one the config suppresses.
    pub fn explained(&self) -> bool {
        self.ids
            .iter()
            .all(|i| self.config_ids.binary_search(i).is_ok())
    }

    /// The mechanism, as a signature (`logits_processed`) when the ids are the config's.
    pub fn explanation(&self) -> Explanation {
        let outside: Vec<usize> = self
            .ids
            .iter()
            .copied()
            .filter(|i| self.config_ids.binary_search(i).is_err())
            .collect();
        let begin_late: Vec<usize> = if self.step > 0 {
            outside
                .iter()
                .copied()
                .filter(|i| self.begin.contains(i))
                .collect()
        } else {
            vec![]
        };
        let list = |v: &[usize]| {
            let mut t = v[..v.len().min(8)]
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            if v.len() > 8 {
                t.push_str(", ...");
            }
            t
        };
        let (signature, detail) = if self.declared || !begin_late.is_empty() {
            (
                SignatureKind::LogitsProcessed,
                format!(
                    "logits processed: suppression at ids {} does not suppress at step {}: {}{}",
                    self.source,
                    self.step,
                    list(&outside),
                    if begin_late.len() == outside.len() {
                        " (its begin_suppress_tokens, which apply at the first generated position only, step 0: the engine suppresses them at a later step, e.g. the first position after a forced prefix)".to_string()
                    } else if !begin_late.is_empty() {
                        format!(
                            " ({} of them begin_suppress_tokens, which apply at step 0 only)",
                            begin_late.len()
                        )
                    } else {
                        String::new()
                    }
                ),
            )
        } else if outside.is_empty() {
            let how = if self.ids.len() == self.config_ids.len() {
                "exactly the".to_string()
            } else {
                format!("{} of the {}", self.ids.len(), self.config_ids.len())
            };
            (
                SignatureKind::LogitsProcessed,
                format!(
                    "logits processed: suppression: the {} of {} ids the engine sets to <= -1e30 are {how} ids {} suppresses at step {} (suppress_tokens{}); the reference's logits are raw proj_out outputs. Declare \"logits_processed\": \"suppression\" on these entries (docs/dump-format.md) to compare them outside the suppressed ids",
                    self.ids.len(),
                    self.vocab,
                    self.source,
                    self.step,
                    if self.step == 0 { ", begin_suppress_tokens" } else { "" }
                ),
            )
        } else {
            (
                SignatureKind::None,
                format!(
                    "{} of {} ids are set to <= -1e30 where the reference is finite; {} of them are not in {}'s suppress lists (first: {}), so suppression does not explain them",
                    self.ids.len(),
                    self.vocab,
                    outside.len(),
                    self.source,
                    list(&outside)
                ),
            )
        };
        Explanation {
            signature,
            detail,
            evidence: serde_json::json!({
                "suppressed_ids": self.ids.len(),
                "config_ids": self.config_ids.len(),
                "outside_config": outside.len(),
                "source": self.source,
            }),
        }
    }
}

/// Counts of one entry whose suppressed ids were compared away: how many of the ids the
/// engine holds suppressed (`held`) of how many it was asked to (`of`), on which side.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Suppressed {
    pub(crate) name: String,
    pub(crate) step: Step,
    pub(crate) held: usize,
    pub(crate) of: usize,
    /// 1: the dump under test; 2 + k: its k-th isolated run.
    pub(crate) side: usize,
}

impl Suppression {
    /// Compares `g` with its reference `r` outside the ids suppressed at `step`: there `g` takes
    /// `r`'s value, so they add no difference and every other id keeps its index. Returns how
    /// many of those values `g` held suppressed, of how many (`None` when the shapes differ: the
    /// pair reports that). An id outside the vocabulary is an error.
    pub(crate) fn compare_outside(
        &self,
        r: &ArrayD<f32>,
        g: &mut ArrayD<f32>,
        step: Step,
    ) -> Result<Option<(usize, usize)>, String> {
        let ids = self.ids_at(step);
        let vocab = r.shape().last().copied().unwrap_or(0);
        if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
            return Err(format!(
                "suppressed id {bad} (from {}) is outside the vocabulary of {vocab}",
                self.source
            ));
        }
        let Some(last) = r.ndim().checked_sub(1).filter(|_| g.shape() == r.shape()) else {
            return Ok(None);
        };
        let mut held = 0usize;
        for (mut gr, rr) in g
            .lanes_mut(ndarray::Axis(last))
            .into_iter()
            .zip(r.lanes(ndarray::Axis(last)))
        {
            for &i in &ids {
                if gr[i] <= SUPPRESSED {
                    held += 1;
                }
                gr[i] = rr[i];
            }
        }
        let rows = g.len() / vocab.max(1);
        Ok(Some((held, rows * ids.len())))
    }

    /// The evidence note of the entries compared outside the suppressed ids (`processed`), with
    /// the directories of the sides (`dirs[0]`: the dump under test, then its isolated runs).
    pub(crate) fn note(&self, processed: &[Suppressed], dirs: &[String]) -> String {
        let mut per_dump = Vec::new();
        for (side, dir) in dirs.iter().enumerate() {
            let mine: Vec<_> = processed.iter().filter(|p| p.side == side + 1).collect();
            if !mine.is_empty() {
                let held: usize = mine.iter().map(|p| p.held).sum();
                let of: usize = mine.iter().map(|p| p.of).sum();
                per_dump.push(format!("{held} of {of} in {dir}"));
            }
        }
        let mut names: Vec<&str> = processed.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let at: Vec<String> = names
            .iter()
            .map(|n| {
                let mut steps: Vec<Step> = processed
                    .iter()
                    .filter(|p| p.name == *n)
                    .map(|p| p.step)
                    .collect();
                steps.sort_unstable();
                steps.dedup();
                format!("{n} at steps {}", int_ranges(&steps))
            })
            .collect();
        format!(
            "logits processed: suppression (declared): {} compared outside the ids {} suppresses ({} suppress_tokens at every step, {} begin_suppress_tokens at step 0); the engine holds a suppressed value (<= -1e30) at {}",
            at.join(", "),
            self.source,
            self.every.len(),
            self.begin.len(),
            per_dump.join(", ")
        )
    }
}
