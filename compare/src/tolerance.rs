//! Tolerances: per-dtype defaults, a policy file with per-checkpoint glob overrides, and a
//! calibrated mode that gates at a multiple of a per-checkpoint noise floor.
//!
//! Resolution order for one checkpoint (documented in `docs/tolerances.md`):
//! 1. the first policy rule (in file order) whose glob matches the checkpoint,
//! 2. the policy's `accept_precision` bounds, when the engine declares an op upstream of the
//!    checkpoint computed at that precision ([`Policy::with_declared_precision`]),
//! 3. calibrated, when the policy enables it and a noise floor exists for the checkpoint,
//! 4. the policy's per-dtype default, else the built-in default for the dtype.
//!
//! A rule glob containing `@` matches the checkpoint id `name@stepK`; any other glob matches the
//! name, so `audio.decoder.logits` covers every step and `audio.decoder.logits@step0` only step 0.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use xray_core::Step;

use globset::{Glob, GlobMatcher};
use serde::{Deserialize, Serialize};

use crate::Error;

/// The precision a checkpoint's values were computed at, which chooses its default tolerance
/// and names the policy's per-precision `defaults` and `accept_precision` (`f32`, `f16`, `bf16`,
/// `f64`). Not a storage type ([`xray_core::dump::Dtype`]: a dump's tensors are read as f32 and
/// judged at f32 unless the engine declares an op computed below it, `extra.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE binary64 (calibration runs).
    F64,
}

impl Precision {
    /// Parses the policy's and `extra.precision`'s spelling (`f32`, `f16`, `bf16`, `f64`).
    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "f32" => Some(Precision::F32),
            "f16" => Some(Precision::F16),
            "bf16" => Some(Precision::Bf16),
            "f64" => Some(Precision::F64),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
            Precision::F64 => "f64",
        }
    }
}

/// A pass criterion. An element is an outlier when `|run - ref| > atol + rtol * max(|ref|, s)`,
/// where `s` is the reference tensor's RMS magnitude ([`Tolerance::element_bound`]): f32
/// accumulation noise scales with the magnitude of what was summed, not with the value of one
/// (possibly cancelled, near-zero) element. A checkpoint passes when the runtime has no non-finite
/// value where the reference is finite, `rel_l2` is at most `max_rel_l2` (when set), and
/// - for ordinary tensors, the outlier fraction is at most `max_outlier_fraction`;
/// - for logits, the distribution agrees: `KL(softmax(ref) || softmax(run)) <= max_kl` at every
///   position and the argmax agrees wherever the reference's top two are further apart than their
///   noise (see `docs/tolerances.md`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance (times `|ref|`).
    pub rtol: f64,
    /// Largest allowed fraction of outlier elements (0..=1).
    pub max_outlier_fraction: f64,
    /// Optional bound on the whole-tensor `rel_l2` (set by calibrated mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rel_l2: Option<f64>,
    /// Optional bound on the per-position `KL(softmax(ref) || softmax(run))` of logits, in nats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kl: Option<f64>,
}

impl Tolerance {
    /// Built-in default for `f32` checkpoints: `atol 1e-4, rtol 1e-3, outliers <= 1e-3`.
    pub const fn default_f32() -> Tolerance {
        Tolerance {
            atol: 1e-4,
            rtol: 1e-3,
            max_outlier_fraction: 1e-3,
            // Aggregate bound: f16 rounding of a tensor gives rel_l2 ~ 2.8e-4 while staying inside
            // rtol element-wise; the clean f32 runtime against HF peaks at 2.4e-5 on inner tensors
            // over the corpus (docs/corpus.md). 5e-5 sits between, so a silent half-precision
            // buffer fails where it is planted.
            max_rel_l2: Some(5e-5),
            // Logits: the clean corpus peaks at 3.6e-9 nats (docs/corpus.md); a
            // perturbation of every logit by d gives KL ~ var(d) / 2, so 1e-6 nats still fails a
            // logit error of ~1e-3 that is not a common shift.
            max_kl: Some(1e-6),
        }
    }

    /// The largest `|run - ref|` an element whose reference is `reference` may have, in a tensor
    /// whose RMS magnitude is `scale`: `atol + rtol * max(|reference|, scale)`.
    #[inline(always)]
    pub fn element_bound(&self, reference: f64, scale: f64) -> f64 {
        self.atol + self.rtol * reference.abs().max(scale)
    }

