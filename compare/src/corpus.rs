//! Corpus results: the margin of each checkpoint to its tolerance, one clip's summary line, and
//! the summary of many clips (`xray check --audio A B ... --evidence-dir OUT` writes
//! `OUT/summary.json`; `xray summarize DIR...` merges directories written by shards).
//!
//! The margin of a criterion is `metric / bound` for each criterion that decides a checkpoint
//! (rel_l2 against `max_rel_l2`, the outlier fraction against `max_outlier_fraction`, the element
//! closest to its bound, and for logits KL against `max_kl`): a pass needs every margin `<= 1`,
//! and the worst margin says how close a clean run came to failing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::evidence::{CheckpointEvidence, Evidence, Verdict};

/// `schema` of [`Summary`].
pub const SUMMARY_SCHEMA: &str = "xray.corpus-summary/v1";

/// How close one criterion of one checkpoint came to its bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Margin {
    /// `rel_l2`, `rel_l2 (logits)`, `logits kl_max`, `outlier fraction`, `element |d| / bound`.
    pub criterion: String,
    /// `value / bound` (infinite when the bound is 0 and the value is not).
    pub margin: f64,
    /// The metric.
    pub value: f64,
    /// Its bound.
    pub bound: f64,
    /// `NAME@stepK`.
    pub checkpoint: String,
}

fn margin_of(criterion: &str, value: f64, bound: f64, at: &str) -> Margin {
    let margin = if bound > 0.0 {
        value / bound
    } else if value > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    Margin {
        criterion: criterion.to_string(),
        margin,
        value,
        bound,
        checkpoint: at.to_string(),
    }
}

/// The margins of every criterion that decides this checkpoint (none without metrics).
pub fn margins(c: &CheckpointEvidence) -> Vec<Margin> {
    let Some(m) = &c.metrics else {
        return vec![];
    };
    let t = &c.tolerance.bounds;
    let at = c.id();
    let mut out = Vec::new();
    let logits = m.logits.as_ref();
    let rel = if logits.is_some() {
        "rel_l2 (logits)"
    } else {
        "rel_l2"
    };
    if let Some(b) = t.max_rel_l2 {
        out.push(margin_of(rel, m.rel_l2, b, &at));
    }
    match logits {
        Some(l) => {
            if let Some(b) = t.max_kl {
                out.push(margin_of("logits kl_max", l.kl_max, b, &at));
            }
        }
        None => {
            out.push(margin_of(
                "outlier fraction",
                m.beyond_fraction,
                t.max_outlier_fraction,
                &at,
            ));
            // The element closest to its bound (> 1 would be an outlier).
            out.push(margin_of(
                "element |d| / bound",
                m.max_bound_ratio,
                1.0,
                &at,
            ));
        }
    }
    out
}

/// The worst margin over every checkpoint of an evidence document.
pub fn worst_margin(e: &Evidence) -> Option<Margin> {
    e.checkpoints
        .iter()
        .flat_map(margins)
        .max_by(|a, b| a.margin.total_cmp(&b.margin))
}

/// One clip of a corpus run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClipSummary {
    /// The audio file as given.
    pub audio: String,
    /// Its evidence file, relative to the summary's directory.
    pub evidence: String,
    /// The clip's verdict.
    pub verdict: Verdict,
    /// `NAME@stepK` of the first divergence, if any.
    pub origin: Option<String>,
    /// Whether the runtime's tokens equal the reference's (`None` without transcripts).
    pub tokens_equal: Option<bool>,
    /// The clip's worst margin.
    pub worst_margin: Option<Margin>,
    /// Wall time of the clip's check, seconds (the loading is not in it: `Summary::load_seconds`).
    pub seconds: f64,
    /// Why the clip could not be checked (verdict `error`, no evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ClipSummary {
    /// The summary line of one clip's evidence.
    pub fn of(audio: &str, evidence: &str, e: &Evidence, seconds: f64) -> ClipSummary {
        ClipSummary {
            audio: audio.to_string(),
            evidence: evidence.to_string(),
            verdict: e.verdict,
            origin: e
                .first_divergence
                .as_ref()
                .map(|f| format!("{}@step{}", f.checkpoint, f.step)),
            tokens_equal: e.transcript.as_ref().map(|t| t.tokens_equal),
            worst_margin: worst_margin(e),
            seconds,
            error: None,
        }
    }

    /// A clip that could not be checked.
    pub fn failed(audio: &str, error: &str, seconds: f64) -> ClipSummary {
        ClipSummary {
            audio: audio.to_string(),
            evidence: String::new(),
            verdict: Verdict::Error,
            origin: None,
            tokens_equal: None,
            worst_margin: None,
            seconds,
            error: Some(error.to_string()),
        }
    }
}

