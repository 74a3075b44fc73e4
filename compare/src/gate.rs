//! CI gate: compares new evidence with a baseline and lists findings; writes JUnit XML.
//!
//! Failing findings:
//! - the verdict worsens (`pass` -> `diverged`/`error`);
//! - a checkpoint's status worsens (`pass` -> anything else);
//! - a checkpoint of the baseline is absent from the new evidence;
//! - coverage drops: a checkpoint observed in the baseline is `unobserved` or `not_comparable` now
//!   (whatever its baseline status: a failure must not disappear by not being looked at);
//! - a checkpoint's `rel_l2` or `max_abs` grows past `factor` times the baseline **and** past the
//!   metric's absolute floor (so `1e-9 -> 3e-9` does not fail).
//!
//! Informational findings (do not fail): checkpoints new in the new evidence, improvements of
//! status, and (with `allow_different_input`) the weights or audio that differ.
//!
//! Before any of that, both documents must describe the same run: the same family and contract
//! (always), the same weights and audio (unless `allow_different_input`). A fact missing from
//! either side counts as different: a gate between unrelated runs is refused, never computed.

use std::collections::HashMap;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use crate::evidence::{CheckpointEvidence, Evidence, Run, Verdict};
use crate::localize::Status;
use crate::Error;

/// Gate thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateOptions {
    /// Allowed growth factor of `rel_l2` and `max_abs` (default 2).
    pub factor: f64,
    /// `rel_l2` at or below this never fails (default 1e-6).
    pub rel_l2_floor: f64,
    /// `max_abs` at or below this never fails (default 1e-4).
    pub max_abs_floor: f64,
    /// Gate evidence of other weights or other audio against the baseline (family and contract
    /// must still match); the differences are reported as informational findings.
    pub allow_different_input: bool,
}

impl Default for GateOptions {
    fn default() -> Self {
        GateOptions {
            factor: 2.0,
            rel_l2_floor: 1e-6,
            max_abs_floor: 1e-4,
            allow_different_input: false,
        }
    }
}

/// What a finding is about.
#[derive(Debug, Clone, PartialEq)]
pub enum FindingKind {
    /// The overall verdict worsened.
    VerdictWorsened {
        /// Baseline verdict.
        from: Verdict,
        /// New verdict.
        to: Verdict,
    },
    /// A checkpoint's status worsened.
    StatusWorsened {
        /// Baseline status.
        from: Status,
        /// New status.
        to: Status,
    },
    /// A metric grew past the limit.
    ErrorGrew {
        /// `rel_l2` or `max_abs`.
        metric: &'static str,
        /// Baseline value.
        baseline: f64,
        /// New value.
        new: f64,
        /// The limit it exceeded.
        limit: f64,
    },
    /// In the baseline, absent from the new evidence.
    Removed,
    /// Observed in the baseline, unobserved or not comparable now.
    CoverageDropped {
        /// Baseline status.
        from: Status,
        /// New status (`unobserved` or `not_comparable`).
        to: Status,
    },
    /// In the new evidence only (informational).
    Added,
    /// Status improved (informational).
    StatusImproved {
        /// Baseline status.
        from: Status,
        /// New status.
        to: Status,
    },
    /// The runs differ in weights or audio, allowed by `allow_different_input` (informational).
    DifferentInput,
    /// One side is stats-only evidence (`run.stats_only`, metrics `null`): statuses are gated,
    /// error growth is not (informational, so the gate never passes silently on what it could
    /// not compare).
    StatsOnly,
}

/// One gate finding.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// `name@stepK`, or `None` for the verdict.
    pub checkpoint: Option<String>,
    /// What happened.
    pub kind: FindingKind,
    /// Whether it fails the gate.
    pub failing: bool,
    /// Human-readable message.
    pub message: String,
}

/// Outcome of [`gate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GateReport {
    /// Family of the new evidence (JUnit class name).
    pub family: String,
    /// Every checkpoint id checked, in new-evidence order followed by removed ones.
    pub checked: Vec<String>,
    /// Findings in check order.
    pub findings: Vec<Finding>,
}

