//! `xray selftest`: plant every catalogue fault in the runtime on the bundled fixtures and check
//! that the harness puts the origin exactly where the fault was planted (name and step). The
//! reference is computed once per (model, input) and reused for every fault; the clean run must
//! pass with no origin.

use std::path::{Path, PathBuf};

use xray_oracle::Oracle;
use xray_runtime::faults::{catalogue, plant, FaultPlan, Planted};
use xray_runtime::models;

use crate::check::{
    check_against, reference_dump, reference_request, CheckOptions, RecordedOptions, Reference,
    References,
};
use xray_core::ops::PointSelect;

/// One self-test case: fault name, the planted fault, the expected origin, whether it needs a
/// second input, the expected signature and the expected op-level signature.
type Case = (
    String,
    Option<Planted>,
    String,
    bool,
    Option<SignatureKind>,
    Option<SignatureKind>,
);
use xray_compare::evidence::Verdict;
use xray_compare::tolerance::Policy;
use xray_core::SignatureKind;

/// One row of the self-test table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// Family.
    pub family: String,
    /// Fault name (`clean` for the run without faults).
    pub fault: String,
    /// Where the origin must be (`-` for none).
    pub expected: String,
    /// Where the harness put it (`-` for none).
    pub reported: String,
    /// The signature the harness named for the origin (must equal the catalogue's expected
    /// signature when it declares one).
    pub signature: String,
    /// The ops the fault changes (`-` for a host fault of the model loop).
    pub expected_op: String,
    /// The op-level origin the harness named: `op NAME` when one op lies between agreeing
    /// points, `one of A, B, ...` when the reference exposes no tensor between several, the
    /// producer when the origin's region is one op; `-` for none.
    pub reported_op: String,
    /// The op-level origin's signature (`-` when there was no drill-down).
    pub op_signature: String,
    /// What reference replay found at the op-level origin: the counterfactual kind that
    /// reproduces the engine's output (`bias_missing`, `eps`), `none (N tried)` when the op is
    /// convicted but no counterfactual of its kind reproduces it, `cleared` when the replayed op
    /// computes correctly, `-` when nothing was replayed.
    pub mechanism: String,
    /// Whether reported == expected, the signature is the declared one, and the planted op is
    /// the op-level origin (or among its suspects when the reference exposes no tensor between
    /// them).
    pub pass: bool,
}

/// The op-level verdict of one self-test case: what was reported, its signature, and whether the
/// planted ops hold it.
fn op_origin(ev: &xray_compare::evidence::Evidence, planted: &[String]) -> (String, String, bool) {
    let Some(fd) = &ev.first_divergence else {
        return ("-".into(), "-".into(), planted.is_empty());
    };
    // A host fault of the model loop (no op computes it) passes on any op; what was reported
    // is shown all the same.
    let holds = |op: &String| planted.is_empty() || planted.contains(op);
    match &fd.op {
        Some(op) => {
            let sig = op
                .explanation
                .as_ref()
                .map_or("-".to_string(), |e| e.signature.to_string());
            match &op.op {
                Some(one) => (format!("op {one}"), sig, holds(one)),
                None => (
                    format!("one of {}", op.suspects.join(", ")),
                    sig,
                    op.suspects.iter().any(holds),
                ),
            }
        }
        // No drill-down: the origin's region is its producer alone.
        None => (
            format!("op {}", fd.producer),
            "-".into(),
            holds(&fd.producer),
        ),
    }
}

/// The op-level origin's replay mechanism, as the self-test table shows it ([`Row::mechanism`]).
fn mechanism(ev: &xray_compare::evidence::Evidence) -> String {
    use xray_compare::mechanism::ReplayVerdict;
    let Some(r) = ev
        .first_divergence
        .as_ref()
        .and_then(|f| f.op.as_ref())
        .and_then(|o| o.replay.as_ref())
    else {
        return "-".into();
    };
    match (&r.mechanism, r.local_error.verdict) {
        (Some(m), _) => serde_json::to_value(&m.counterfactual)
            .ok()
            .and_then(|v| v["kind"].as_str().map(str::to_string))
            .unwrap_or_else(|| m.counterfactual.phrase()),
        (None, ReplayVerdict::Cleared) => "cleared".into(),
        (None, ReplayVerdict::Convicted) => format!("none ({} tried)", r.tried.len()),
    }
}

/// A fixture the self-test runs on.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// Model directory.
    pub model: PathBuf,
    /// Input.
    pub audio: PathBuf,
    /// A different input for stale-state faults.
    pub second_audio: PathBuf,
}

