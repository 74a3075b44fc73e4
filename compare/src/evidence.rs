//! Evidence JSON, schema `xray.evidence/v1` (`docs/evidence-schema.md`,
//! `docs/evidence.schema.json`): serde types, atomic write, and checked read.
//!
//! Every float in the document is finite (the metrics module guarantees it), so the JSON never
//! holds `null` where a number is expected.

use std::io::Write;
use std::path::Path;
use xray_core::Step;

use serde::{Deserialize, Serialize};

use crate::localize::{DrillDown, ErrorProfile, Status};
use crate::metrics::Metrics;
use crate::signatures::Explanation;
use crate::tolerance::{ResolvedTolerance, Tolerance};
use crate::Error;

/// Schema identifier written in `schema`.
pub const SCHEMA: &str = "xray.evidence/v1";

/// Overall outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every checkpoint passes, capture is neutral and the transcripts agree.
    Pass,
    /// At least one checkpoint is not `pass`, capture changed the outputs, or the tokens differ.
    Diverged,
    /// The run could not complete (see `notes`).
    Error,
}

impl Verdict {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Diverged => "diverged",
            Verdict::Error => "error",
        }
    }
}

/// Versions of the Python side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OracleVersions {
    /// Python version.
    pub python: Option<String>,
    /// torch version.
    pub torch: Option<String>,
    /// transformers version.
    pub transformers: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What was run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Model family (`whisper`).
    pub family: String,
    /// Model directory or model id.
    pub model_path: String,
    /// sha256 of the weights file, when known.
    pub weights_sha256: Option<String>,
    /// sha256 of the audio bytes, when known.
    pub audio_sha256: Option<String>,
    /// Runtime version (or the producer of a foreign dump).
    pub runtime_version: String,
    /// Oracle versions (`null` for an offline compare without them).
    pub oracle: Option<OracleVersions>,
    /// Whether the run used isolated mode (`local_metrics` present).
    #[serde(default)]
    pub isolated: bool,
    /// Whether the comparison was made from per-checkpoint summaries (stats-only capture or
    /// dumps: metrics `null`, each checkpoint judged by the estimated rel_l2 in its note).
    /// Written only when true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stats_only: bool,
    /// sha256 of the checkpoint contract the comparison was made through (the gate refuses to
    /// compare evidence made through different contracts). `None` in evidence written before it
    /// was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract_sha256: Option<String>,
    /// The dumps compared, when they were written (`xray check --dumps DIR`) or given (`xray
    /// compare REF GOT`): what `xray repro` cuts a case from. Written only when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dumps: Option<RunDumps>,
    /// The engine's own weights file, when its dump declares one (`engine_weights`: an engine on
    /// converted weights; `weights_sha256` is then the HF weights they correspond to). Written
    /// only when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_weights: Option<xray_core::dump::EngineWeights>,
    /// Where the reference came from when `xray check --reference-cache DIR` was given: its
    /// content key and whether it was read from the cache (no oracle run) or computed and
    /// stored. Written only with a cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_cache: Option<ReferenceCache>,
    /// What `xray check` was asked to do besides its inputs (the policy, the options that change
    /// the evidence): `xray check --resume` keeps a clip's evidence only when these are the
    /// run's. Written by `xray check`; not gate identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<CheckSettings>,
}

/// `run.reference_cache`: the reference's cache key and whether it was a hit, then the other
/// references the check read through the cache (calibration, reference variants, drill-down
/// points), each with its own key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReferenceCache {
    /// The cache directory as given.
    pub dir: String,
    /// The reference's content key (64 hex digits: `docs/reference-cache.md`).
    pub key: String,
    /// Read from the cache (`true`: the oracle did not run for it) or computed by the oracle and
    /// stored (`false`).
    pub hit: bool,
    /// The check's other references through the cache, in the order they were read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<CacheLookup>,
}

/// One reference read through the cache besides the check's own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheLookup {
    /// What it was for (`calibration (float64)`, `reference variant int8`, `drill-down points`).
    pub what: String,
    /// Its content key.
    pub key: String,
    /// Read from the cache, or computed and stored.
    pub hit: bool,
}

