//! `xray compare REF_DIR GOT_DIR [--isolated DIR]...`: offline comparison of two dumps; no Python
//! needed. The checkpoint graph comes from the family's contract, resolved against the model
//! config the reference dump carries (or `--model DIR`). A checkpoint the dump under test does not
//! hold is `unobserved` (a failure with `--require-all`); steps after the token streams part are
//! `not_comparable`; `extra.fed` edges and `--isolated` runs give each stage its local error.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use xray_compare::compare::CompareOptions;
use xray_compare::evidence::{Run, Transcript, Verdict};
use xray_compare::ops::{both_have_points, compare_points, dump_points, has_points, localize_op};
use xray_compare::pipeline::{
    compare_dumps_isolated, compare_stats_dumps, oracle_versions, token_alignment,
};
use xray_compare::report;
use xray_compare::tolerance::Policy;
use xray_core::contract::Contract;
use xray_core::dump::Dump;
use xray_core::ops::chain;
use xray_runtime::models::SpeechModel;

/// Arguments of `xray compare`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Reference dump directory (e.g. from `xray oracle`).
    pub reference: PathBuf,
    /// Dump under test (e.g. from `xray run`, or another engine).
    pub got: PathBuf,
    /// Model directory whose config.json resolves the contract (default: the config recorded in
    /// the reference dump).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Write the evidence JSON here.
    #[arg(long, value_name = "FILE")]
    pub evidence: Option<PathBuf>,
    /// Tolerance policy.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Write the HTML report here.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Write Markdown here.
    #[arg(long, value_name = "FILE.md")]
    pub markdown: Option<PathBuf>,
    /// Print the evidence JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// A checkpoint absent from the dump under test fails (`missing`) instead of being
    /// `unobserved`.
    #[arg(long)]
    pub require_all: bool,
    /// A run of the same engine fed the reference's tensor at some edges (its manifest's
    /// `extra.fed`); each checkpoint's local error (`local_metrics`) comes from the run fed
    /// nearest upstream of it. Repeatable.
    #[arg(long, value_name = "DIR")]
    pub isolated: Vec<PathBuf>,
}