    /// Built-in default for logits checkpoints of a dtype: [`Tolerance::default_for`] with the
    /// `rel_l2` bound of `f32` logits at `1e-4`. The logits are the deepest tensor of the graph and
    /// carry the largest legitimate error: the oracle's own f32-vs-f64 floor reaches `4e-5` there
    /// (tiny.en, `docs/corpus.md`) and the clean runtime `3.3e-5`, so the `5e-5` of inner tensors
    /// would be a false alarm waiting to happen. `1e-4` is 2.5x that floor and still below what a
    /// silent f16 logits buffer gives (rel_l2 1.4e-4..2.8e-4, a KL that may be tiny).
    pub const fn default_logits(dtype: Precision) -> Tolerance {
        let mut t = Tolerance::default_for(dtype);
        if let Precision::F32 = dtype {
            t.max_rel_l2 = Some(1e-4);
        }
        t
    }

    /// Built-in default for a dtype (see `docs/tolerances.md` for the reasoning).
    pub const fn default_for(dtype: Precision) -> Tolerance {
        // Below f32 and at f64 the bounds are per element and on the logits' KL; the `rel_l2`
        // bound is f32's own.
        let (atol, rtol, max_outlier_fraction, max_kl) = match dtype {
            Precision::F32 => return Tolerance::default_f32(),
            // Half-ULP of f16 is 2^-11 ~ 4.9e-4 relative; allow ~10 ULPs of accumulated rounding.
            // Logit noise ~ 1e-2 relative: KL ~ 1e-4 / 2 per unit logit spread.
            Precision::F16 => (1e-3, 1e-2, 1e-3, 1e-4),
            // Half-ULP of bf16 is 2^-8 ~ 3.9e-3 relative.
            Precision::Bf16 => (1e-2, 5e-2, 1e-3, 1e-2),
            Precision::F64 => (1e-10, 1e-9, 0.0, 1e-12),
        };
        Tolerance {
            atol,
            rtol,
            max_outlier_fraction,
            max_rel_l2: None,
            max_kl: Some(max_kl),
        }
    }
}

/// Where a tolerance came from; rendered as `default:<dtype>`, `policy:<glob>` or
/// `calibrated:<k>x noise floor` (`default:<dtype>:logits` for the logits default).
#[derive(Debug, Clone, PartialEq)]
pub enum ToleranceSource {
    /// Built-in or policy per-dtype default.
    Default(Precision),
    /// Built-in per-dtype default for logits ([`Tolerance::default_logits`]).
    DefaultLogits(Precision),
    /// A policy rule with this glob.
    Policy(String),
    /// Calibrated at this multiple of the checkpoint's noise floor.
    Calibrated(f64),
    /// The policy's `accept_precision` bounds for `dtype`: the engine declares `op`, upstream of
    /// the checkpoint, computed at that precision.
    Precision {
        /// The accepted precision.
        dtype: Precision,
        /// The first declared op (in graph order) the checkpoint depends on.
        op: String,
    },
}

impl fmt::Display for ToleranceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToleranceSource::Default(d) => write!(f, "default:{}", d.as_str()),
            ToleranceSource::DefaultLogits(d) => write!(f, "default:{}:logits", d.as_str()),
            ToleranceSource::Policy(g) => write!(f, "policy:{g}"),
            ToleranceSource::Calibrated(k) => write!(f, "calibrated:{k}x noise floor"),
            ToleranceSource::Precision { dtype, op } => {
                write!(f, "precision:{} via {op}", dtype.as_str())
            }
        }
    }
}

/// A tolerance together with its source.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedTolerance {
    /// The criterion.
    pub tolerance: Tolerance,
    /// Where it came from.
    pub source: ToleranceSource,
}

/// Noise floor of one checkpoint measured from the reference itself (for example the oracle run in
/// `f32` compared with the same oracle in `f64`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NoiseFloor {
    /// Largest absolute difference of the `f32` reference from the `f64` reference.
    pub max_abs: f64,
    /// `rel_l2` of the `f32` reference against the `f64` reference.
    pub rel_l2: f64,
}

impl NoiseFloor {
    /// Takes the floor from metrics of (f64 reference cast to f32) vs (f32 reference).
    pub fn from_metrics(m: &crate::metrics::Metrics) -> NoiseFloor {
        NoiseFloor {
            max_abs: m.max_abs,
            rel_l2: m.rel_l2,
        }
    }
}