/// `run.settings`: the options of `xray check` that change its evidence, besides its inputs
/// (model, audio, contract: the gate's identity) and what `run` records already (`isolated`,
/// `stats_only`): the tolerance policy by its hash and the [`RecordedOptions`] (serialized
/// inline).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckSettings {
    /// sha256 of the tolerance policy in force (`Policy::sha256`: the built-in one included).
    pub policy_sha256: String,
    /// The check's options, as it ran with them.
    #[serde(flatten)]
    pub options: RecordedOptions,
}

/// The options of a check that its evidence records: the harness's `CheckOptions` holds them
/// as they are, so an option it takes here is one `xray check --resume` compares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedOptions {
    /// `--max-steps` (null: the model's own limit).
    pub max_steps: Option<usize>,
    /// `--calibrate`: tolerances against the reference's own float32-vs-float64 noise floor.
    pub calibrate: bool,
    /// `--teacher-force`: the reference's CTC hypothesis fed to the runtime
    /// (non-autoregressive families).
    pub teacher_force: bool,
    /// `--ops`: every op-level point captured from the start.
    pub ops: bool,
    /// The drill-down ran when needed (`false`: `--no-drill`).
    pub drill: bool,
    /// Faults planted (`--inject`), as given.
    pub faults: Vec<String>,
    /// Reference variants measured (`--reference-variant`: `int8`, `int8_conv`, `int8_w8a8`,
    /// `f16`, `bf16`; [`crate::variant`]).
    pub reference_variants: Vec<String>,
    /// The oracle's torch threads.
    pub threads: Option<usize>,
}

impl Default for RecordedOptions {
    /// What a check does unasked: the drill-down on, nothing else.
    fn default() -> Self {
        RecordedOptions {
            max_steps: None,
            calibrate: false,
            teacher_force: false,
            ops: false,
            drill: true,
            faults: Vec::new(),
            reference_variants: Vec::new(),
            threads: None,
        }
    }
}

impl CheckSettings {
    /// The fields that differ from `other`'s, as `name this vs earlier other` (empty when equal).
    pub fn differences(&self, other: &CheckSettings) -> Vec<String> {
        let (a, b) = (serde_json::json!(self), serde_json::json!(other));
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
            return vec!["settings do not serialize".into()];
        };
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(*v))
            .map(|(k, v)| {
                format!(
                    "{k} {v} vs earlier {}",
                    b.get(k).cloned().unwrap_or(serde_json::Value::Null)
                )
            })
            .collect()
    }
}

/// Where the two dumps of a run are (absolute paths when X-Ray could resolve them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunDumps {
    /// The reference dump directory.
    pub reference: String,
    /// The dump of the engine under test.
    pub got: String,
    /// The weights sha256 the dump under test declares, when it is not the reference's
    /// (`run.weights_sha256`, the evidence's identity): a converted or edited copy of the
    /// weights, said in a note; `xray repro` holds the dump to it. Written only then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub got_weights_sha256: Option<String>,
}

/// Tolerance in force for a checkpoint and where it came from: the [`Tolerance`]'s fields
/// (`atol`, `rtol`, `max_outlier_fraction`, `max_rel_l2`, `max_kl`) and `source`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToleranceEvidence {
    /// The bounds (serialized inline).
    #[serde(flatten)]
    pub bounds: Tolerance,
    /// `default:<dtype>`, `policy:<glob>` or `calibrated:<k>x noise floor`.
    pub source: String,
}

impl From<&ResolvedTolerance> for ToleranceEvidence {
    fn from(r: &ResolvedTolerance) -> Self {
        ToleranceEvidence {
            bounds: r.tolerance,
            source: r.source.to_string(),
        }
    }
}

impl ToleranceEvidence {
    /// The tolerance without its source.
    pub fn tolerance(&self) -> Tolerance {
        self.bounds
    }
}