/// Compares two dumps (full or stats-only: the same evidence, report and Markdown outputs either
/// way). Exit 0 pass, 1 divergence, 2 input error.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut outputs = super::Outputs::default();
    for (what, p) in [
        ("evidence", &a.evidence),
        ("report", &a.report),
        ("markdown", &a.markdown),
    ] {
        if let Some(p) = p {
            outputs.file(what, p);
        }
    }
    outputs
        .input("reference dump", &a.reference)
        .input("dump under test", &a.got);
    for d in &a.isolated {
        outputs.input("isolated dump", d);
    }
    if let Some(m) = &a.model {
        outputs.input("model directory", m);
    }
    if let Some(p) = &a.policy {
        outputs.input("policy", p);
    }
    outputs.check()?;
    let reference = Dump::load(&a.reference)?;
    let got = Dump::load(&a.got)?;
    let isolated = a
        .isolated
        .iter()
        .map(|d| Dump::load(d))
        .collect::<Result<Vec<_>, _>>()?;
    for (what, d) in std::iter::once(("got", &got)).chain(isolated.iter().map(|d| ("isolated", d)))
    {
        if reference.manifest.family != d.manifest.family {
            return Err(anyhow!(
                "family mismatch: reference is {}, {what} {} is {}",
                reference.manifest.family,
                d.dir.display(),
                d.manifest.family
            ));
        }
        // Local errors measured on other weights or audio would measure nothing.
        if what == "isolated"
            && (d.manifest.weights_sha256 != reference.manifest.weights_sha256
                || d.manifest.audio_sha256 != reference.manifest.audio_sha256)
        {
            return Err(anyhow!(
                "{}: other weights or audio than the reference {}",
                d.dir.display(),
                a.reference.display()
            ));
        }
    }
    let config = match &a.model {
        Some(m) => super::read_config(m)?,
        None => reference
            .manifest
            .extra
            .get("config")
            .cloned()
            .ok_or_else(|| {
                anyhow!(
                    "{}: the manifest records no model config; pass --model DIR",
                    a.reference.display()
                )
            })?,
    };
    // A foreign dump's extra.config is untrusted like a config.json: core bounds what it reads.
    let contract =
        Contract::for_family(&reference.manifest.family, &config).with_context(|| {
            match &a.model {
                Some(m) => format!("{}", m.join("config.json").display()),
                None => format!("{}: the manifest's extra.config", a.reference.display()),
            }
        })?;
    let policy = match &a.policy {
        Some(p) => Policy::load(p)?,
        None => Policy::default(),
    };
    let opts = CompareOptions {
        policy,
        require_all: a.require_all,
        ..Default::default()
    };
    let stats_only = reference.manifest.stats_only || got.manifest.stats_only;
    if stats_only && !isolated.is_empty() {
        return Err(anyhow!(
            "--isolated needs full dumps; {} or {} is stats-only",
            a.reference.display(),
            a.got.display()
        ));
    }
    let (cmp, fed, tokens) = if stats_only {
        // Stats-only (large-model) dumps: each checkpoint judged from its summaries (order-
        // sensitive sketch, mean, rms, counts), localized along the same graph.
        // The token alignment from the manifests, so a parting is placed at its step; the
        // stats-only comparison judges every step, so none is claimed not comparable.
        let tokens = token_alignment(&contract, &reference, &got)
            .context("comparing")?
            .map(|mut t| {
                t.not_comparable_steps = None;
                t
            });
        (
            compare_stats_dumps(&contract, &reference, &got, &opts).context("comparing")?,
            vec![],
            tokens,
        )
    } else {
        compare_dumps_isolated(
            &contract,
            &reference,
            &got,
            isolated.iter().collect(),
            &opts,
        )
        .context("comparing")?
    };
    let mut notes = vec![];
    if stats_only {
        notes.push("stats-only comparison: metrics are estimated from each checkpoint's summary (see its note); re-tap with `xray run --only` for full tensors".to_string());
    }
    for (side, d) in [("reference", &reference), ("dump under test", &got)] {
        if !d.unlisted.is_empty() {
            let msg = format!(
                "{} ({side}) holds files its manifest does not list (ignored): {}",
                d.dir.display(),
                d.unlisted.join(", ")
            );
            super::note(&format!("xray: note: {msg}"));
            notes.push(msg);
        }
    }
    if reference.manifest.weights_sha256 != got.manifest.weights_sha256 {
        notes.push(format!(
            "weights sha256 differ: reference {} vs {}",
            reference.manifest.weights_sha256, got.manifest.weights_sha256
        ));
    }
    if reference.manifest.audio_sha256 != got.manifest.audio_sha256 {
        notes.push(format!(
            "audio sha256 differ: reference {} vs {}",
            reference.manifest.audio_sha256, got.manifest.audio_sha256
        ));
    }
    let run = Run {
        family: reference.manifest.family.clone(),
        model_path: reference.manifest.model_id.clone(),
        weights_sha256: Some(reference.manifest.weights_sha256.clone()),
        audio_sha256: Some(reference.manifest.audio_sha256.clone()),
        runtime_version: got
            .manifest
            .tools
            .get("runtime")
            .cloned()
            .unwrap_or_else(|| got.manifest.producer.clone()),
        oracle: Some(oracle_versions(&reference.manifest.tools)),
        isolated: !isolated.is_empty(),
        stats_only,
        contract_sha256: Some(contract.sha256()),
        dumps: Some(xray_compare::evidence::RunDumps {
            reference: super::absolute(&a.reference),
            got: super::absolute(&a.got),
        }),
    };
    if let Some(t) = tokens.as_ref().filter(|t| t.teacher_forced) {
        notes.push(format!(
            "the dump under test was teacher-forced on the reference's tokens (extra.fed.tokens): every step is compared{}",
            t.parted_at_step.map_or(String::new(), |k| format!(
                "; its own argmax first differs at step {k}"
            ))
        ));
    }
    let transcript = Transcript {
        runtime: got.manifest.transcript.clone(),
        reference: reference.manifest.transcript.clone(),
        tokens_equal: got.manifest.tokens == reference.manifest.tokens,
        first_divergent_step: None,
    };
    let mut ev = cmp.into_evidence_with(run, Some(transcript), None, notes, fed, tokens);
    if let Some(n) = super::not_compared(&ev) {
        ev.notes.push(n);
    }
    let model = match &a.model {
        Some(dir) => Some(xray_runtime::models::load(dir)?),
        None => None,
    };
    if let (Some(m), Some(dir)) = (&model, &a.model) {
        refine_suspects(&mut ev, m.as_ref(), dir)?;
    }
    if !stats_only {
        op_level(
            &mut ev,
            &reference,
            &got,
            model.as_deref(),
            a.model.as_deref(),
            &opts.policy,
        );
    }
    // The evidence first, then the reports; a failed write does not stop the rest.
    if let Some(p) = &a.evidence {
        outputs.write_evidence(p, &ev.to_json()?);
    }
    if let Some(p) = &a.report {
        outputs.write_file("report", p, report::html(&ev).as_bytes());
    }
    if let Some(p) = &a.markdown {
        outputs.write_file("markdown", p, report::markdown(&ev).as_bytes());
    }
    if a.json {
        super::say(&ev.to_json()?)?;
    }
    super::note(&super::summary(&ev));
    outputs.finish()?;
    Ok(if ev.verdict == Verdict::Pass {
        ExitCode::SUCCESS
    } else {
        super::exit_fail()
    })
}