/// Calibrated-mode settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Gate at this multiple of the noise floor (default 10).
    #[serde(default = "Calibration::default_multiple")]
    pub multiple: f64,
    /// Lower bound on the calibrated `atol` (default 1e-6), so a zero floor does not demand
    /// bit-exactness.
    #[serde(default = "Calibration::default_min_atol")]
    pub min_atol: f64,
    /// Lower bound on the calibrated `max_rel_l2` (default 1e-7).
    #[serde(default = "Calibration::default_min_rel_l2")]
    pub min_rel_l2: f64,
}

impl Calibration {
    fn default_multiple() -> f64 {
        10.0
    }
    fn default_min_atol() -> f64 {
        1e-6
    }
    fn default_min_rel_l2() -> f64 {
        1e-7
    }

    /// The calibrated tolerance for a floor: every element within
    /// `max(multiple * floor.max_abs, min_atol)` and `rel_l2 <= max(multiple * floor.rel_l2,
    /// min_rel_l2)`; no outliers allowed. The KL bound of logits is not calibrated (`None`; the
    /// caller keeps the dtype default's).
    pub fn tolerance(&self, floor: &NoiseFloor) -> Tolerance {
        Tolerance {
            atol: (self.multiple * floor.max_abs).max(self.min_atol),
            rtol: 0.0,
            max_outlier_fraction: 0.0,
            max_rel_l2: Some((self.multiple * floor.rel_l2).max(self.min_rel_l2)),
            max_kl: None,
        }
    }
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            multiple: 10.0,
            min_atol: 1e-6,
            min_rel_l2: 1e-7,
        }
    }
}

/// One policy rule as written in the file; unset fields inherit from the dtype default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Glob over the checkpoint name (or `name@stepK` when it contains `@`).
    #[serde(rename = "match")]
    pub glob: String,
    /// Absolute tolerance override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atol: Option<f64>,
    /// Relative tolerance override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtol: Option<f64>,
    /// Outlier fraction override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_outlier_fraction: Option<f64>,
    /// `rel_l2` bound override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rel_l2: Option<f64>,
    /// Logits KL bound override (nats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kl: Option<f64>,
}

/// What a policy accepts of tensors computed at a reduced precision the engine declares
/// (`accept_precision.<dtype>`): the bounds of every checkpoint and op-level point downstream of a
/// declared op (see `docs/tolerances.md`, "Declared precision").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptSpec {
    /// Bounds of an ordinary tensor downstream of a declared op.
    pub default: Tolerance,
    /// Bounds of a logits checkpoint downstream of one (absent: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits: Option<Tolerance>,
}

/// Policy file contents (`schema: "xray.policy/v1"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Must be `xray.policy/v1` when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Per-dtype defaults replacing the built-in ones (keys `f32`, `f16`, `bf16`, `f64`).
    #[serde(default)]
    pub defaults: BTreeMap<Precision, Tolerance>,
    /// Ordered rules; the first match wins.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// Calibrated mode; absent = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<Calibration>,
    /// Precisions below f32 this policy accepts where the engine declares them (keys `f16`,
    /// `bf16`); absent = none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub accept_precision: BTreeMap<Precision, AcceptSpec>,
}

/// A compiled policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    spec: PolicySpec,
    matchers: Vec<GlobMatcher>,
    /// Checkpoint and point names downstream of a declared reduced-precision op whose precision
    /// the policy accepts: (precision, the op).
    declared: std::collections::HashMap<String, (Precision, String)>,
}

/// Policy schema identifier.
pub const POLICY_SCHEMA: &str = "xray.policy/v1";

fn check_tol(what: &str, t: &Tolerance) -> Result<(), Error> {
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if !(ok(t.atol) && ok(t.rtol) && ok(t.max_outlier_fraction) && t.max_outlier_fraction <= 1.0)
        || t.max_rel_l2.is_some_and(|v| !ok(v))
        || t.max_kl.is_some_and(|v| !ok(v))
    {
        return Err(Error::Policy(format!(
            "{what}: atol, rtol, max_rel_l2, max_kl must be finite and >= 0, max_outlier_fraction in [0, 1]"
        )));
    }
    Ok(())
}