/// Run the self-test over fixtures; `only` restricts to fault names.
pub fn selftest(
    fixtures: &[Fixture],
    policy: &Policy,
    only: &[String],
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<Row>> {
    let refs = References::with_oracle(Oracle::discover()?);
    let mut rows = Vec::new();
    for fx in fixtures {
        let model = models::load(&fx.model)?;
        let family = model.family();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fx.model.join("config.json"))?)?;
        let base = CheckOptions {
            model: fx.model.clone(),
            audio: fx.audio.clone(),
            policy: policy.clone(),
            recorded: RecordedOptions {
                threads: Some(1),
                ..Default::default()
            },
            ..Default::default()
        };
        progress(&format!(
            "{family}: reference run on {}",
            fx.audio.display()
        ));
        // Every op-level point once in the reference: each fault's drill-down then re-runs only
        // the runtime.
        let audio = xray_runtime::audio::load_wav(&fx.audio, 16000)?;
        let req = reference_request(model.as_ref(), &base, &audio)?.with_ops(PointSelect::All);
        let ref_run = refs.oracle()?.run(&req)?;
        let reference = Reference {
            dump: reference_dump(&ref_run, family, &fx.model.display().to_string()),
            req,
            lookup: None,
        };
        drop(ref_run);
        let mut cases: Vec<Case> = vec![("clean".into(), None, "-".into(), false, None, None)];
        for e in catalogue().into_iter().filter(|e| e.family == family) {
            if !only.is_empty() && !only.iter().any(|o| o == e.name) {
                continue;
            }
            let (cp, step) = e.expected_origin;
            let cp = model.contract().expand_name(cp)?;
            let planted = plant(e.name, family, &config)?;
            cases.push((
                e.name.to_string(),
                Some(planted),
                xray_core::key(&cp, step).to_string(),
                e.needs_second_input,
                e.expected_signature,
                e.expected_op_signature,
            ));
        }
        for (name, planted, expected, second, want_sig, want_op_sig) in cases {
            progress(&format!("{family}: {name}"));
            let planted_ops = planted
                .as_ref()
                .map(|p| p.ops(model.graph()))
                .unwrap_or_default();
            let plan = FaultPlan {
                planted: planted.into_iter().collect(),
            };
            let opts = CheckOptions {
                faults: plan,
                recorded: RecordedOptions {
                    faults: vec![name.clone()],
                    ..base.recorded.clone()
                },
                warmup_audio: second.then(|| fx.second_audio.clone()),
                ..base.clone()
            };
            let out = check_against(model.as_ref(), &refs, &reference, &opts, &audio, &|_| {})?;
            let ev = out.evidence;
            let (reported, signature) = match &ev.first_divergence {
                Some(f) => (
                    xray_core::key(&f.checkpoint, f.step).to_string(),
                    f.explanation.as_ref().map(|x| x.signature),
                ),
                None => ("-".into(), None),
            };
            let (reported_op, op_signature, op_pass) = op_origin(&ev, &planted_ops);
            let pass = if name == "clean" {
                ev.verdict == Verdict::Pass && reported == "-"
            } else {
                reported == expected
                    && want_sig.is_none_or(|w| signature == Some(w))
                    && op_pass
                    && want_op_sig.is_none_or(|w| op_signature == w.as_str())
            };
            rows.push(Row {
                family: family.into(),
                fault: name,
                expected,
                reported,
                signature: signature.map(|k| k.to_string()).unwrap_or_default(),
                expected_op: if planted_ops.is_empty() {
                    "-".into()
                } else {
                    planted_ops.join(", ")
                },
                reported_op,
                op_signature,
                mechanism: mechanism(&ev),
                pass,
            });
        }
    }
    Ok(rows)
}

/// Render the table as Markdown.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from("| family | fault | expected origin | reported origin | signature | planted op | reported op | op signature | mechanism | result |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.family,
            r.fault,
            r.expected,
            r.reported,
            if r.signature.is_empty() {
                "-"
            } else {
                &r.signature
            },
            r.expected_op,
            r.reported_op,
            r.op_signature,
            r.mechanism,
            if r.pass { "pass" } else { "FAIL" }
        ));
    }
    let n = rows.len();
    let p = rows.iter().filter(|r| r.pass).count();
    s.push_str(&format!("\n{p} passed, {} failed\n", n - p));
    s
}

/// The bundled fixtures (relative to the repository root): each registered family's
/// descriptor names its own (`selftest`).
pub fn bundled(root: &Path) -> anyhow::Result<Vec<Fixture>> {
    xray_runtime::models::families()
        .iter()
        .map(|f| {
            let s = &f.descriptor()?.selftest;
            Ok(Fixture {
                model: root.join(&s.model),
                audio: root.join(&s.audio),
                second_audio: root.join(&s.second_audio),
            })
        })
        .collect()
}