/// One checkpoint at one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointEvidence {
    /// Canonical name.
    pub name: String,
    /// Step.
    pub step: Step,
    /// Producing op.
    pub producer: String,
    /// Consumer ops.
    pub consumers: Vec<String>,
    /// Canonical shape.
    pub shape: Vec<usize>,
    /// Dtype (`f32`, ...).
    pub dtype: String,
    /// Layout (`token_major`, `head_major`, `channel_major`, `plain`).
    pub layout: String,
    /// Cumulative metrics (`null` when missing or not aligned).
    pub metrics: Option<Metrics>,
    /// Local metrics from isolated mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_metrics: Option<Metrics>,
    /// Tolerance in force.
    pub tolerance: ToleranceEvidence,
    /// Final status.
    pub status: Status,
    /// For `propagated`: the root checkpoints (`name@stepK`) it inherits from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub propagated_from: Vec<String>,
    /// Why a checkpoint is missing or not aligned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CheckpointEvidence {
    /// `name@stepK`.
    pub fn id(&self) -> String {
        xray_core::key(&self.name, self.step).to_string()
    }
}

/// One input edge of the origin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputEvidence {
    /// Input checkpoint name.
    pub checkpoint: String,
    /// Its step.
    pub step: Step,
    /// Its status.
    pub status: Status,
}

/// What kind of divergence the origin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceKind {
    /// The values differ beyond tolerance.
    #[default]
    Values,
    /// The shapes differ (a data-dependent shape divergence, e.g. a cache one position short) or
    /// the layout cannot be aligned.
    Shape,
    /// The checkpoint is absent from a run that declares it (`xray check`, `--require-all`).
    Missing,
    /// Every observed checkpoint passes but the token streams part: the origin is the logits of
    /// the parting step (or the unobserved region before them).
    Tokens,
    /// Capture changed the runtime's outputs.
    Capture,
}

/// The unobserved stretch of the graph in front of the origin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// "between A@0 (pass) and B@0 (fail)": the nearest observed checkpoints and the origin.
    pub summary: String,
    /// The nearest observed checkpoints upstream (`pass`, or fed with the reference's tensor).
    pub after: Vec<InputEvidence>,
    /// The unobserved checkpoints crossed, compressed (`audio.encoder.layer.0..3.out`, `@1..4`
    /// for steps; no `@` = at step 0 or at every step they exist).
    pub unobserved: Vec<String>,
    /// How many `(checkpoint, step)` pairs `unobserved` stands for.
    pub unobserved_count: usize,
}

/// The localized origin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstDivergence {
    /// Origin checkpoint name.
    pub checkpoint: String,
    /// Its step.
    pub step: Step,
    /// Producing op (the suspect).
    pub producer: String,
    /// Its input edges and their status (all `pass` by construction).
    pub inputs: Vec<InputEvidence>,
    /// Divergence signature.
    pub explanation: Option<Explanation>,
    /// What diverged: values, shape, presence, tokens or capture.
    #[serde(default)]
    pub kind: DivergenceKind,
    /// The unobserved region before the origin, when its inputs were not all observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    /// The ops that may hold the bug, in graph order: the producers of the unobserved checkpoints
    /// on paths from the nearest passing observed ones to the origin, then the origin's producer
    /// (from the contract's checkpoint graph; see `docs/evidence-schema.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspects: Vec<String>,
    /// The op-level origin inside the region: the first op-level point that differs at this
    /// step, the engine op(s) before it and its signature (`xray check` drills down by default;
    /// `xray compare` when both dumps carry points).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<crate::ops::OpDivergence>,
}

/// How much of the contract the dump under test observed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    /// `(checkpoint, step)` pairs compared (any status but `unobserved` / `not_comparable`).
    pub observed: usize,
    /// Pairs absent from the dump under test.
    pub unobserved: usize,
    /// Pairs after the token streams parted.
    pub not_comparable: usize,
    /// The unobserved pairs, compressed to ranges ([`compress_ids`]).
    pub unobserved_names: Vec<String>,
}

/// An edge the engine under test was fed with the reference's tensor (its manifest's
/// `extra.fed`): its consumers saw the reference's value, so their error is local.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FedEdge {
    /// The checkpoint fed (`tokens` for teacher forcing).
    pub checkpoint: String,
    /// The dump the engine recorded it in (the one under test, or an `--isolated` one).
    pub dump: String,
    /// Where the fed tensor came from, as the engine recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Which of the engine's entry points took it, as the engine recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub into: Option<String>,
}