impl GateReport {
    /// Whether no finding fails.
    pub fn passed(&self) -> bool {
        !self.findings.iter().any(|f| f.failing)
    }

    /// Failing findings.
    pub fn failures(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.failing)
    }
}

fn growth(
    out: &mut Vec<Finding>,
    id: &str,
    metric: &'static str,
    base: f64,
    new: f64,
    factor: f64,
    floor: f64,
) {
    let limit = (factor * base).max(floor);
    if new > limit {
        out.push(Finding {
            checkpoint: Some(id.to_string()),
            kind: FindingKind::ErrorGrew {
                metric,
                baseline: base,
                new,
                limit,
            },
            failing: true,
            message: format!(
                "{id}: {metric} grew from {base:.3e} to {new:.3e} (limit {limit:.3e} = max({factor} x baseline, floor {floor:.1e}))"
            ),
        });
    }
}

/// The finding a checkpoint's status change from the baseline's `from` to `to` makes, if any:
/// coverage dropped (observed, now not) and worsened (pass, now not) fail; improved (now pass)
/// informs.
fn status_change(id: &str, from: Status, to: Status) -> Option<Finding> {
    let (kind, failing, message) = if from.is_observed() && !to.is_observed() {
        (
            FindingKind::CoverageDropped { from, to },
            true,
            format!(
                "{id}: coverage dropped: {} in the baseline, {} now",
                from.as_str(),
                to.as_str()
            ),
        )
    } else if from == Status::Pass && to != Status::Pass {
        (
            FindingKind::StatusWorsened { from, to },
            true,
            format!("{id}: status worsened: pass -> {}", to.as_str()),
        )
    } else if from != Status::Pass && to == Status::Pass {
        (
            FindingKind::StatusImproved { from, to },
            false,
            format!("{id}: status improved: {} -> pass", from.as_str()),
        )
    } else {
        return None;
    };
    Some(Finding {
        checkpoint: Some(id.to_string()),
        kind,
        failing,
        message,
    })
}

/// The facts that identify what a piece of evidence is about (family, contract, weights, audio),
/// as `what new vs OTHER old` (`other` names the old side: `baseline`, `earlier`; empty: no
/// name) where they differ or either side lacks them: `(fixed, input)`, `fixed` the ones no
/// option overrides, `input` the ones `allow_different_input` does.
pub fn identity_differences(n: &Run, b: &Run, other: &str) -> (Vec<String>, Vec<String>) {
    let show = |v: &Option<String>| match v {
        Some(s) if s.len() > 12 => format!("{}..", &s[..12]),
        Some(s) => s.clone(),
        None => "not recorded".into(),
    };
    let differs = |a: &Option<String>, b: &Option<String>| a.is_none() || b.is_none() || a != b;
    let vs = if other.is_empty() {
        "vs".to_string()
    } else {
        format!("vs {other}")
    };
    let mut fixed = vec![];
    let mut input = vec![];
    if n.family != b.family {
        fixed.push(format!("family {} {vs} {}", n.family, b.family));
    }
    if differs(&n.contract_sha256, &b.contract_sha256) {
        fixed.push(format!(
            "contract sha256 {} {vs} {} (made through another contract: regenerate it with this X-Ray)",
            show(&n.contract_sha256),
            show(&b.contract_sha256)
        ));
    }
    for (what, x, y) in [
        ("weights", &n.weights_sha256, &b.weights_sha256),
        ("audio", &n.audio_sha256, &b.audio_sha256),
    ] {
        if differs(x, y) {
            input.push(format!("{what} sha256 {} {vs} {}", show(x), show(y)));
        }
    }
    (fixed, input)
}