impl Policy {
    /// Compiles a policy, validating its values and globs.
    pub fn new(spec: PolicySpec) -> Result<Policy, Error> {
        if let Some(s) = &spec.schema {
            if s != POLICY_SCHEMA {
                return Err(Error::Policy(format!(
                    "schema {s:?}, expected {POLICY_SCHEMA:?}"
                )));
            }
        }
        for (d, t) in &spec.defaults {
            check_tol(&format!("defaults.{}", d.as_str()), t)?;
        }
        let mut matchers = Vec::with_capacity(spec.rules.len());
        for (i, r) in spec.rules.iter().enumerate() {
            let t = Tolerance {
                atol: r.atol.unwrap_or(0.0),
                rtol: r.rtol.unwrap_or(0.0),
                max_outlier_fraction: r.max_outlier_fraction.unwrap_or(0.0),
                max_rel_l2: r.max_rel_l2,
                max_kl: r.max_kl,
            };
            check_tol(&format!("rules[{i}]"), &t)?;
            let g = Glob::new(&r.glob).map_err(|source| Error::Glob {
                rule: i,
                glob: r.glob.clone(),
                source,
            })?;
            matchers.push(g.compile_matcher());
        }
        for (d, a) in &spec.accept_precision {
            if matches!(d, Precision::F32 | Precision::F64) {
                return Err(Error::Policy(format!(
                    "accept_precision.{}: only a precision below f32 (f16, bf16) can be accepted",
                    d.as_str()
                )));
            }
            check_tol(
                &format!("accept_precision.{}.default", d.as_str()),
                &a.default,
            )?;
            if let Some(l) = &a.logits {
                check_tol(&format!("accept_precision.{}.logits", d.as_str()), l)?;
            }
        }
        if let Some(c) = &spec.calibrated {
            let ok = |v: f64| v.is_finite() && v >= 0.0;
            if !(ok(c.multiple) && c.multiple > 0.0 && ok(c.min_atol) && ok(c.min_rel_l2)) {
                return Err(Error::Policy(
                    "calibrated: multiple must be > 0, minimums >= 0".into(),
                ));
            }
        }
        Ok(Policy {
            spec,
            matchers,
            declared: Default::default(),
        })
    }

    /// Parses and compiles a policy from JSON text.
    pub fn from_json(text: &str) -> Result<Policy, Error> {
        Policy::parse(text, "<string>")
    }

    /// Reads, parses and compiles a policy file.
    pub fn load(path: &Path) -> Result<Policy, Error> {
        let (p, text) = crate::error::read_text(path)?;
        Policy::parse(&text, &p)
    }