/// How the two token streams line up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenAlignment {
    /// The dump under test was teacher-forced on the reference's tokens (`extra.fed.tokens`):
    /// every step is comparable; `parted_at_step` then compares its own per-step argmax
    /// (`extra.step_argmax`) with the reference's tokens.
    pub teacher_forced: bool,
    /// Forced prefix length (tokens before step 0's output).
    pub prefix: usize,
    /// The first step whose output token differs (`None`: the streams agree).
    pub parted_at_step: Option<Step>,
    /// The reference's token at that step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_token: Option<i64>,
    /// The candidate's token at that step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_token: Option<i64>,
    /// Steps after `parted_at_step`: computed from different tokens, `not_comparable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_comparable_steps: Option<String>,
}

/// Transcripts of both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// Runtime (free-running greedy) transcript.
    pub runtime: String,
    /// Reference transcript.
    pub reference: String,
    /// Whether the token sequences are equal.
    pub tokens_equal: bool,
    /// First step whose logits disagree in argmax under teacher forcing.
    pub first_divergent_step: Option<Step>,
}

/// The whole evidence document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Outcome.
    pub verdict: Verdict,
    /// What was run.
    pub run: Run,
    /// Checkpoints in topological order (step-major).
    pub checkpoints: Vec<CheckpointEvidence>,
    /// The origin, or `null`.
    pub first_divergence: Option<FirstDivergence>,
    /// Independent failures after the origin (status `fail`), described like it (region,
    /// suspects): in a run fed the reference's tensor, the fed stage's own divergence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub independent: Vec<FirstDivergence>,
    /// Error per layer and step.
    pub error_profile: ErrorProfile,
    /// Drill-down from the first divergent token step.
    #[serde(default)]
    pub drill_down: Option<DrillDown>,
    /// Whether capture left the final outputs bit-identical (`null`: not measured).
    pub capture_neutral: Option<bool>,
    /// Transcripts (`null` for non-generative families or offline compares without tokens).
    pub transcript: Option<Transcript>,
    /// Free-form notes (errors, skipped checks).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Observed / unobserved counts (`null` in evidence written before partial coverage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
    /// Edges fed with the reference's tensor (isolation of an outside engine).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fed: Vec<FedEdge>,
    /// Where the token streams part and which steps were compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenAlignment>,
    /// Every op-level point both dumps hold, compared, with the alignment faults (absent when
    /// either dump holds no op-level point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_points: Option<crate::ops::OpPoints>,
    /// The engine against reference variants (`xray compare --variant DIR`: the HF reference with
    /// its weights on a named grid), each checkpoint measured against both references. Written
    /// only when given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_variants: Vec<crate::variant::VariantEvidence>,
    /// The ops the dump under test declares computed below f32 (`extra.precision`) and what the
    /// policy accepted of them (absent when it declares none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<crate::precision::PrecisionEvidence>,
    /// Every module's local error (`xray compare --local-errors`): each re-run on the engine's
    /// own input, judged at f32 bounds; a convicted op no declaration accounts for (declared f32,
    /// or declared below f32 and not reproduced by that precision replayed) makes the verdict
    /// `diverged`. Written only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_errors: Option<crate::mechanism::LocalErrors>,
}

/// Parses JSON text whose `schema` must be `expected` (checked before the rest is read, so a file
/// of another kind is named as such); `path` names the file in errors.
pub(crate) fn parse_with_schema<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &str,
    expected: &str,
) -> Result<T, Error> {
    let json = |source| Error::Json {
        path: path.into(),
        source,
    };
    let v: serde_json::Value = serde_json::from_str(text).map_err(json)?;
    let found = v.get("schema").and_then(|s| s.as_str()).unwrap_or("");
    if found != expected {
        return Err(Error::Schema {
            path: path.into(),
            found: found.into(),
            expected: expected.into(),
        });
    }
    serde_json::from_value(v).map_err(json)
}

