//! Corpus results: the margin of each checkpoint to its tolerance, one clip's summary line, and
//! the summary of many clips (`xray check --audio A B ... --evidence-dir OUT` writes
//! `OUT/summary.json`; `xray summarize DIR...` merges directories written by shards).
//!
//! A summary is never believed on its own: [`Corpus::load`] derives every row again from the
//! clip's evidence file (whose verdict must be the one its checkpoints imply), refuses a row that
//! claims a result without evidence, and identifies the corpus by content (family, weights and
//! contract sha256 of every clip's evidence), as the gate does; [`merge`] merges shards by that
//! identity, never by the model path as spelled.
//!
//! The margin of a criterion is `metric / bound` for each criterion that decides a checkpoint
//! (rel_l2 against `max_rel_l2`, the outlier fraction against `max_outlier_fraction`, the element
//! closest to its bound, and for logits KL against `max_kl`): a pass needs every margin `<= 1`,
//! and the worst margin says how close a clean run came to failing.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::evidence::{CheckpointEvidence, Evidence, Verdict};
use crate::report::{esc_md, md_code};
use crate::Error;

/// `schema` of [`Summary`].
pub const SUMMARY_SCHEMA: &str = "xray.corpus-summary/v1";

/// How close one criterion of one checkpoint came to its bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Margin {
    /// `rel_l2`, `rel_l2 (logits)`, `logits kl_max`, `outlier fraction`, `element |d| / bound`.
    pub criterion: String,
    /// `value / bound` (`f64::MAX` when the bound is 0 and the value is not: JSON has no
    /// infinity, and a summary must read back).
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
        f64::MAX
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
    /// Its evidence file, relative to the summary's directory (or absolute); empty when the clip
    /// could not be checked.
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
    /// The evidence is an earlier run's, kept by `xray check --resume` (valid, and of this run's
    /// model, contract, policy and options); `seconds` are that run's when its summary listed
    /// them, else 0 (not measured). Written only when true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub resumed: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl ClipSummary {
    /// The summary line of one clip's evidence (its verdict: [`Evidence::effective_verdict`]).
    pub fn of(audio: &str, evidence: &str, e: &Evidence, seconds: f64) -> ClipSummary {
        ClipSummary {
            audio: audio.to_string(),
            evidence: evidence.to_string(),
            verdict: e.effective_verdict(),
            origin: e
                .first_divergence
                .as_ref()
                .map(|f| xray_core::key(&f.checkpoint, f.step).to_string()),
            tokens_equal: e.transcript.as_ref().map(|t| t.tokens_equal),
            worst_margin: worst_margin(e),
            seconds,
            error: None,
            resumed: false,
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
            resumed: false,
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

    /// Parses a `summary.json`: the schema identifier, at least one clip (an empty corpus is
    /// neither a pass nor a failure), a verdict other than `error` only with an evidence file,
    /// and no two rows for one clip or one evidence file. The counts and the worst margin are
    /// not read: [`Summary::new`] derives them from the rows.
    pub fn from_json(text: &str, path: &str) -> Result<Summary, Error> {
        let bad = |reason: String| Error::Invalid {
            path: path.into(),
            reason,
        };
        let s: Summary = crate::evidence::parse_with_schema(text, path, SUMMARY_SCHEMA)?;
        if s.clips.is_empty() {
            return Err(bad(
                "the summary lists no clips: an empty corpus is neither a pass nor a failure"
                    .into(),
            ));
        }
        let mut audio = std::collections::HashSet::new();
        let mut files = std::collections::HashSet::new();
        for c in &s.clips {
            if c.evidence.is_empty() && c.verdict != Verdict::Error {
                return Err(bad(format!(
                    "clip {:?} claims verdict {} without an evidence file: only an `error` row has none",
                    c.audio,
                    c.verdict.as_str()
                )));
            }
            if !audio.insert(c.audio.as_str()) {
                return Err(bad(format!("clip {:?} has two rows", c.audio)));
            }
            if !c.evidence.is_empty() && !files.insert(clip_key(c)) {
                return Err(bad(format!(
                    "two rows name the evidence file {:?}",
                    clip_key(c)
                )));
            }
        }
        Ok(s)
    }

    /// Whether every clip passed (and there was at least one).
    pub fn all_pass(&self) -> bool {
        !self.clips.is_empty() && self.clips.iter().all(|c| c.verdict == Verdict::Pass)
    }

    /// A Markdown table: one row per clip, then the counts and the worst margin.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "# X-Ray corpus: {}\n\n{} clips: {}; token mismatches: {}\n\n",
            md_code(&self.model, false),
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
                m.margin,
                esc_md(&m.criterion),
                m.value,
                m.bound,
                md_code(&m.checkpoint, false),
                md_code(&w.clip, false)
            ));
        }
        s.push_str("| clip | verdict | origin | tokens equal | worst margin | seconds |\n|---|---|---|---|---|---|\n");
        for c in &self.clips {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                md_code(&c.audio, true),
                c.verdict.as_str(),
                match (&c.origin, &c.error) {
                    (Some(o), _) => md_code(o, true),
                    (None, Some(e)) => esc_md(e),
                    (None, None) => "-".into(),
                },
                c.tokens_equal
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                c.worst_margin
                    .as_ref()
                    .map(|m| format!("{:.3} ({})", m.margin, esc_md(&m.criterion)))
                    .unwrap_or_else(|| "-".into()),
                if c.resumed {
                    format!("{:.1} (resumed)", c.seconds)
                } else {
                    format!("{:.1}", c.seconds)
                }
            ));
        }
        s
    }
}