/// With `--model DIR`, the suspects of every divergence behind an unobserved region come from
/// X-Ray's runtime graph of that model: every op between the region's known-good checkpoints
/// and the failing one (`Graph::ops_between`), weightless and unlabelled ops included, instead
/// of the contract's checkpoint producers.
fn refine_suspects(
    ev: &mut xray_compare::evidence::Evidence,
    model: &dyn SpeechModel,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let g = model.graph();
    let mut refined = false;
    for fd in ev
        .first_divergence
        .iter_mut()
        .chain(ev.independent.iter_mut())
    {
        let Some(region) = &fd.region else { continue };
        let after: Vec<&str> = region.after.iter().map(|i| i.checkpoint.as_str()).collect();
        fd.suspects = g.ops_between(&after, &fd.checkpoint)?;
        refined = true;
    }
    if refined {
        ev.notes.push(format!(
            "suspects: the runtime graph's ops between the last good checkpoints and the failing one ({})",
            dir.display()
        ));
    }
    Ok(())
}

/// When both dumps carry op-level points (`--ops`), localize to the op: at the origin's step, the
/// first point that differs ([`localize_op`]) becomes `first_divergence.op`. The points' graph is
/// X-Ray's runtime graph of `--model` (its ops name the suspects; its weights give the linear
/// ops' reference weight), else the reference's points in firing order. Without an origin, a
/// point that differs while every checkpoint agrees is noted.
fn op_level(
    ev: &mut xray_compare::evidence::Evidence,
    reference: &Dump,
    got: &Dump,
    model: Option<&dyn SpeechModel>,
    model_dir: Option<&std::path::Path>,
    policy: &Policy,
) {
    if has_points(reference) && has_points(got) {
        ev.op_points = Some(compare_points(reference, got, policy));
    }
    let lookup =
        |module: &str| model.and_then(|m| m.weights().get(&format!("{module}.weight")).cloned());
    let nodes = |step: u32| match model {
        Some(m) => m.graph().point_nodes(),
        None => chain(&dump_points(reference, step)),
    };
    let source = match model {
        Some(_) => "the runtime graph's op-level points",
        None => "the reference's op-level points in firing order (pass --model DIR for the runtime graph's ops and weights)",
    };
    if let Some(fd) = ev.first_divergence.as_mut() {
        let step = fd.step;
        if !both_have_points(reference, got, step) {
            return;
        }
        fd.op = localize_op(&nodes(step), reference, got, step, policy, Some(&lookup));
        let note = match &fd.op {
            Some(op) => format!("op-level origin from {source}: {}", op.summary()),
            None => format!("the op-level points both dumps hold at step {step} agree ({source})"),
        };
        ev.notes.push(note);
        if let Some(op) = fd.op.as_mut() {
            let notes = replay(op, &nodes(step), reference, got, model, model_dir, policy);
            ev.notes.extend(notes);
        }
        return;
    }
    for step in xray_compare::pipeline::dump_steps(reference) {
        if !both_have_points(reference, got, step) {
            continue;
        }
        if let Some(op) = localize_op(&nodes(step), reference, got, step, policy, Some(&lookup)) {
            ev.notes.push(format!(
                "op-level point {}@step{step} differs while every checkpoint agrees: {}",
                op.point,
                op.summary()
            ));
            return;
        }
    }
}

/// Reference replay at the op-level origin (`xray_compare::mechanism`): with `--model DIR` and
/// the oracle, the named module is re-run on the dump's own input, which clears or convicts the
/// op and names the counterfactual that reproduces its output.
#[cfg(feature = "oracle")]
fn replay(
    op: &mut xray_compare::ops::OpDivergence,
    nodes: &[xray_core::ops::PointNode],
    reference: &Dump,
    got: &Dump,
    model: Option<&dyn SpeechModel>,
    model_dir: Option<&std::path::Path>,
    policy: &Policy,
) -> Vec<String> {
    let Some(dir) = model_dir else {
        return vec![format!(
            "replay: pass --model DIR (the reference model) to re-run {} on the dump's own input: it would clear or convict the op and test the mechanisms of its kind",
            op.module
        )];
    };
    match xray_oracle::Oracle::discover() {
        Ok(oracle) => xray_harness::replay::replay_origin(
            op,
            nodes,
            reference,
            got,
            policy,
            &oracle,
            &reference.manifest.family,
            dir,
            model.map(|m| m.graph()),
        ),
        Err(e) => vec![format!("replay: not run, the oracle is unavailable: {e}")],
    }
}

/// Without the oracle feature: one line of what replay would add.
#[cfg(not(feature = "oracle"))]
fn replay(
    op: &mut xray_compare::ops::OpDivergence,
    _nodes: &[xray_core::ops::PointNode],
    _reference: &Dump,
    _got: &Dump,
    _model: Option<&dyn SpeechModel>,
    _model_dir: Option<&std::path::Path>,
    _policy: &Policy,
) -> Vec<String> {
    vec![format!(
        "replay: this xray is built without the oracle feature; with it (and --model DIR) {} would be re-run through the HF reference on the dump's own input, clearing or convicting the op and naming the counterfactual (transposed weight, missing bias, wrong epsilon, ...) that reproduces its output",
        op.module
    )]
}