impl Evidence {
    /// The verdict implied by the content: `diverged` if any observed checkpoint is not `pass`
    /// (`unobserved` and `not_comparable` are neither), capture is not neutral, or the token
    /// sequences differ; `error` when no checkpoint was observed (none at all included: a pass
    /// needs one); otherwise `pass`. (`error` is also set by the caller when the run did not
    /// complete.)
    pub fn derive_verdict(&self) -> Verdict {
        if !self.checkpoints.iter().any(|c| c.status.is_observed()) {
            return Verdict::Error;
        }
        let diverged = self
            .checkpoints
            .iter()
            .any(|c| c.status.is_observed() && c.status != Status::Pass)
            || self.capture_neutral == Some(false)
            || self.transcript.as_ref().is_some_and(|t| !t.tokens_equal)
            || self.unaccounted_local_errors() > 0;
        if diverged {
            Verdict::Diverged
        } else {
            Verdict::Pass
        }
    }

    /// The verdict every reader acts on (summary rows, reports, the gate): the one the content
    /// implies ([`Evidence::derive_verdict`]), or `error` when the producer recorded that the
    /// run did not complete. Never the recorded `pass` of content that does not pass.
    pub fn effective_verdict(&self) -> Verdict {
        match self.verdict {
            Verdict::Error => Verdict::Error,
            _ => self.derive_verdict(),
        }
    }

    /// Why the recorded verdict cannot be believed (`None` when it is the content's, or
    /// `error`): e.g. `verdict "pass" disagrees with its content (1 origin, 113 propagated:
    /// diverged)`.
    pub fn verdict_disagreement(&self) -> Option<String> {
        let derived = self.effective_verdict();
        if derived == self.verdict {
            return None;
        }
        let mut why: Vec<String> = Vec::new();
        let mut counts: Vec<(Status, usize)> = Vec::new();
        for c in self
            .checkpoints
            .iter()
            .filter(|c| c.status.is_observed() && c.status != Status::Pass)
        {
            match counts.iter_mut().find(|(s, _)| *s == c.status) {
                Some((_, n)) => *n += 1,
                None => counts.push((c.status, 1)),
            }
        }
        why.extend(counts.iter().map(|(s, n)| format!("{n} {}", s.as_str())));
        if self.capture_neutral == Some(false) {
            why.push("capture not neutral".into());
        }
        if self.transcript.as_ref().is_some_and(|t| !t.tokens_equal) {
            why.push("tokens differ".into());
        }
        let local = self.unaccounted_local_errors();
        if local > 0 {
            why.push(format!(
                "{local} local error(s) beyond f32 bounds that no declared precision accounts for"
            ));
        }
        if derived == Verdict::Error {
            why.push(format!(
                "no observed checkpoint among {}",
                self.checkpoints.len()
            ));
        }
        if why.is_empty() {
            why.push("every observed checkpoint passes".into());
        }
        Some(format!(
            "verdict \"{}\" disagrees with its content ({}: {})",
            self.verdict.as_str(),
            why.join(", "),
            derived.as_str()
        ))
    }

    /// Module-steps whose local error convicts an op no declaration accounts for
    /// ([`crate::mechanism::LocalErrors::unaccounted`]; 0 without `local_errors`).
    pub fn unaccounted_local_errors(&self) -> usize {
        self.local_errors
            .as_ref()
            .map_or(0, |l| l.unaccounted().count())
    }

    /// Pretty JSON text (with a trailing newline).
    pub fn to_json(&self) -> Result<String, Error> {
        let mut s = serde_json::to_string_pretty(self).map_err(|source| Error::Json {
            path: "<evidence>".into(),
            source,
        })?;
        s.push('\n');
        Ok(s)
    }

    /// Parses evidence text, checking the schema identifier, that no checkpoint appears twice
    /// (the gate matches them by id) and that the recorded verdict is the one its checkpoints
    /// imply ([`Evidence::verdict_disagreement`]).
    pub fn from_json(text: &str, path: &str) -> Result<Evidence, Error> {
        let e: Evidence = parse_with_schema(text, path, SCHEMA)?;
        let mut ids = std::collections::HashSet::new();
        if let Some(c) = e
            .checkpoints
            .iter()
            .find(|c| !ids.insert((&c.name, c.step)))
        {
            return Err(Error::Invalid {
                path: path.into(),
                reason: format!(
                    "checkpoint {} appears twice; edited or not written by X-Ray, refused",
                    c.id()
                ),
            });
        }
        if let Some(why) = e.verdict_disagreement() {
            return Err(Error::Invalid {
                path: path.into(),
                reason: format!("{why}; edited or not written by X-Ray, refused"),
            });
        }
        Ok(e)
    }