/// The name a clip is matched by between corpora: its evidence file's name, or (a clip that
/// could not be checked) the audio as given.
pub fn clip_key(c: &ClipSummary) -> String {
    if c.evidence.is_empty() {
        c.audio.clone()
    } else {
        Path::new(&c.evidence)
            .file_name()
            .map(|f| f.to_string_lossy().to_string())
            .unwrap_or_else(|| c.evidence.clone())
    }
}

/// A corpus directory read back ([`Corpus::load`]).
#[derive(Debug, Clone)]
pub struct Corpus {
    /// The directory (holding `summary.json`).
    pub dir: PathBuf,
    /// The summary, every row derived again from its evidence (evidence paths as recorded).
    pub summary: Summary,
    /// Per row: the evidence file (resolved against `dir`) and its content; `None` for a clip
    /// that could not be checked.
    pub evidence: Vec<Option<(PathBuf, Evidence)>>,
}

impl Corpus {
    /// Reads `DIR/summary.json` ([`Summary::from_json`]) and every evidence file it names
    /// (relative to `DIR`, or absolute), deriving each row again from its evidence; the clips
    /// must be of one model by content ([`same_model`]).
    pub fn load(dir: &Path) -> Result<Corpus, Error> {
        let p = dir.join("summary.json");
        let text = std::fs::read_to_string(&p).map_err(|e| Error::Invalid {
            path: p.display().to_string(),
            reason: format!("{e} (not a corpus directory written by `xray check --evidence-dir`)"),
        })?;
        let s = Summary::from_json(&text, &p.display().to_string())?;
        let mut rows = Vec::with_capacity(s.clips.len());
        let mut evidence = Vec::with_capacity(s.clips.len());
        for c in s.clips {
            if c.evidence.is_empty() {
                rows.push(c);
                evidence.push(None);
                continue;
            }
            let path = dir.join(&c.evidence);
            let e = Evidence::load(&path).map_err(|e| Error::Invalid {
                path: p.display().to_string(),
                reason: format!("clip {:?}: {e}", c.audio),
            })?;
            rows.push(ClipSummary {
                resumed: c.resumed,
                ..ClipSummary::of(&c.audio, &c.evidence, &e, c.seconds)
            });
            evidence.push(Some((path, e)));
        }
        same_model(evidence.iter().flatten().map(|(p, e)| (p.as_path(), e)))?;
        Ok(Corpus {
            dir: dir.to_path_buf(),
            summary: Summary::new(&s.model, s.shard, s.load_seconds, rows),
            evidence,
        })
    }