/// Counts over a corpus.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Clips.
    pub clips: usize,
    /// Clips by verdict (`pass`, `diverged`, `error`).
    pub verdicts: BTreeMap<String, usize>,
    /// Clips whose tokens differ from the reference's.
    pub token_mismatches: usize,
}

/// `OUT/summary.json` of a corpus run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// [`SUMMARY_SCHEMA`].
    pub schema: String,
    /// Model directory.
    pub model: String,
    /// `K/N` when this is one shard of a corpus (`None` for a whole corpus or a merge).
    pub shard: Option<String>,
    /// Seconds spent loading the runtime model and starting the oracle (once per process).
    pub load_seconds: Option<f64>,
    /// One entry per clip, in the corpus order.
    pub clips: Vec<ClipSummary>,
    /// Aggregate counts.
    pub counts: Counts,
    /// The worst margin across every clip, with its clip.
    pub worst: Option<WorstClip>,
}

/// The worst margin of a corpus and the clip it was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorstClip {
    /// The clip (as given).
    pub clip: String,
    /// The margin.
    #[serde(flatten)]
    pub margin: Margin,
}

impl Summary {
    /// A summary of these clips (counts and the worst margin derived from them).
    pub fn new(
        model: &str,
        shard: Option<String>,
        load_seconds: Option<f64>,
        clips: Vec<ClipSummary>,
    ) -> Summary {
        let mut counts = Counts {
            clips: clips.len(),
            ..Counts::default()
        };
        for c in &clips {
            *counts
                .verdicts
                .entry(c.verdict.as_str().to_string())
                .or_default() += 1;
            if c.tokens_equal == Some(false) {
                counts.token_mismatches += 1;
            }
        }
        let worst = clips
            .iter()
            .filter_map(|c| {
                c.worst_margin.clone().map(|margin| WorstClip {
                    clip: c.audio.clone(),
                    margin,
                })
            })
            .max_by(|a, b| a.margin.margin.total_cmp(&b.margin.margin));
        Summary {
            schema: SUMMARY_SCHEMA.to_string(),
            model: model.to_string(),
            shard,
            load_seconds,
            clips,
            counts,
            worst,
        }
    }

    /// Whether every clip passed (and there was at least one).
    pub fn all_pass(&self) -> bool {
        !self.clips.is_empty() && self.clips.iter().all(|c| c.verdict == Verdict::Pass)
    }

    /// A Markdown table: one row per clip, then the counts and the worst margin.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "# X-Ray corpus: {}\n\n{} clips: {}; token mismatches: {}\n\n",
            self.model,
            self.counts.clips,
            self.counts
                .verdicts
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.counts.token_mismatches
        );
        if let Some(w) = &self.worst {
            let m = &w.margin;
            s.push_str(&format!(
                "Worst margin: {:.3} ({} {:.3e} / {:.3e}) at {} on {}\n\n",
                m.margin, m.criterion, m.value, m.bound, m.checkpoint, w.clip
            ));
        }
        s.push_str("| clip | verdict | origin | tokens equal | worst margin | seconds |\n|---|---|---|---|---|---|\n");
        for c in &self.clips {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.1} |\n",
                c.audio,
                c.verdict.as_str(),
                c.origin.as_deref().or(c.error.as_deref()).unwrap_or("-"),
                c.tokens_equal
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                c.worst_margin
                    .as_ref()
                    .map(|m| format!("{:.3} ({})", m.margin, m.criterion))
                    .unwrap_or_else(|| "-".into()),
                c.seconds
            ));
        }
        s
    }
}

/// Parse `K/N` (1 <= K <= N).
pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (k, n) = s
        .split_once('/')
        .ok_or_else(|| format!("shard '{s}' is not K/N"))?;
    let k: usize = k
        .trim()
        .parse()
        .map_err(|_| format!("shard '{s}': K is not a number"))?;
    let n: usize = n
        .trim()
        .parse()
        .map_err(|_| format!("shard '{s}': N is not a number"))?;
    if n == 0 || k == 0 || k > n {
        return Err(format!("shard '{s}': need 1 <= K <= N"));
    }
    Ok((k, n))
}