    /// Reads and parses an evidence file.
    pub fn load(path: &Path) -> Result<Evidence, Error> {
        let (p, text) = crate::error::read_text(path)?;
        Evidence::from_json(&text, &p)
    }

    /// Writes the evidence atomically (see [`write_atomic`]).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        write_atomic(path, self.to_json()?.as_bytes())
    }
}

/// Coverage of a list of checkpoints ([`Coverage`]).
pub fn coverage_of(checkpoints: &[CheckpointEvidence]) -> Coverage {
    let count = |s: Status| checkpoints.iter().filter(|c| c.status == s).count();
    // Steps that are not comparable do not count against "every step" in the names.
    let all: Vec<(&str, Step)> = checkpoints
        .iter()
        .filter(|c| c.status != Status::NotComparable)
        .map(|c| (c.name.as_str(), c.step))
        .collect();
    let sel: Vec<(&str, Step)> = checkpoints
        .iter()
        .filter(|c| c.status == Status::Unobserved)
        .map(|c| (c.name.as_str(), c.step))
        .collect();
    Coverage {
        observed: checkpoints
            .iter()
            .filter(|c| c.status.is_observed())
            .count(),
        unobserved: count(Status::Unobserved),
        not_comparable: count(Status::NotComparable),
        unobserved_names: compress_ids(&all, &sel),
    }
}