    /// Every evidence file this corpus reads (for the output checks).
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.evidence.iter().flatten().map(|(p, _)| p.as_path())
    }
}

/// Every evidence document must describe the same model by content: the same family, and the
/// same weights and contract sha256, recorded (a sha256 missing counts as different, as in the
/// gate). The error names the file that differs from the first.
pub fn same_model<'a>(
    mut items: impl Iterator<Item = (&'a Path, &'a Evidence)>,
) -> Result<(), Error> {
    let Some((first_path, first)) = items.next() else {
        return Ok(());
    };
    let check = |p: &Path, e: &Evidence| -> Result<(), Error> {
        // The gate's identity, but for the audio (a corpus's clips differ by design).
        let (fixed, input) = crate::gate::identity_differences(&e.run, &first.run, "");
        let why: Vec<String> = fixed
            .into_iter()
            .chain(input.into_iter().filter(|d| !d.starts_with("audio")))
            .collect();
        if why.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid {
                path: p.display().to_string(),
                reason: format!(
                    "another model than {}: {} (one corpus, one model, identified by content)",
                    first_path.display(),
                    why.join(", ")
                ),
            })
        }
    };
    check(first_path, first)?;
    for (p, e) in items {
        check(p, e)?;
    }
    Ok(())
}

/// `path` made absolute and free of `.` and `..`, every existing prefix with its symbolic links
/// resolved (what a later `..` from it means), the rest taken as written.
pub fn canonical_path(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    // The longest existing prefix, canonicalized; the remaining components appended lexically.
    let comps: Vec<Component> = abs.components().collect();
    for cut in (1..=comps.len()).rev() {
        let head: PathBuf = comps[..cut].iter().collect();
        if let Ok(mut c) = head.canonicalize() {
            for comp in &comps[cut..] {
                match comp {
                    Component::CurDir => {}
                    Component::ParentDir => {
                        c.pop();
                    }
                    other => c.push(other.as_os_str()),
                }
            }
            return c;
        }
    }
    abs
}

