//! `xray selftest`: plant every catalogue fault in the runtime on the bundled fixtures and check
//! that the harness puts the origin exactly where the fault was planted (name and step). The
//! reference is computed once per (model, input) and reused for every fault; the clean run must
//! pass with no origin.

use std::path::{Path, PathBuf};

use xray_oracle::Oracle;
use xray_runtime::faults::{catalogue, plant, FaultPlan, Planted};
use xray_runtime::models;

use crate::check::{check_against, reference_request, CheckOptions};
use xray_compare::evidence::Verdict;
use xray_compare::tolerance::Policy;

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
    /// Whether reported == expected.
    pub pass: bool,
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
    let oracle = Oracle::discover()?;
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
            threads: Some(1),
            ..Default::default()
        };
        progress(&format!(
            "{family}: reference run on {}",
            fx.audio.display()
        ));
        let req = reference_request(model.as_ref(), &base)?;
        let ref_run = oracle.run(&req)?;
        let mut cases: Vec<(String, Option<Planted>, String, bool, &str)> =
            vec![("clean".into(), None, "-".into(), false, "")];
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
                format!("{cp}@step{step}"),
                e.needs_second_input,
                e.expected_signature,
            ));
        }
        for (name, planted, expected, second, want_sig) in cases {
            progress(&format!("{family}: {name}"));
            let plan = FaultPlan {
                planted: planted.into_iter().collect(),
            };
            let opts = CheckOptions {
                faults: plan,
                fault_names: vec![name.clone()],
                warmup_audio: second.then(|| fx.second_audio.clone()),
                ..base.clone()
            };
            let out = check_against(model.as_ref(), &oracle, &req, &ref_run, &opts, &|_| {})?;
            let ev = out.evidence;
            let (reported, signature) = match &ev.first_divergence {
                Some(f) => (
                    format!("{}@step{}", f.checkpoint, f.step),
                    f.explanation
                        .as_ref()
                        .map(|x| x.signature.clone())
                        .unwrap_or_default(),
                ),
                None => ("-".into(), String::new()),
            };
            let pass = if name == "clean" {
                ev.verdict == Verdict::Pass && reported == "-"
            } else {
                reported == expected && (want_sig.is_empty() || signature == want_sig)
            };
            rows.push(Row {
                family: family.into(),
                fault: name,
                expected,
                reported,
                signature,
                pass,
            });
        }
    }
    Ok(rows)
}

/// Render the table as Markdown.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from("| family | fault | expected origin | reported origin | signature | result |\n|---|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.family,
            r.fault,
            r.expected,
            r.reported,
            if r.signature.is_empty() {
                "-"
            } else {
                &r.signature
            },
            if r.pass { "pass" } else { "FAIL" }
        ));
    }
    let n = rows.len();
    let p = rows.iter().filter(|r| r.pass).count();
    s.push_str(&format!("\n{p} passed, {} failed\n", n - p));
    s
}

/// The bundled fixtures (relative to the repository root).
pub fn bundled(root: &Path) -> Vec<Fixture> {
    vec![
        Fixture {
            model: root.join("fixtures/build/whisper-rand-a"),
            audio: root.join("fixtures/audio/fox.wav"),
            second_audio: root.join("fixtures/audio/weather.wav"),
        },
        Fixture {
            model: root.join("fixtures/build/granite-nar-tiny"),
            audio: root.join("fixtures/audio/fox.wav"),
            second_audio: root.join("fixtures/audio/weather.wav"),
        },
    ]
}
