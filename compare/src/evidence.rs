//! Evidence JSON, schema `xray.evidence/v1` (`docs/evidence-schema.md`,
//! `docs/evidence.schema.json`): serde types, atomic write, and checked read.
//!
//! Every float in the document is finite (the metrics module guarantees it), so the JSON never
//! holds `null` where a number is expected.

use std::io::Write;
use std::path::Path;

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
    /// sha256 of the checkpoint contract the comparison was made through (the gate refuses to
    /// compare evidence made through different contracts). `None` in evidence written before it
    /// was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract_sha256: Option<String>,
}

/// Tolerance in force for a checkpoint and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToleranceEvidence {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// Allowed outlier fraction.
    pub max_outlier_fraction: f64,
    /// `rel_l2` bound, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rel_l2: Option<f64>,
    /// Logits KL bound (nats), when set; applies to logits checkpoints only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kl: Option<f64>,
    /// `default:<dtype>`, `policy:<glob>` or `calibrated:<k>x noise floor`.
    pub source: String,
}

impl From<&ResolvedTolerance> for ToleranceEvidence {
    fn from(r: &ResolvedTolerance) -> Self {
        ToleranceEvidence {
            atol: r.tolerance.atol,
            rtol: r.tolerance.rtol,
            max_outlier_fraction: r.tolerance.max_outlier_fraction,
            max_rel_l2: r.tolerance.max_rel_l2,
            max_kl: r.tolerance.max_kl,
            source: r.source.to_string(),
        }
    }
}

impl ToleranceEvidence {
    /// The tolerance without its source.
    pub fn tolerance(&self) -> Tolerance {
        Tolerance {
            atol: self.atol,
            rtol: self.rtol,
            max_outlier_fraction: self.max_outlier_fraction,
            max_rel_l2: self.max_rel_l2,
            max_kl: self.max_kl,
        }
    }
}

/// One checkpoint at one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointEvidence {
    /// Canonical name.
    pub name: String,
    /// Step.
    pub step: u32,
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
        format!("{}@step{}", self.name, self.step)
    }
}

/// One input edge of the origin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputEvidence {
    /// Input checkpoint name.
    pub checkpoint: String,
    /// Its step.
    pub step: u32,
    /// Its status.
    pub status: Status,
}

/// The localized origin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstDivergence {
    /// Origin checkpoint name.
    pub checkpoint: String,
    /// Its step.
    pub step: u32,
    /// Producing op (the suspect).
    pub producer: String,
    /// Its input edges and their status (all `pass` by construction).
    pub inputs: Vec<InputEvidence>,
    /// Divergence signature.
    pub explanation: Option<Explanation>,
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
    pub first_divergent_step: Option<u32>,
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
}

impl Evidence {
    /// The verdict implied by the content: `diverged` if any checkpoint is not `pass`, capture
    /// is not neutral, or the token sequences differ; otherwise `pass`. (`error` is set by the
    /// caller when the run did not complete.)
    pub fn derive_verdict(&self) -> Verdict {
        let diverged = self.checkpoints.iter().any(|c| c.status != Status::Pass)
            || self.capture_neutral == Some(false)
            || self.transcript.as_ref().is_some_and(|t| !t.tokens_equal);
        if diverged {
            Verdict::Diverged
        } else {
            Verdict::Pass
        }
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

    /// Parses evidence text, checking the schema identifier.
    pub fn from_json(text: &str, path: &str) -> Result<Evidence, Error> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|source| Error::Json {
            path: path.into(),
            source,
        })?;
        let found = v.get("schema").and_then(|s| s.as_str()).unwrap_or("");
        if found != SCHEMA {
            return Err(Error::Schema {
                path: path.into(),
                found: found.into(),
                expected: SCHEMA.into(),
            });
        }
        serde_json::from_value(v).map_err(|source| Error::Json {
            path: path.into(),
            source,
        })
    }

    /// Reads and parses an evidence file.
    pub fn load(path: &Path) -> Result<Evidence, Error> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: p.clone(),
            source,
        })?;
        Evidence::from_json(&text, &p)
    }

    /// Writes the evidence atomically (see [`write_atomic`]).
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        write_atomic(path, self.to_json()?.as_bytes())
    }
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
mod tests {
    use super::*;

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
            error_profile: ErrorProfile::default(),
            drill_down: None,
            capture_neutral: None,
            transcript: None,
            notes: vec![],
        }
    }

    #[test]
    fn round_trip_and_atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.json");
        let e = tiny();
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
        assert_eq!(e.derive_verdict(), Verdict::Pass);
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