/// The clips of shard `k` of `n` (1-based): every n-th clip of the list sorted by path, starting
/// at the k-th. Deterministic for a given set of paths, whatever order they were given in; the
/// shards partition the corpus.
pub fn shard<T: AsRef<std::path::Path> + Clone>(clips: &[T], k: usize, n: usize) -> Vec<T> {
    let mut sorted: Vec<T> = clips.to_vec();
    sorted.sort_by(|a, b| a.as_ref().cmp(b.as_ref()));
    sorted
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % n == k - 1)
        .map(|(_, c)| c)
        .collect()
}

/// Gate a corpus against a baseline corpus, clip by clip (clips are matched by their evidence
/// file name): each pair through [`crate::gate::gate`], every id prefixed `CLIP: `. A baseline
/// clip missing from the new corpus, or one the new run could not check, fails; a new clip is
/// informational. `load` reads an evidence file of either corpus (`new` or `baseline` side).
pub fn gate_corpus(
    new: &Summary,
    baseline: &Summary,
    opts: &crate::gate::GateOptions,
    load: &mut dyn FnMut(bool, &str) -> Result<Evidence, crate::Error>,
) -> Result<crate::gate::GateReport, crate::Error> {
    use crate::gate::{gate, Finding, FindingKind, GateReport};
    let mut out = GateReport {
        family: String::new(),
        checked: vec![],
        findings: vec![],
    };
    let key = |c: &ClipSummary| {
        if c.evidence.is_empty() {
            c.audio.clone()
        } else {
            std::path::Path::new(&c.evidence)
                .file_name()
                .map(|f| f.to_string_lossy().to_string())
                .unwrap_or_default()
        }
    };
    for b in &baseline.clips {
        let name = key(b);
        out.checked.push(format!("{name}: verdict"));
        let Some(n) = new.clips.iter().find(|n| key(n) == name) else {
            out.findings.push(Finding {
                checkpoint: Some(format!("{name}: verdict")),
                kind: FindingKind::Removed,
                failing: true,
                message: format!("{name}: in the baseline corpus, absent from the new one"),
            });
            continue;
        };
        if n.evidence.is_empty() || b.evidence.is_empty() {
            if n.evidence.is_empty() {
                out.findings.push(Finding {
                    checkpoint: Some(format!("{name}: verdict")),
                    kind: FindingKind::VerdictWorsened {
                        from: b.verdict,
                        to: n.verdict,
                    },
                    failing: true,
                    message: format!(
                        "{name}: could not be checked: {}",
                        n.error.as_deref().unwrap_or("no evidence")
                    ),
                });
            }
            continue;
        }
        let (ne, be) = (load(true, &n.evidence)?, load(false, &b.evidence)?);
        let r = gate(&ne, &be, opts)?;
        if out.family.is_empty() {
            out.family = r.family.clone();
        }
        out.checked
            .extend(r.checked.iter().map(|c| format!("{name}: {c}")));
        out.findings.extend(r.findings.into_iter().map(|mut f| {
            f.checkpoint = Some(format!(
                "{name}: {}",
                f.checkpoint.as_deref().unwrap_or("verdict")
            ));
            f.message = format!("{name}: {}", f.message);
            f
        }));
    }
    for n in &new.clips {
        let name = key(n);
        if !baseline.clips.iter().any(|b| key(b) == name) {
            out.findings.push(Finding {
                checkpoint: Some(format!("{name}: verdict")),
                kind: FindingKind::Added,
                failing: n.verdict != Verdict::Pass,
                message: format!(
                    "{name}: not in the baseline corpus (verdict {})",
                    n.verdict.as_str()
                ),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_corpus_deterministically() {
        let clips: Vec<String> = ["c.wav", "a.wav", "e.wav", "b.wav", "d.wav"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut all: Vec<String> = (1..=3).flat_map(|k| shard(&clips, k, 3)).collect();
        assert_eq!(shard(&clips, 1, 3), ["a.wav", "d.wav"]);
        all.sort();
        let mut want = clips.clone();
        want.sort();
        assert_eq!(all, want);
        let mut reversed = clips.clone();
        reversed.reverse();
        assert_eq!(shard(&reversed, 2, 3), shard(&clips, 2, 3));
        assert_eq!(parse_shard("2/3"), Ok((2, 3)));
        for bad in ["0/3", "4/3", "3", "a/b", "1/0"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn margins_are_metric_over_bound() {
        let m = margin_of("rel_l2", 2e-5, 5e-5, "x@step0");
        assert!((m.margin - 0.4).abs() < 1e-12);
        assert_eq!(margin_of("kl", 1e-9, 0.0, "x").margin, f64::INFINITY);
        assert_eq!(margin_of("kl", 0.0, 0.0, "x").margin, 0.0);
    }
}