    /// Parses policy text from `path`. The document must be a JSON object with at least one of
    /// `defaults`, `rules`, `calibrated` holding something: `{}`, `[]`, an empty file or a policy
    /// that only names its schema would silently leave every tolerance at its default.
    fn parse(text: &str, path: &str) -> Result<Policy, Error> {
        let json = |source| Error::Json {
            path: path.into(),
            source,
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(json)?;
        let Some(obj) = v.as_object() else {
            return Err(Error::Policy(format!(
                "{path}: a policy is a JSON object with \"defaults\", \"rules\", \"calibrated\" or \"accept_precision\""
            )));
        };
        let content = ["defaults", "rules", "calibrated", "accept_precision"]
            .iter()
            .any(|k| {
                obj.get(*k).is_some_and(|x| match x {
                    serde_json::Value::Object(m) => !m.is_empty() || *k == "calibrated",
                    serde_json::Value::Array(a) => !a.is_empty(),
                    serde_json::Value::Null => false,
                    _ => true,
                })
            });
        let spec: PolicySpec = serde_json::from_value(v).map_err(json)?;
        if !content {
            return Err(Error::Policy(format!(
                "{path}: the policy sets nothing (no \"defaults\", \"rules\", \"calibrated\" or \"accept_precision\"); \
                 remove --policy to use the built-in tolerances"
            )));
        }
        Policy::new(spec)
    }

    /// Checks that every rule matches at least one checkpoint. `ids` are the checkpoints a run
    /// can compare: `(name, Some(step))`, or `(name, None)` when the steps are not known yet (then
    /// rules whose glob holds `@` are not judged). A rule that matches nothing is a typo or a
    /// rule for another model: an error naming the rule, never a silent no-op.
    pub fn check_rules_match<'a>(
        &self,
        ids: impl IntoIterator<Item = (&'a str, Option<Step>)> + Clone,
    ) -> Result<(), Error> {
        for (i, (rule, m)) in self.spec.rules.iter().zip(&self.matchers).enumerate() {
            let by_id = rule.glob.contains('@');
            let mut decidable = false;
            let hit = ids
                .clone()
                .into_iter()
                .any(|(name, step)| match (by_id, step) {
                    (false, _) => {
                        decidable = true;
                        m.is_match(name)
                    }
                    (true, Some(k)) => {
                        decidable = true;
                        m.is_match(xray_core::key(name, k).to_string())
                    }
                    (true, None) => false,
                });
            if decidable && !hit {
                return Err(Error::Policy(format!(
                    "rules[{i}] {:?} matches no checkpoint of this model's contract (see `xray list`)",
                    rule.glob
                )));
            }
        }
        Ok(())
    }

    /// sha256 of the policy as parsed ([`PolicySpec`] serialized: the same defaults, rules and
    /// calibration hash alike however the file is spaced; the built-in policy has one too). What
    /// `run.settings.policy_sha256` records: `xray check --resume` keeps evidence of this policy
    /// only.
    pub fn sha256(&self) -> String {
        // A PolicySpec serializes (finite numbers, string keys) or the derive is broken.
        let text = serde_json::to_string(&self.spec).unwrap_or_default();
        xray_core::sha256_hex(text.as_bytes())
    }

    /// The policy as written.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// This policy with calibrated mode switched on (rules still take precedence).
    pub fn with_calibration(mut self, c: Calibration) -> Policy {
        self.spec.calibrated = Some(c);
        self
    }

    /// This policy with the engine's declared precision applied: `reached` maps each checkpoint
    /// and op-level point name to the precision and the first declared op upstream of it (the
    /// caller follows the graph's edges). Names whose precision the policy does not accept are
    /// dropped, so they keep their other bounds.
    pub fn with_declared_precision(
        mut self,
        reached: impl IntoIterator<Item = (String, (Precision, String))>,
    ) -> Policy {
        let accepted = &self.spec.accept_precision;
        self.declared = reached
            .into_iter()
            .filter(|(_, (d, _))| accepted.contains_key(d))
            .collect();
        self
    }

    /// How many checkpoint and point names are judged at an accepted precision's bounds.
    pub fn declared_count(&self) -> usize {
        self.declared.len()
    }

    /// Whether calibrated mode is on.
    pub fn calibrated(&self) -> Option<&Calibration> {
        self.spec.calibrated.as_ref()
    }

    /// The per-dtype default in force (policy override or built-in).
    pub fn default_for(&self, dtype: Precision) -> Tolerance {
        self.spec
            .defaults
            .get(&dtype)
            .copied()
            .unwrap_or(Tolerance::default_for(dtype))
    }

    /// Resolves the tolerance of checkpoint `name` at `step` (see the module doc for the order).
    pub fn resolve(
        &self,
        name: &str,
        step: Step,
        dtype: Precision,
        floor: Option<&NoiseFloor>,
    ) -> ResolvedTolerance {
        self.resolve_kind(name, step, dtype, floor, false)
    }

    /// [`Policy::resolve`] for a checkpoint that may be logits: without a policy default for the
    /// dtype, logits start from [`Tolerance::default_logits`].
    pub fn resolve_kind(
        &self,
        name: &str,
        step: Step,
        dtype: Precision,
        floor: Option<&NoiseFloor>,
        logits: bool,
    ) -> ResolvedTolerance {
        let id = xray_core::key(name, step).to_string();
        let builtin_logits = logits && !self.spec.defaults.contains_key(&dtype);
        let base = if builtin_logits {
            Tolerance::default_logits(dtype)
        } else {
            self.default_for(dtype)
        };
        for (rule, m) in self.spec.rules.iter().zip(&self.matchers) {
            let subject = if rule.glob.contains('@') { &id } else { name };
            if m.is_match(subject) {
                return ResolvedTolerance {
                    tolerance: Tolerance {
                        atol: rule.atol.unwrap_or(base.atol),
                        rtol: rule.rtol.unwrap_or(base.rtol),
                        max_outlier_fraction: rule
                            .max_outlier_fraction
                            .unwrap_or(base.max_outlier_fraction),
                        max_rel_l2: rule.max_rel_l2.or(base.max_rel_l2),
                        max_kl: rule.max_kl.or(base.max_kl),
                    },
                    source: ToleranceSource::Policy(rule.glob.clone()),
                };
            }
        }
        if let Some((d, op)) = self.declared.get(name) {
            if let Some(a) = self.spec.accept_precision.get(d) {
                let t = if logits {
                    a.logits.unwrap_or(a.default)
                } else {
                    a.default
                };
                return ResolvedTolerance {
                    tolerance: t,
                    source: ToleranceSource::Precision {
                        dtype: *d,
                        op: op.clone(),
                    },
                };
            }
        }
        if let (Some(c), Some(f)) = (self.calibrated(), floor) {
            let mut tolerance = c.tolerance(f);
            tolerance.max_kl = base.max_kl;
            return ResolvedTolerance {
                tolerance,
                source: ToleranceSource::Calibrated(c.multiple),
            };
        }
        ResolvedTolerance {
            tolerance: base,
            source: if builtin_logits {
                ToleranceSource::DefaultLogits(dtype)
            } else {
                ToleranceSource::Default(dtype)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"{
      "schema": "xray.policy/v1",
      "defaults": {"f32": {"atol": 2e-4, "rtol": 1e-3, "max_outlier_fraction": 0.0}},
      "rules": [
        {"match": "audio.decoder.logits@step0", "atol": 5e-3},
        {"match": "audio.decoder.logits", "atol": 1e-3, "max_outlier_fraction": 1e-4},
        {"match": "audio.encoder.layer.*.out", "rtol": 2e-3}
      ],
      "calibrated": {"multiple": 8}
    }"#;

    #[test]
    fn builtin_defaults_per_dtype() {
        let p = Policy::default();
        let r = p.resolve("x", 0, Precision::F16, None);
        assert_eq!(r.tolerance, Tolerance::default_for(Precision::F16));
        assert_eq!(r.source.to_string(), "default:f16");
        assert!(
            Tolerance::default_for(Precision::Bf16).rtol
                > Tolerance::default_for(Precision::F16).rtol
        );
    }

    #[test]
    fn first_matching_rule_wins_and_inherits_unset_fields() {
        let p = Policy::from_json(POLICY).unwrap();
        let r = p.resolve("audio.decoder.logits", 0, Precision::F32, None);
        assert_eq!(r.tolerance.atol, 5e-3);
        assert_eq!(r.tolerance.rtol, 1e-3);
        assert_eq!(r.source.to_string(), "policy:audio.decoder.logits@step0");
        let r = p.resolve("audio.decoder.logits", 3, Precision::F32, None);
        assert_eq!(
            (r.tolerance.atol, r.tolerance.max_outlier_fraction),
            (1e-3, 1e-4)
        );
        let r = p.resolve("audio.encoder.layer.3.out", 0, Precision::F32, None);
        assert_eq!((r.tolerance.atol, r.tolerance.rtol), (2e-4, 2e-3));
    }

    #[test]
    fn calibrated_applies_when_no_rule_matches_and_a_floor_exists() {
        let p = Policy::from_json(POLICY).unwrap();
        let floor = NoiseFloor {
            max_abs: 1e-5,
            rel_l2: 1e-7,
        };
        let r = p.resolve("audio.encoder.memory", 0, Precision::F32, Some(&floor));
        assert_eq!(r.source.to_string(), "calibrated:8x noise floor");
        assert!((r.tolerance.atol - 8e-5).abs() < 1e-12);
        assert_eq!(r.tolerance.max_rel_l2, Some(8e-7));
        let zero = NoiseFloor {
            max_abs: 0.0,
            rel_l2: 0.0,
        };
        let r = p.resolve("audio.encoder.memory", 0, Precision::F32, Some(&zero));
        assert_eq!(r.tolerance.atol, 1e-6, "minimum atol applies");
        let r = p.resolve("audio.encoder.memory", 0, Precision::F32, None);
        assert_eq!(r.source.to_string(), "default:f32");
        let r = p.resolve("audio.decoder.logits", 2, Precision::F32, Some(&floor));
        assert!(matches!(r.source, ToleranceSource::Policy(_)));
    }

    #[test]
    fn invalid_policies_are_rejected() {
        assert!(matches!(
            Policy::from_json(r#"{"rules": [{"match": "a[", "atol": 1}]}"#),
            Err(Error::Glob { .. })
        ));
        assert!(matches!(
            Policy::from_json(r#"{"rules": [{"match": "a", "atol": -1}]}"#),
            Err(Error::Policy(_))
        ));
        assert!(matches!(
            Policy::from_json(r#"{"rules": [{"match": "a", "atoll": 1}]}"#),
            Err(Error::Json { .. })
        ));
        assert!(Policy::from_json(r#"{"schema": "other"}"#).is_err());
        assert!(Policy::from_json(r#"{"calibrated": {"multiple": 0}}"#).is_err());
    }
}