/// Integers as inclusive ranges: `[0, 1, 2, 3, 5]` -> `0..3,5`.
pub fn int_ranges(v: &[Step]) -> String {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}..{}", v[i], v[j])
        } else {
            v[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The first dot-separated numeric component of a name: `(prefix, number, rest)`, e.g.
/// `audio.encoder.layer.2.out` -> `("audio.encoder.layer.", 2, ".out")`.
fn split_index(name: &str) -> Option<(&str, usize, &str)> {
    let mut start = 0;
    for part in name.split('.') {
        if let Ok(n) = part.parse::<usize>() {
            return Some((&name[..start], n, &name[start + part.len()..]));
        }
        start += part.len() + 1;
    }
    None
}

/// Compresses `selected` `(name, step)` pairs, a subset of `all`, to short patterns, in order of
/// first appearance: a name's steps become `@1..4` (left out when the name is selected at every
/// step it has in `all`); a layer whose every checkpoint is selected becomes `layer.N.*`; names
/// differing in one layer index become a range (`audio.encoder.layer.0..3.*`).
pub fn compress_ids(all: &[(&str, Step)], selected: &[(&str, Step)]) -> Vec<String> {
    use std::collections::{BTreeSet, HashMap};
    let mut steps_all: HashMap<&str, BTreeSet<Step>> = HashMap::new();
    for (n, s) in all {
        steps_all.entry(n).or_default().insert(*s);
    }
    let mut order: Vec<&str> = Vec::new();
    let mut steps_sel: HashMap<&str, BTreeSet<Step>> = HashMap::new();
    for (n, s) in selected {
        let e = steps_sel.entry(n).or_default();
        if e.is_empty() {
            order.push(n);
        }
        e.insert(*s);
    }
    let label = |n: &str| -> String {
        let sel = &steps_sel[n];
        if steps_all.get(n) == Some(sel) {
            String::new()
        } else {
            format!("@{}", int_ranges(&sel.iter().copied().collect::<Vec<_>>()))
        }
    };
    // Level 1: a layer prefix (`...layer.N.`) whose every name is selected with one label -> `*`.
    let mut names: Vec<(String, String)> = Vec::new();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for &n in &order {
        if done.contains(n) {
            continue;
        }
        let lab = label(n);
        if let Some((pre, idx, rest)) = split_index(n) {
            if !rest.is_empty() {
                let layer = format!("{pre}{idx}.");
                let under: Vec<&str> = steps_all
                    .keys()
                    .copied()
                    .filter(|m| m.starts_with(&layer))
                    .collect();
                if under.len() > 1
                    && under
                        .iter()
                        .all(|m| steps_sel.contains_key(m) && label(m) == lab)
                {
                    done.extend(under);
                    names.push((format!("{layer}*"), lab));
                    continue;
                }
            }
        }
        done.insert(n);
        names.push((n.to_string(), lab));
    }
    // Level 2: names equal but for one index (and with one label) -> a range.
    let mut out: Vec<String> = Vec::new();
    let mut groups: HashMap<(String, String, String), usize> = HashMap::new();
    let mut members: Vec<(String, String, String, Vec<usize>)> = Vec::new();
    for (n, lab) in names {
        match split_index(&n) {
            Some((pre, idx, rest)) => {
                let key = (pre.to_string(), rest.to_string(), lab.clone());
                match groups.get(&key) {
                    Some(&g) => members[g].3.push(idx),
                    None => {
                        groups.insert(key, members.len());
                        members.push((pre.to_string(), rest.to_string(), lab, vec![idx]));
                        out.push(String::new());
                    }
                }
            }
            None => {
                members.push((n, String::new(), lab, vec![]));
                out.push(String::new());
            }
        }
    }
    for (slot, (pre, rest, lab, idx)) in out.iter_mut().zip(members) {
        *slot = if idx.is_empty() {
            format!("{pre}{lab}")
        } else {
            format!("{pre}{}{rest}{lab}", int_ranges(&idx))
        };
    }
    out
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new one, never a part:
/// a temporary file in the same directory, `fsync`, rename over `path`, then `fsync` of the
/// directory (on Unix).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".xray-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    #[cfg(unix)]
    {
        // Temporary files are created 0600; the result is an ordinary readable file.
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    #[cfg(unix)]
    {
        if let Ok(d) = std::fs::File::open(dir) {
            // Best effort: some filesystems refuse fsync on directories.
            let _ = d.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A checkpoint `name@step0` with `status`, no metrics, f32 bounds `atol 1e-4, rtol 1e-3`.
    pub(crate) fn checkpoint(name: &str, status: Status) -> CheckpointEvidence {
        CheckpointEvidence {
            name: name.into(),
            step: 0,
            producer: "op".into(),
            consumers: vec![],
            shape: vec![1],
            dtype: "f32".into(),
            layout: "plain".into(),
            metrics: None,
            local_metrics: None,
            tolerance: ToleranceEvidence {
                bounds: Tolerance {
                    atol: 1e-4,
                    rtol: 1e-3,
                    max_outlier_fraction: 0.0,
                    max_rel_l2: None,
                    max_kl: None,
                },
                source: "default:f32".into(),
            },
            status,
            propagated_from: vec![],
            note: None,
        }
    }

    pub(crate) fn tiny() -> Evidence {
        Evidence {
            schema: SCHEMA.into(),
            verdict: Verdict::Pass,
            run: Run {
                family: "whisper".into(),
                model_path: "m".into(),
                runtime_version: "xray-runtime 0.1.0".into(),
                ..Default::default()
            },
            checkpoints: vec![],
            first_divergence: None,
            independent: vec![],
            error_profile: ErrorProfile::default(),
            drill_down: None,
            capture_neutral: None,
            transcript: None,
            notes: vec![],
            coverage: None,
            fed: vec![],
            tokens: None,
            op_points: None,
            reference_variants: vec![],
            precision: None,
            local_errors: None,
        }
    }

    #[test]
    fn ids_compress_to_layer_and_step_ranges() {
        let mut all: Vec<(&str, Step)> = vec![("audio.frontend.mel", 0)];
        let enc = [
            "audio.encoder.layer.0.out",
            "audio.encoder.layer.1.out",
            "audio.encoder.layer.2.out",
            "audio.encoder.layer.3.out",
        ];
        all.extend(enc.iter().map(|n| (*n, 0)));
        let dec = [
            "audio.decoder.layer.0.a",
            "audio.decoder.layer.0.b",
            "audio.decoder.layer.1.a",
            "audio.decoder.layer.1.b",
        ];
        for s in 0..6 {
            all.extend(dec.iter().map(|n| (*n, s)));
        }
        // Every encoder layer, every decoder checkpoint at every step, one name at steps 1..4.
        let mut sel: Vec<(&str, Step)> = enc.iter().map(|n| (*n, 0)).collect();
        for s in 0..6 {
            sel.extend(dec[..3].iter().map(|n| (*n, s)));
        }
        sel.extend((1..5).map(|s| (dec[3], s)));
        assert_eq!(
            compress_ids(&all, &sel),
            [
                "audio.encoder.layer.0..3.out",
                "audio.decoder.layer.0.*",
                "audio.decoder.layer.1.a",
                "audio.decoder.layer.1.b@1..4"
            ]
        );
        assert_eq!(int_ranges(&[5, 0, 1, 2, 3, 7, 8]), "0..3,5,7..8");
        assert_eq!(
            compress_ids(&all, &[("audio.frontend.mel", 0)]),
            ["audio.frontend.mel"]
        );
    }

    #[test]
    fn round_trip_and_atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.json");
        let mut e = tiny();
        e.checkpoints = vec![checkpoint("x", Status::Pass)];
        e.save(&p).unwrap();
        e.save(&p).unwrap();
        assert_eq!(Evidence::load(&p).unwrap(), e);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o644);
        }
    }

    /// Issue 24 item 4: a recorded verdict its checkpoints do not support is refused on read,
    /// naming the file; `error` (a run that did not complete) is believed.
    #[test]
    fn a_verdict_the_content_does_not_support_is_refused() {
        let mut e = tiny();
        e.checkpoints = vec![
            checkpoint("a", Status::Origin),
            checkpoint("b", Status::Propagated),
            checkpoint("c", Status::Propagated),
        ];
        e.verdict = Verdict::Pass;
        let read_back = |e: &Evidence, path: &str| Evidence::from_json(&e.to_json().unwrap(), path);
        let err = read_back(&e, "d/e.json").unwrap_err().to_string();
        assert!(
            err.starts_with("d/e.json: verdict \"pass\" disagrees with its content (1 origin, 2 propagated: diverged)"),
            "{err}"
        );
        for ok in [Verdict::Diverged, Verdict::Error] {
            e.verdict = ok;
            let back = read_back(&e, "e.json").unwrap();
            assert_eq!(back.effective_verdict(), ok);
        }
        // Diverged recorded over passing content, and pass over nothing observed: refused too.
        e.checkpoints = vec![checkpoint("a", Status::Pass)];
        e.verdict = Verdict::Diverged;
        assert!(read_back(&e, "e.json").is_err());
        e.checkpoints = vec![checkpoint("a", Status::Unobserved)];
        e.verdict = Verdict::Pass;
        let err = read_back(&e, "e.json").unwrap_err().to_string();
        assert!(
            err.contains("no observed checkpoint among 1: error"),
            "{err}"
        );
    }

    #[test]
    fn schema_is_checked() {
        let text = tiny()
            .to_json()
            .unwrap()
            .replace(SCHEMA, "xray.evidence/v0");
        assert!(matches!(
            Evidence::from_json(&text, "x"),
            Err(Error::Schema { .. })
        ));
        assert!(matches!(
            Evidence::from_json("{", "x"),
            Err(Error::Json { .. })
        ));
        assert!(Evidence::load(Path::new("/nonexistent/e.json")).is_err());
    }

    #[test]
    fn verdict_from_content() {
        let mut e = tiny();
        // No checkpoint at all is no pass.
        assert_eq!(e.derive_verdict(), Verdict::Error);
        // Unobserved and not-comparable checkpoints neither pass nor fail; none observed is an
        // error, one observed pass is a pass.
        let cp = |status: Status| checkpoint("x", status);
        e.checkpoints = vec![cp(Status::Unobserved), cp(Status::NotComparable)];
        assert_eq!(e.derive_verdict(), Verdict::Error);
        e.checkpoints.push(cp(Status::Pass));
        assert_eq!(e.derive_verdict(), Verdict::Pass);
        e.checkpoints.push(cp(Status::Missing));
        assert_eq!(e.derive_verdict(), Verdict::Diverged);
        e.checkpoints = vec![cp(Status::Pass)];
        e.capture_neutral = Some(false);
        assert_eq!(e.derive_verdict(), Verdict::Diverged);
        e.capture_neutral = Some(true);
        e.transcript = Some(Transcript {
            runtime: "a".into(),
            reference: "b".into(),
            tokens_equal: false,
            first_divergent_step: Some(3),
        });
        assert_eq!(e.derive_verdict(), Verdict::Diverged);
    }
}