/// Why `earlier` evidence is not evidence of the check `planned` describes (empty when it is):
/// the gate's identity ([`identity_differences`], none of it overridable), then what the check
/// was asked to do (`isolated`, `stats_only`, `settings`: the policy and the options). What
/// `xray check --resume` requires of a clip's evidence before it keeps it.
pub fn run_differences(planned: &Run, earlier: &Run) -> Vec<String> {
    let (fixed, input) = identity_differences(planned, earlier, "earlier");
    let mut out: Vec<String> = fixed.into_iter().chain(input).collect();
    for (what, a, b) in [
        ("isolated", planned.isolated, earlier.isolated),
        ("stats_only", planned.stats_only, earlier.stats_only),
    ] {
        if a != b {
            out.push(format!("{what} {a} vs earlier {b}"));
        }
    }
    match (&planned.settings, &earlier.settings) {
        (Some(a), Some(b)) => out.extend(
            a.differences(b)
                .into_iter()
                .map(|d| format!("settings: {d}")),
        ),
        (_, None) => out
            .push("settings not recorded (evidence of another X-Ray or of `xray compare`)".into()),
        (None, Some(_)) => out.push("settings of the planned check not known".into()),
    }
    out
}

/// Two corpora are of one model: the family, contract and (unless `allow_different_input`)
/// weights of a clip of each agree (their audio differs by design).
pub(crate) fn same_model(
    new: &Evidence,
    baseline: &Evidence,
    opts: &GateOptions,
) -> Result<(), Error> {
    let (fixed, input) = identity_differences(&new.run, &baseline.run, "baseline");
    let input: Vec<String> = input
        .into_iter()
        .filter(|d| !d.starts_with("audio"))
        .collect();
    if !fixed.is_empty() || (!input.is_empty() && !opts.allow_different_input) {
        let overridable = fixed.is_empty();
        return Err(Error::IdentityMismatch {
            differences: fixed.into_iter().chain(input).collect(),
            overridable,
        });
    }
    Ok(())
}

impl GateReport {
    /// What `xray gate` prints: one `FAIL` / `info` line per finding, then
    /// `gate: N checkpoints checked, K failing finding(s): PASS|FAIL`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let tag = if f.failing { "FAIL" } else { "info" };
            out += &format!("{tag} {}\n", f.message);
        }
        out += &format!(
            "gate: {} checkpoints checked, {} failing finding(s): {}\n",
            self.checked.len(),
            self.failures().count(),
            if self.passed() { "PASS" } else { "FAIL" }
        );
        out
    }
}