/// `target` relative to the directory `base` (both through [`canonical_path`]), or `target`
/// absolute when they share no root.
pub fn relative_path(target: &Path, base: &Path) -> PathBuf {
    let (t, b) = (canonical_path(target), canonical_path(base));
    let (tc, bc): (Vec<Component>, Vec<Component>) =
        (t.components().collect(), b.components().collect());
    let common = tc.iter().zip(&bc).take_while(|(x, y)| x == y).count();
    if common == 0 || !matches!(tc.first(), Some(Component::RootDir | Component::Prefix(_))) {
        return t;
    }
    let mut out = PathBuf::new();
    for _ in common..bc.len() {
        out.push("..");
    }
    for c in &tc[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// Merges corpora (the shards of one corpus) into one summary: every clip's row derived from
/// its evidence, the clips of one model by content ([`same_model`]), no clip twice (the same
/// audio as given, the same evidence file name, or the same audio sha256). With `out`, the
/// summary file's path, evidence paths are stored relative to its directory (or absolute), so
/// the merged summary reads back from anywhere; without it, as resolved.
pub fn merge(corpora: &[Corpus], out: Option<&Path>) -> Result<Summary, Error> {
    same_model(
        corpora
            .iter()
            .flat_map(|c| c.evidence.iter().flatten().map(|(p, e)| (p.as_path(), e))),
    )?;
    let base = out.map(|o| match o.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    });
    let mut rows: Vec<ClipSummary> = Vec::new();
    let mut seen: Vec<(String, String, Option<String>, String)> = Vec::new();
    for c in corpora {
        let where_ = c.dir.join("summary.json").display().to_string();
        for (row, ev) in c.summary.clips.iter().zip(&c.evidence) {
            let key = clip_key(row);
            let sha = ev.as_ref().and_then(|(_, e)| e.run.audio_sha256.clone());
            if let Some((_, _, _, other)) = seen
                .iter()
                .find(|(a, k, h, _)| *a == row.audio || *k == key || (sha.is_some() && *h == sha))
            {
                return Err(Error::Invalid {
                    path: where_,
                    reason: format!(
                        "clip {:?} ({key}) is also in {other}: a clip may be in one of the merged corpora only",
                        row.audio
                    ),
                });
            }
            seen.push((row.audio.clone(), key, sha, where_.clone()));
            let mut row = row.clone();
            if let Some((p, _)) = ev {
                row.evidence = match &base {
                    Some(b) => relative_path(p, b),
                    None => p.clone(),
                }
                .display()
                .to_string();
            }
            rows.push(row);
        }
    }
    let model = corpora
        .first()
        .map(|c| c.summary.model.clone())
        .unwrap_or_default();
    Ok(Summary::new(&model, None, None, rows))
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

/// Gate a corpus against a baseline corpus ([`Corpus::load`]: rows derived from the evidence),
/// clip by clip (clips are matched by their evidence file name): each pair through
/// [`crate::gate::gate`], every id prefixed `CLIP: `. A baseline clip missing from the new
/// corpus, or one the new run could not check, fails; a new clip is informational unless it did
/// not pass. The corpora must be of one family and contract (and weights, unless
/// `allow_different_input`), even when no clip pairs up.
pub fn gate_corpus(
    new: &Corpus,
    baseline: &Corpus,
    opts: &crate::gate::GateOptions,
) -> Result<crate::gate::GateReport, Error> {
    use crate::gate::{gate, Finding, FindingKind, GateReport};
    let mut out = GateReport {
        family: String::new(),
        checked: vec![],
        findings: vec![],
    };
    if let (Some((_, n)), Some((_, b))) = (
        new.evidence.iter().flatten().next(),
        baseline.evidence.iter().flatten().next(),
    ) {
        crate::gate::same_model(n, b, opts)?;
    }
    for (b, be) in baseline.summary.clips.iter().zip(&baseline.evidence) {
        let name = clip_key(b);
        out.checked.push(format!("{name}: verdict"));
        let Some(i) = new.summary.clips.iter().position(|n| clip_key(n) == name) else {
            out.findings.push(Finding {
                checkpoint: Some(format!("{name}: verdict")),
                kind: FindingKind::Removed,
                failing: true,
                message: format!("{name}: in the baseline corpus, absent from the new one"),
            });
            continue;
        };
        let (n, ne) = (&new.summary.clips[i], &new.evidence[i]);
        let (Some((_, ne)), Some((_, be))) = (ne, be) else {
            if ne.is_none() {
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
        };
        let r = gate(ne, be, opts)?;
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
    for n in &new.summary.clips {
        let name = clip_key(n);
        if !baseline.summary.clips.iter().any(|b| clip_key(b) == name) {
            out.checked.push(format!("{name}: verdict"));
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

    /// Issue 24 item 11: clip names, errors and the model path are untrusted text in the
    /// corpus Markdown: no raw HTML, and every row keeps its seven cell borders.
    #[test]
    fn corpus_markdown_escapes_what_it_did_not_write() {
        let evil = "a`|<img src=x onerror=alert(1)>``.wav";
        let s = Summary::new(
            evil,
            None,
            None,
            vec![ClipSummary::failed(evil, "<script>|[x](javascript:y)", 0.0)],
        );
        let md = s.markdown();
        assert!(
            md.contains("&lt;script&gt;\\|\\[x\\](javascript:y)"),
            "{md}"
        );
        let row = md.lines().last().unwrap();
        let borders = row.matches('|').count() - row.matches("\\|").count();
        assert_eq!(borders, 7, "{row}");
        assert!(row.starts_with("| ```a`\\|<img"), "{row}");
    }

    #[test]
    fn margins_are_metric_over_bound() {
        let m = margin_of("rel_l2", 2e-5, 5e-5, "x@step0");
        assert!((m.margin - 0.4).abs() < 1e-12);
        assert_eq!(margin_of("kl", 1e-9, 0.0, "x").margin, f64::MAX);
        assert_eq!(margin_of("kl", 0.0, 0.0, "x").margin, 0.0);
    }
}
