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
use xray_compare::ops::{
    both_have_points, compare_points, dump_points, has_points, held_graph, localize_op,
    with_same_as,
};
use xray_compare::pipeline::{
    compare_dumps_isolated, compare_stats_dumps, oracle_versions, token_alignment, Suppression,
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
    /// A reference variant's dump (`xray oracle --weights-variant SCHEME`: the HF model with its
    /// weights on a named grid, e.g. int8): every observed checkpoint is also measured against
    /// it, and the evidence says how much of the divergence it explains (`reference_variants`).
    /// Repeatable.
    #[arg(long, value_name = "DIR")]
    pub variant: Vec<PathBuf>,
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
    for d in &a.variant {
        outputs.input("reference variant dump", d);
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
        if what == "isolated" {
            if let Some(diff) = identity_difference(&reference, d) {
                return Err(anyhow!(
                    "{}: {diff}; an isolated run must use the reference's weights and audio",
                    d.dir.display()
                ));
            }
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
    // The suppress lists (for `logits_processed` entries and to name undeclared suppression):
    // the model directory's generation_config.json with --model, else the reference's manifest.
    let suppression = match &a.model {
        Some(m) => match std::fs::read_to_string(m.join("generation_config.json")) {
            Ok(text) => {
                let p = m.join("generation_config.json");
                let v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| anyhow!("{}: {e}", p.display()))?;
                Suppression::from_config(&v, &p.display().to_string()).map_err(|e| anyhow!(e))?
            }
            Err(_) => Suppression::of_dump(&reference)?,
        },
        None => Suppression::of_dump(&reference)?,
    };
    let model = match &a.model {
        Some(dir) => Some(xray_runtime::models::load(dir)?),
        None => None,
    };
    let (policy, precision) = declared_precision(policy, &got, &a.got, model.as_deref())?;
    let opts = CompareOptions {
        policy,
        require_all: a.require_all,
        suppression,
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
    let (cmp, fed, tokens, declared) = if stats_only {
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
            vec![],
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
    // Identity: the HF weights (`weights_sha256`, for a converted engine the source its
    // `engine_weights` were converted from or into) and the audio; a difference is said on the
    // console, naming which.
    if let Some(diff) = identity_difference(&reference, &got) {
        super::note(&format!("xray: note: {diff}"));
        notes.push(diff);
    }
    if let Some(ew) = &got.manifest.engine_weights {
        let msg = format!(
            "engine weights: {} ({}, sha256 {}), declared to correspond to the HF weights sha256 {}{}{}",
            ew.file.as_deref().unwrap_or("(file not named)"),
            ew.format,
            short(&ew.sha256),
            short(&got.manifest.weights_sha256),
            ew.source.as_ref().map_or(String::new(), |s| format!(" ({s})")),
            ew.conversion.as_ref().map_or(String::new(), |c| format!(": {c}")),
        );
        super::note(&format!("xray: {msg}"));
        notes.push(msg);
    }
    if let Some(msg) = config_difference(&reference, &got, a.model.is_some(), &config) {
        super::note(&format!("xray: note: {msg}"));
        notes.push(msg);
    }
    for n in declared {
        super::note(&format!("xray: {n}"));
        notes.push(n);
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
        engine_weights: got.manifest.engine_weights.clone(),
        ..Default::default()
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
    for dir in &a.variant {
        let variant = Dump::load(dir)?;
        let v = xray_compare::variant::compare_variant(
            &contract,
            &reference,
            &got,
            &variant,
            opts.suppression.as_ref(),
            &ev,
        )
        .context("comparing with the reference variant")?;
        super::note(&format!("xray: {}", v.summary));
        ev.notes.push(v.summary.clone());
        ev.reference_variants.push(v);
    }
    if let Some(n) = super::not_compared(&ev) {
        ev.notes.push(n);
    }
    if let Some(p) = precision {
        let line = p.summary();
        super::note(&format!("xray: {line}"));
        ev.notes.push(line);
        ev.precision = Some(p);
    }
    if let (Some(m), Some(dir)) = (&model, &a.model) {
        refine_suspects(&mut ev, m.as_ref(), dir)?;
    }
    if !stats_only {
        op_level(
            &mut ev,
            &reference,
            &got,
            &contract,
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

/// The policy with the precision `got` declares applied (`extra.precision`, docs/tolerances.md
/// "Declared precision"), and what the evidence says of it (`None`: nothing declared). The ops
/// are found in `model`'s graph, whose edges say which checkpoints and points each reaches; a
/// policy that accepts a precision without `--model` is refused, as is a declared op the graph
/// does not have.
fn declared_precision(
    policy: Policy,
    got: &Dump,
    got_dir: &std::path::Path,
    model: Option<&dyn SpeechModel>,
) -> anyhow::Result<(Policy, Option<xray_compare::precision::PrecisionEvidence>)> {
    let ops = xray_compare::precision::declared(got)?;
    if ops.is_empty() {
        return Ok((policy, None));
    }
    let names: Vec<&str> = ops.iter().map(|d| d.op.as_str()).collect();
    let reached = match model {
        Some(m) => m.graph().reached_from(&names).with_context(|| {
            format!(
                "{}: extra.precision declares an op X-Ray's graph of --model does not have",
                got_dir.display()
            )
        })?,
        None if !policy.spec().accept_precision.is_empty() => {
            return Err(anyhow!(
                "the policy accepts a declared precision (accept_precision) and {} declares {} op(s) computed below f32: pass --model DIR, whose graph says which checkpoints each declared op reaches",
                got_dir.display(),
                ops.len()
            ))
        }
        None => vec![],
    };
    let (policy, ev) = xray_compare::precision::apply(policy, ops, reached);
    Ok((policy, Some(ev)))
}

/// The first 12 hex digits of a sha256 (console lines).
fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// What differs between the reference's identity and a dump's, in one sentence naming which
/// (weights, audio or both, with both sides' sha256 and, for a converted engine, its own file),
/// or `None` when both match.
fn identity_difference(reference: &Dump, d: &Dump) -> Option<String> {
    let (r, m) = (&reference.manifest, &d.manifest);
    let mut parts = Vec::new();
    if r.weights_sha256 != m.weights_sha256 {
        let own = match &m.engine_weights {
            Some(ew) => format!(
                " (its own {} file {} is sha256 {})",
                ew.format,
                ew.file.as_deref().unwrap_or("?"),
                short(&ew.sha256)
            ),
            None if m.producer != "oracle" && m.producer != "runtime" => " (an engine on converted weights declares the HF weights it was converted from as weights_sha256 and its own file as engine_weights: docs/dump-format.md)".to_string(),
            None => String::new(),
        };
        parts.push(format!(
            "weights differ: the reference computed on weights sha256 {} ({}), {} declares {}{own}",
            short(&r.weights_sha256),
            r.model_id,
            d.dir.display(),
            short(&m.weights_sha256),
        ));
    }
    if r.audio_sha256 != m.audio_sha256 {
        parts.push(format!(
            "audio differs: the reference's audio sha256 {}, {}'s {}",
            short(&r.audio_sha256),
            d.dir.display(),
            short(&m.audio_sha256)
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// `extra.config` is the HF config.json the contract resolves from; a dump under test that
/// carries another one (a converted engine's own config.json) is named here, with the keys that
/// differ from the config the comparison used.
fn config_difference(
    reference: &Dump,
    got: &Dump,
    from_model: bool,
    used: &serde_json::Value,
) -> Option<String> {
    let theirs = got.manifest.extra.get("config")?;
    if theirs == used {
        return None;
    }
    let (a, b) = (used.as_object(), theirs.as_object());
    let mut keys: Vec<String> = match (a, b) {
        (Some(a), Some(b)) => a
            .keys()
            .chain(b.keys())
            .filter(|k| a.get(*k) != b.get(*k))
            .cloned()
            .collect(),
        _ => vec!["(not an object)".into()],
    };
    keys.sort();
    keys.dedup();
    let n = keys.len();
    keys.truncate(8);
    Some(format!(
        "{}'s extra.config is not the config the contract was resolved from ({}): {n} keys differ ({}{}); extra.config must be the HF config.json of the weights weights_sha256 names (a converted engine's own config goes in engine_weights.config)",
        got.dir.display(),
        if from_model {
            "--model's config.json".to_string()
        } else {
            format!("{}'s extra.config", reference.dir.display())
        },
        keys.join(", "),
        if n > 8 { ", ..." } else { "" }
    ))
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
    contract: &Contract,
    model: Option<&dyn SpeechModel>,
    model_dir: Option<&std::path::Path>,
    policy: &Policy,
) {
    if has_points(reference) && has_points(got) {
        ev.op_points = Some(compare_points(reference, got, policy));
    }
    let lookup =
        |module: &str| model.and_then(|m| m.weights().get(&format!("{module}.weight")).cloned());
    // The points' graph as both dumps observe it: the contract's `same_as` names added (a
    // module boundary such as `model.encoder:in` on the node of `model.encoder.conv1:in`), and
    // a node whose inputs the dumps do not hold linked to its nearest held ancestors.
    let same_as = contract.same_as();
    let nodes = |step: u32| {
        let n = match model {
            Some(m) => m.graph().point_nodes(),
            None => chain(&dump_points(reference, step)),
        };
        held_graph(&with_same_as(n, &same_as), reference, got, step)
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
            let notes = replay(
                op,
                &nodes(step),
                reference,
                got,
                contract,
                model,
                model_dir,
                policy,
            );
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
#[allow(clippy::too_many_arguments)]
fn replay(
    op: &mut xray_compare::ops::OpDivergence,
    nodes: &[xray_core::ops::PointNode],
    reference: &Dump,
    got: &Dump,
    contract: &Contract,
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
            contract,
            dir,
            model.map(|m| m.graph()),
        ),
        Err(e) => vec![format!("replay: not run, the oracle is unavailable: {e}")],
    }
}

/// Without the oracle feature: one line of what replay would add.
#[cfg(not(feature = "oracle"))]
#[allow(clippy::too_many_arguments)]
fn replay(
    op: &mut xray_compare::ops::OpDivergence,
    _nodes: &[xray_core::ops::PointNode],
    _reference: &Dump,
    _got: &Dump,
    _contract: &Contract,
    _model: Option<&dyn SpeechModel>,
    _model_dir: Option<&std::path::Path>,
    _policy: &Policy,
) -> Vec<String> {
    vec![xray_harness::replay::not_built(&op.module)]
}