/// Compares `new` evidence with `baseline`. Refused with [`Error::IdentityMismatch`] when they
/// describe different runs (family, contract, and unless `opts.allow_different_input`, weights
/// and audio), and with [`Error::Invalid`] when either observed no checkpoint: an empty gate
/// never passes. Verdicts are the content's ([`Evidence::effective_verdict`]).
pub fn gate(new: &Evidence, baseline: &Evidence, opts: &GateOptions) -> Result<GateReport, Error> {
    let mut findings = Vec::new();
    let (fixed, input) = identity_differences(&new.run, &baseline.run, "baseline");
    if !fixed.is_empty() || (!input.is_empty() && !opts.allow_different_input) {
        let overridable = fixed.is_empty();
        return Err(Error::IdentityMismatch {
            differences: fixed.into_iter().chain(input).collect(),
            overridable,
        });
    }
    for (e, side) in [(new, "the new evidence"), (baseline, "the baseline")] {
        if !e.checkpoints.iter().any(|c| c.status.is_observed()) {
            return Err(Error::Invalid {
                path: side.into(),
                reason: format!(
                    "no observed checkpoint (of {}): nothing to gate, and an empty gate never passes",
                    e.checkpoints.len()
                ),
            });
        }
    }
    for d in input {
        findings.push(Finding {
            checkpoint: None,
            kind: FindingKind::DifferentInput,
            failing: false,
            message: format!("different input (allowed): {d}"),
        });
    }
    // The engine's own converted weights are not identity (the HF weights they correspond to
    // are, above): a changed file (another conversion or quantization) is gated, and said.
    let ew = |e: &Evidence| {
        e.run
            .engine_weights
            .as_ref()
            .map(|w| (w.format.clone(), w.sha256.clone()))
    };
    if ew(new) != ew(baseline) {
        let show = |x: Option<(String, String)>| {
            x.map_or("none declared".to_string(), |(f, h)| {
                format!("{f} sha256 {h}")
            })
        };
        findings.push(Finding {
            checkpoint: None,
            kind: FindingKind::DifferentInput,
            failing: false,
            message: format!(
                "engine weights file differs (gated anyway: the HF weights it corresponds to are the same): {} vs baseline {}",
                show(ew(new)),
                show(ew(baseline))
            ),
        });
    }
    let stats_only: Vec<&str> = [(new, "new"), (baseline, "baseline")]
        .iter()
        .filter(|(e, _)| e.run.stats_only)
        .map(|(_, w)| *w)
        .collect();
    if !stats_only.is_empty() {
        findings.push(Finding {
            checkpoint: None,
            kind: FindingKind::StatsOnly,
            failing: false,
            message: format!(
                "stats-only evidence ({}): checkpoint statuses compared, error growth not (no metrics)",
                stats_only.join(" and ")
            ),
        });
    }
    let rank = |v: Verdict| match v {
        Verdict::Pass => 0,
        Verdict::Diverged | Verdict::Error => 1,
    };
    let (nv, bv) = (new.effective_verdict(), baseline.effective_verdict());
    if rank(nv) > rank(bv) {
        findings.push(Finding {
            checkpoint: None,
            kind: FindingKind::VerdictWorsened { from: bv, to: nv },
            failing: true,
            message: format!("verdict worsened: {} -> {}", bv.as_str(), nv.as_str()),
        });
    }
    let base: HashMap<String, &CheckpointEvidence> =
        baseline.checkpoints.iter().map(|c| (c.id(), c)).collect();
    let mut checked = Vec::with_capacity(new.checkpoints.len());
    let mut seen = std::collections::HashSet::new();
    for c in &new.checkpoints {
        let id = c.id();
        checked.push(id.clone());
        seen.insert(id.clone());
        let Some(b) = base.get(&id) else {
            findings.push(Finding {
                checkpoint: Some(id.clone()),
                kind: FindingKind::Added,
                failing: false,
                message: format!("{id}: not in the baseline"),
            });
            continue;
        };
        findings.extend(status_change(&id, b.status, c.status));
        if let (Some(bm), Some(nm)) = (&b.metrics, &c.metrics) {
            growth(
                &mut findings,
                &id,
                "rel_l2",
                bm.rel_l2,
                nm.rel_l2,
                opts.factor,
                opts.rel_l2_floor,
            );
            growth(
                &mut findings,
                &id,
                "max_abs",
                bm.max_abs,
                nm.max_abs,
                opts.factor,
                opts.max_abs_floor,
            );
        }
    }
    for b in &baseline.checkpoints {
        let id = b.id();
        if !seen.contains(&id) {
            checked.push(id.clone());
            findings.push(Finding {
                checkpoint: Some(id.clone()),
                kind: FindingKind::Removed,
                failing: true,
                message: format!("{id}: in the baseline, absent from the new evidence"),
            });
        }
    }
    Ok(GateReport {
        family: new.run.family.clone(),
        checked,
        findings,
    })
}

/// JUnit XML (written by quick-junit, which escapes text and drops what XML 1.0 forbids): one
/// test case for the verdict and one per checked `checkpoint@step`; a failing one carries one
/// `<failure>` whose type names the kinds of its failing findings and whose text lists them.
pub fn junit_xml(r: &GateReport) -> Result<String, quick_junit::SerializeError> {
    let mut by_id: HashMap<Option<&str>, Vec<&Finding>> = HashMap::new();
    for f in r.failures() {
        by_id.entry(f.checkpoint.as_deref()).or_default().push(f);
    }
    let class = format!("xray.gate.{}", r.family);
    let case = |name: &str, fs: Option<&Vec<&Finding>>| {
        let status = match fs {
            None => TestCaseStatus::success(),
            Some(fs) => {
                let mut kinds: Vec<&str> = fs
                    .iter()
                    .map(|f| match f.kind {
                        FindingKind::VerdictWorsened { .. } => "verdict",
                        FindingKind::StatusWorsened { .. } => "status",
                        FindingKind::ErrorGrew { .. } => "error_growth",
                        FindingKind::CoverageDropped { .. } => "coverage",
                        _ => "removed",
                    })
                    .collect();
                kinds.sort_unstable();
                kinds.dedup();
                let messages: Vec<&str> = fs.iter().map(|f| f.message.as_str()).collect();
                let mut st = TestCaseStatus::non_success(NonSuccessKind::Failure);
                st.set_type(kinds.join(","))
                    .set_message(messages.join("; "))
                    .set_description(messages.join("\n"));
                st
            }
        };
        let mut c = TestCase::new(name, status);
        c.set_classname(class.as_str());
        c
    };
    let mut suite = TestSuite::new(class.as_str());
    suite.add_test_case(case("verdict", by_id.get(&None)));
    for id in &r.checked {
        suite.add_test_case(case(id, by_id.get(&Some(id.as_str()))));
    }
    let mut report = Report::new("xray gate");
    report.add_test_suite(suite);
    report.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::tests::checkpoint;
    use crate::evidence::Run;
    use crate::metrics::{compare_slices, Metrics};
    use crate::tolerance::Tolerance;

    fn metrics(rel: f64, max_abs: f64) -> Metrics {
        let mut m = compare_slices(&[1.0], &[1.0], &[1], &Tolerance::default_f32());
        m.rel_l2 = rel;
        m.max_abs = max_abs;
        m
    }

    fn cp(name: &str, status: Status, rel: f64, max_abs: f64) -> CheckpointEvidence {
        CheckpointEvidence {
            metrics: Some(metrics(rel, max_abs)),
            ..checkpoint(name, status)
        }
    }

    fn ev(verdict: Verdict, cps: Vec<CheckpointEvidence>) -> Evidence {
        Evidence {
            verdict,
            run: Run {
                family: "whisper".into(),
                weights_sha256: Some("ab".repeat(32)),
                audio_sha256: Some("cd".repeat(32)),
                contract_sha256: Some("ef".repeat(32)),
                ..Default::default()
            },
            checkpoints: cps,
            ..crate::evidence::tests::tiny()
        }
    }

    /// Passing evidence: one passing checkpoint a row `(name, rel_l2, max_abs)`.
    fn passing(rows: &[(&str, f64, f64)]) -> Evidence {
        let cps = rows
            .iter()
            .map(|&(name, rel, max_abs)| cp(name, Status::Pass, rel, max_abs));
        ev(Verdict::Pass, cps.collect())
    }

    /// `baseline` changed by `change`, and its gate against `baseline` (default options).
    fn changed(baseline: &Evidence, change: impl FnOnce(&mut Evidence)) -> (Evidence, GateReport) {
        let mut new = baseline.clone();
        change(&mut new);
        let r = gate(&new, baseline, &GateOptions::default()).expect("same run");
        (new, r)
    }

    /// A checkpoint observed in the baseline and unobserved now fails the gate, whether it passed
    /// or failed there; one unobserved in both is no finding.
    #[test]
    fn coverage_drop_is_a_regression() {
        let mut unobserved = cp("c", Status::Unobserved, 0.0, 0.0);
        unobserved.metrics = None;
        let base = ev(
            Verdict::Diverged,
            vec![
                cp("a", Status::Pass, 1e-6, 1e-5),
                cp("b", Status::Origin, 1e-1, 1e-1),
                unobserved.clone(),
                cp("d", Status::Pass, 1e-6, 1e-5),
            ],
        );
        let mut a = cp("a", Status::Unobserved, 0.0, 0.0);
        a.metrics = None;
        let mut b = cp("b", Status::NotComparable, 0.0, 0.0);
        b.metrics = None;
        let new = ev(
            Verdict::Pass,
            vec![a, b, unobserved, cp("d", Status::Pass, 1e-6, 1e-5)],
        );
        let r = gate(&new, &base, &GateOptions::default()).unwrap();
        let dropped: Vec<_> = r
            .failures()
            .filter(|f| matches!(f.kind, FindingKind::CoverageDropped { .. }))
            .map(|f| f.checkpoint.clone().unwrap())
            .collect();
        assert_eq!(dropped, ["a@step0", "b@step0"]);
        assert!(!r.passed());
        assert!(junit_xml(&r).unwrap().contains("type=\"coverage\""));
    }

    /// A converted engine's own weights file changing (same HF weights) is gated, and said in a
    /// non-failing finding naming both files.
    #[test]
    fn engine_weights_change_is_named_not_refused() {
        let cps = vec![cp("a", Status::Pass, 1e-6, 1e-5)];
        let with = |sha: &str| {
            let mut e = ev(Verdict::Pass, cps.clone());
            e.run.engine_weights = Some(xray_core::dump::EngineWeights {
                format: "ctranslate2".into(),
                sha256: sha.repeat(32),
                file: None,
                source: None,
                conversion: None,
                config: None,
            });
            e
        };
        let r = gate(&with("1a"), &with("2b"), &GateOptions::default()).unwrap();
        assert!(r.passed());
        let f: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.message.contains("engine weights file differs"))
            .collect();
        assert_eq!(f.len(), 1, "{:?}", r.findings);
        assert!(!f[0].failing && f[0].message.contains(&"2b".repeat(32)));
        let r = gate(&with("1a"), &with("1a"), &GateOptions::default()).unwrap();
        assert!(!r
            .findings
            .iter()
            .any(|f| f.message.contains("engine weights")));
    }

    /// Evidence for another clip, other weights, another family or another contract is refused;
    /// `allow_different_input` admits other weights/audio (reported), never another family or
    /// contract; a fact missing from one side counts as different.
    #[test]
    fn different_runs_are_refused() {
        let base = ev(Verdict::Pass, vec![cp("a", Status::Pass, 1e-6, 1e-5)]);
        let allow = GateOptions {
            allow_different_input: true,
            ..Default::default()
        };
        let with = |f: &dyn Fn(&mut Run)| {
            let mut e = base.clone();
            f(&mut e.run);
            e
        };
        let other_audio = with(&|r| r.audio_sha256 = Some("00".repeat(32)));
        match gate(&other_audio, &base, &GateOptions::default()) {
            Err(Error::IdentityMismatch {
                differences,
                overridable: true,
            }) => assert!(
                differences[0].starts_with("audio sha256"),
                "{differences:?}"
            ),
            other => panic!("another clip was gated: {other:?}"),
        }
        let r = gate(&other_audio, &base, &allow).expect("allowed");
        assert!(r.passed());
        assert!(r
            .findings
            .iter()
            .any(|f| f.kind == FindingKind::DifferentInput && !f.failing));
        let no_weights = with(&|r| r.weights_sha256 = None);
        assert!(gate(&no_weights, &base, &GateOptions::default()).is_err());
        for fixed in [
            with(&|r| r.family = "granite_nar".into()),
            with(&|r| r.contract_sha256 = Some("01".repeat(32))),
            with(&|r| r.contract_sha256 = None),
        ] {
            match gate(&fixed, &base, &allow) {
                Err(
                    e @ Error::IdentityMismatch {
                        overridable: false, ..
                    },
                ) => assert!(!e.to_string().contains("--allow-different-input"), "{e}"),
                other => panic!("family/contract difference was gated: {other:?}"),
            }
        }
    }

    /// Issue 23 item 4: what `xray check --resume` requires of earlier evidence: the gate's
    /// identity with nothing overridable, then isolation, stats-only and every setting.
    #[test]
    fn resume_requires_the_same_identity_and_settings() {
        use crate::evidence::{CheckSettings, RecordedOptions};
        let mut planned = ev(Verdict::Pass, vec![]).run;
        planned.settings = Some(CheckSettings {
            policy_sha256: "aa".repeat(32),
            options: RecordedOptions {
                max_steps: Some(4),
                threads: Some(1),
                ..Default::default()
            },
        });
        assert!(run_differences(&planned, &planned).is_empty());
        // The model path as spelled and the cache record are not identity.
        let mut same = planned.clone();
        same.model_path = "elsewhere/model".into();
        same.reference_cache = Some(Default::default());
        assert!(run_differences(&planned, &same).is_empty());
        let changed = |f: &dyn Fn(&mut Run)| {
            let mut e = planned.clone();
            f(&mut e);
            run_differences(&planned, &e)
        };
        let settings =
            |f: &dyn Fn(&mut CheckSettings)| changed(&|r| f(r.settings.as_mut().unwrap()));
        for (d, want) in [
            (
                changed(&|r| r.audio_sha256 = Some("00".repeat(32))),
                "audio sha256",
            ),
            (changed(&|r| r.weights_sha256 = None), "weights sha256"),
            (
                changed(&|r| r.contract_sha256 = Some("01".repeat(32))),
                "contract sha256",
            ),
            (changed(&|r| r.family = "granite_nar".into()), "family"),
            (changed(&|r| r.isolated = true), "isolated"),
            (changed(&|r| r.stats_only = true), "stats_only"),
            (changed(&|r| r.settings = None), "settings not recorded"),
            (
                settings(&|s| s.policy_sha256 = "bb".repeat(32)),
                "settings: policy_sha256",
            ),
            (
                settings(&|s| s.options.max_steps = None),
                "settings: max_steps 4 vs earlier null",
            ),
            (
                settings(&|s| s.options.faults = vec!["gelu_tanh".into()]),
                "settings: faults",
            ),
            (settings(&|s| s.options.drill = false), "settings: drill"),
        ] {
            assert_eq!(d.len(), 1, "{want}: {d:?}");
            assert!(d[0].starts_with(want), "{want}: {d:?}");
        }
    }

    /// Issue 24 item 13: evidence that observed nothing is no gate input (it used to pass as
    /// "0 checkpoints checked"); a recorded verdict is not believed over the checkpoints.
    #[test]
    fn an_empty_gate_is_refused_and_verdicts_come_from_the_checkpoints() {
        let full = ev(Verdict::Pass, vec![cp("a", Status::Pass, 1e-6, 1e-5)]);
        let mut empty = ev(Verdict::Error, vec![]);
        for (n, b) in [(&empty, &full), (&full, &empty), (&empty, &empty)] {
            match gate(n, b, &GateOptions::default()) {
                Err(e @ Error::Invalid { .. }) => {
                    assert!(e.to_string().contains("nothing to gate"), "{e}")
                }
                other => panic!("an empty gate was computed: {other:?}"),
            }
        }
        empty.checkpoints = vec![cp("a", Status::Unobserved, 0.0, 0.0)];
        assert!(gate(&empty, &full, &GateOptions::default()).is_err());
        // Recorded "pass" over an origin: the verdict finding is still there.
        let lying = ev(Verdict::Pass, vec![cp("a", Status::Origin, 1e-6, 1e-5)]);
        let r = gate(&lying, &full, &GateOptions::default()).unwrap();
        assert!(r
            .failures()
            .any(|f| matches!(f.kind, FindingKind::VerdictWorsened { .. })));
    }

    #[test]
    fn identical_evidence_passes() {
        let e = ev(Verdict::Pass, vec![cp("a", Status::Pass, 1e-6, 1e-5)]);
        let r = gate(&e, &e, &GateOptions::default()).expect("same run");
        assert!(r.passed());
        assert!(r.findings.is_empty());
    }

    #[test]
    fn status_and_verdict_worsening_fail() {
        let b = passing(&[("a", 1e-6, 1e-5), ("b", 1e-6, 1e-5)]);
        let (n, r) = changed(&b, |n| {
            n.verdict = Verdict::Diverged;
            n.checkpoints[0].status = Status::Origin;
        });
        assert!(!r.passed());
        let kinds: Vec<_> = r.failures().map(|f| f.checkpoint.clone()).collect();
        assert_eq!(kinds, vec![None, Some("a@step0".into())]);
        // The reverse direction is an improvement, not a failure.
        assert!(gate(&b, &n, &GateOptions::default())
            .expect("same run")
            .passed());
    }

    #[test]
    fn error_growth_respects_factor_and_floor() {
        let b = passing(&[("a", 1e-9, 1e-9), ("b", 1e-4, 1e-3)]);
        let (n, r) = changed(&b, |n| {
            n.checkpoints[0].metrics = Some(metrics(3e-9, 3e-9));
            n.checkpoints[1].metrics = Some(metrics(2.5e-4, 1.9e-3));
        });
        let f: Vec<_> = r.failures().collect();
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(matches!(
            f[0].kind,
            FindingKind::ErrorGrew {
                metric: "rel_l2",
                ..
            }
        ));
        assert_eq!(f[0].checkpoint.as_deref(), Some("b@step0"));
        let loose = GateOptions {
            factor: 3.0,
            ..Default::default()
        };
        assert!(gate(&n, &b, &loose).expect("same run").passed());
    }

    #[test]
    fn removed_fails_and_added_informs() {
        let b = passing(&[("a", 0.0, 0.0), ("gone", 0.0, 0.0)]);
        let (_, r) = changed(&b, |n| n.checkpoints[1] = cp("new", Status::Pass, 0.0, 0.0));
        assert!(!r.passed());
        assert_eq!(r.checked, ["a@step0", "new@step0", "gone@step0"]);
        assert!(r
            .findings
            .iter()
            .any(|f| f.kind == FindingKind::Added && !f.failing));
    }

    #[test]
    fn stats_only_evidence_is_gated_by_status_and_says_growth_was_not_compared() {
        let b = passing(&[("a", 1e-6, 1e-6)]);
        let (mut n, r) = changed(&b, |n| {
            n.run.stats_only = true;
            n.checkpoints[0].metrics = None;
        });
        assert!(r.passed());
        let f: Vec<&Finding> = r
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::StatsOnly)
            .collect();
        assert_eq!(f.len(), 1);
        assert!(
            !f[0].failing && f[0].message.contains("(new)"),
            "{}",
            f[0].message
        );
        // A status that worsens still fails.
        n.checkpoints[0].status = Status::Origin;
        assert!(!gate(&n, &b, &GateOptions::default()).unwrap().passed());
        // Two full runs carry no such finding.
        let r = gate(&b, &b, &GateOptions::default()).unwrap();
        assert!(!r.findings.iter().any(|f| f.kind == FindingKind::StatsOnly));
    }

    #[test]
    fn junit_has_one_case_per_checkpoint_and_escapes() {
        let b = passing(&[("a<&>\"'", 1e-3, 1e-3), ("ok", 0.0, 0.0)]);
        let (_, r) = changed(&b, |n| n.checkpoints[0].status = Status::Propagated);
        let x = junit_xml(&r).expect("junit");
        // The verdict worsened too: a propagated checkpoint does not pass, whatever the
        // recorded verdict says.
        assert_eq!(x.matches("<testcase ").count(), 3);
        assert_eq!(x.matches("<failure ").count(), 2);
        assert!(x.contains("name=\"a&lt;&amp;&gt;&quot;&apos;@step0\""));
        assert!(x.contains("tests=\"3\" skipped=\"0\" failures=\"2\""));
        assert!(!x.contains("a<&"));
        // What a CI reads back: the same cases, the failure on the checkpoint that worsened.
        let back = Report::deserialize_from_str(&x).expect("well-formed JUnit");
        let suite = &back.test_suites[0];
        assert_eq!((suite.tests, suite.failures), (3, 2));
        let failed: Vec<&str> = suite
            .test_cases
            .iter()
            .filter(|c| !matches!(c.status, TestCaseStatus::Success { .. }))
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(failed, ["verdict", "a<&>\"'@step0"]);
    }

    #[test]
    fn junit_drops_what_xml_forbids() {
        let b = passing(&[("a\u{1}b", 1e-3, 1e-3)]);
        let (_, r) = changed(&b, |n| n.checkpoints[0].status = Status::Propagated);
        let x = junit_xml(&r).expect("junit");
        assert!(!x.contains('\u{1}'));
        Report::deserialize_from_str(&x).expect("well-formed JUnit");
    }
}
