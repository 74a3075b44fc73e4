//! `xray compare REF_DIR GOT_DIR [--isolated DIR]...`: offline comparison of two dumps; no Python
//! needed. The checkpoint graph comes from the family's contract, resolved against the model
//! config the reference dump carries (or `--model DIR`). A checkpoint the dump under test does not
//! hold is `unobserved` (a failure with `--require-all`); steps after the token streams part are
//! `not_comparable`; `extra.fed` edges and `--isolated` runs give each stage its local error.

use std::path::PathBuf;
use std::process::ExitCode;
use xray_core::Step;

use anyhow::anyhow;
use xray_compare::evidence::{RunDumps, Verdict};
use xray_compare::offline::{
    compare_dumps_evidence, op_level, Offline, OfflineOptions, PointGraph,
};
use xray_compare::suppression::Suppression;
use xray_compare::tolerance::{Policy, Precision};
use xray_core::contract::Contract;
use xray_core::dump::Dump;
use xray_core::replay::RoundFormat;
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
    #[command(flatten)]
    pub renderings: super::Renderings,
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
    /// Re-run every module whose `:out` the dump under test holds, at every step, on its own
    /// input, and judge each at f32 bounds (`local_errors`; needs --model and the oracle): an op
    /// the engine declares f32 whose own error is beyond them makes the verdict `diverged`, even
    /// when the checkpoints downstream pass under a policy's accepted precision.
    #[arg(long)]
    pub local_errors: bool,
}

/// Compares two dumps (full or stats-only: the same evidence, report and Markdown outputs either
/// way). Exit 0 pass, 1 divergence, 2 input error.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut outputs = super::Outputs::default();
    outputs.file_if("evidence", a.evidence.as_deref());
    a.renderings.plan(&mut outputs);
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
    outputs.input_if("policy", a.policy.as_deref());
    if a.local_errors && a.model.is_none() {
        anyhow::bail!(
            "--local-errors needs --model DIR: the reference model whose modules are re-run on the dump's own inputs"
        );
    }
    outputs.check()?;
    let reference = Dump::load(&a.reference)?;
    let got = Dump::load(&a.got)?;
    let isolated = a
        .isolated
        .iter()
        .map(|d| Dump::load(d))
        .collect::<Result<Vec<_>, _>>()?;
    let variants = a
        .variant
        .iter()
        .map(|d| Dump::load(d))
        .collect::<Result<Vec<_>, _>>()?;
    let config = match &a.model {
        Some(m) => Some((
            super::read_config(m)?,
            format!("{}", m.join("config.json").display()),
        )),
        None => None,
    };
    // The suppress lists (for `logits_processed` entries and to name undeclared suppression):
    // the model directory's generation_config.json with --model, else the reference's manifest.
    let suppression = match &a.model {
        Some(m) => match std::fs::read_to_string(m.join("generation_config.json")) {
            Ok(text) => {
                let p = m.join("generation_config.json");
                let v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| anyhow!("{}: {e}", p.display()))?;
                Some(
                    Suppression::from_config(&v, &p.display().to_string())
                        .map_err(|e| anyhow!(e))?,
                )
            }
            Err(_) => None,
        },
        None => None,
    };
    let policy = match &a.policy {
        Some(p) => Policy::load(p)?,
        None => Policy::default(),
    };
    let model = match &a.model {
        Some(dir) => Some(xray_runtime::models::load(dir)?),
        None => None,
    };
    // Local errors are judged at the policy's own bounds, before any accepted precision.
    let own_policy = policy.clone();
    let (policy, precision) = declared_precision(policy, &got, &a.got, model.as_deref())?;
    let offline = compare_dumps_evidence(
        &reference,
        &got,
        OfflineOptions {
            config,
            suppression,
            policy,
            require_all: a.require_all,
            isolated: isolated.iter().collect(),
            variants: variants.iter().collect(),
            dump_paths: Some(RunDumps {
                reference: super::absolute(&a.reference),
                got: super::absolute(&a.got),
                got_weights_sha256: None,
            }),
        },
    )?;
    for line in &offline.console {
        super::note(line);
    }
    let Offline {
        evidence: mut ev,
        contract,
        options: opts,
        stats_only,
        ..
    } = offline;
    if let Some(p) = precision {
        let line = p.summary();
        super::note(&format!("xray: {line}"));
        ev.notes.push(line);
        ev.precision = Some(p);
    }
    if let (Some(m), Some(dir)) = (&model, &a.model) {
        refine_suspects(&mut ev, m.as_ref(), dir)?;
    }
    if stats_only && a.local_errors {
        anyhow::bail!(
            "--local-errors: the dumps hold summaries, not tensors (stats-only): there is no input to re-run a module on"
        );
    }
    if !stats_only {
        let m = model.as_deref();
        let lookup =
            |module: &str| m.and_then(|m| m.weights().get(&format!("{module}.weight")).cloned());
        let nodes = |step: Step| match m {
            Some(m) => m.graph().point_nodes(),
            None => PointGraph::firing_order(&reference, step),
        };
        let graph = PointGraph {
            nodes: &nodes,
            weight: Some(&lookup),
            source: match m {
                Some(_) => "the runtime graph's op-level points",
                None => PointGraph::FIRING_ORDER,
            },
        };
        op_level(
            &mut ev,
            &reference,
            &got,
            &contract,
            &opts.policy,
            &graph,
            &mut |op, nodes| {
                replay(
                    op,
                    nodes,
                    &reference,
                    &got,
                    &contract,
                    m,
                    a.model.as_deref(),
                    &opts.policy,
                )
            },
        );
        if a.local_errors {
            let nodes = nodes(0);
            let sides = xray_harness::replay::Sides {
                nodes: &nodes,
                reference: &reference,
                candidate: &got,
                policy: &own_policy,
                replayer: Err(""),
                model: m,
                attention: &contract.attention,
            };
            let l = local_errors(&sides, &contract, a.model.as_deref(), ev.precision.as_ref())?;
            ev.local_errors = Some(l);
            ev.verdict = ev.derive_verdict();
        }
    }
    // The evidence first, then the reports; a failed write does not stop the rest.
    if let Some(p) = &a.evidence {
        outputs.write_evidence(p, &ev.to_json()?);
    }
    a.renderings.write(&mut outputs, &ev);
    if a.renderings.json {
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
    let reached = match model {
        Some(m) if !ops.is_empty() => {
            let names: Vec<&str> = ops.iter().map(|d| d.op.as_str()).collect();
            Some(m.graph().reached_from(&names).map_err(|e| {
                anyhow!(
                    "{}: extra.precision declares an op X-Ray's graph of --model does not have: {e}",
                    got_dir.display()
                )
            })?)
        }
        _ => None,
    };
    Ok(xray_compare::precision::declare(policy, got, ops, reached)?)
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

/// Reference replay at the op-level origin (`xray_compare::mechanism`): with `--model DIR` and
/// the oracle, the named module is re-run on the dump's own input, which clears or convicts the
/// op and names the counterfactual that reproduces its output. Without the oracle (not built in,
/// or not starting) only the replays that re-run no HF module run (a residual add, an
/// elementwise step, a region through X-Ray's kernels); the others say why not.
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
    use xray_harness::replay::{replay_origin, Sides};
    let sides = |replayer| Sides {
        nodes,
        reference,
        candidate: got,
        policy,
        replayer,
        model,
        attention: &contract.attention,
    };
    let Some(dir) = model_dir else {
        return vec![format!(
            "replay: pass --model DIR (the reference model) to re-run {} on the dump's own input: it would clear or convict the op and test the mechanisms of its kind",
            op.module
        )];
    };
    #[cfg(feature = "oracle")]
    let unavailable = match xray_oracle::Oracle::discover() {
        Ok(oracle) => {
            let replayer = xray_harness::replay::OracleReplayer::new(&oracle, contract, dir);
            return replay_origin(op, &sides(Ok(&replayer)));
        }
        Err(e) => format!("the oracle is unavailable: {e}"),
    };
    #[cfg(not(feature = "oracle"))]
    let unavailable = {
        let _ = (contract, dir);
        xray_harness::replay::NOT_BUILT.to_string()
    };
    replay_origin(op, &sides(Err(&unavailable)))
}

/// `--local-errors`: every module the dump under test holds the `:out` of, re-run through the
/// oracle on its own input at every step ([`xray_harness::replay::Sides::sweep`]). Without the
/// oracle it is an error: the check asked for cannot run.
fn local_errors(
    sides: &xray_harness::replay::Sides<'_>,
    contract: &Contract,
    model_dir: Option<&std::path::Path>,
    precision: Option<&xray_compare::precision::PrecisionEvidence>,
) -> anyhow::Result<xray_compare::mechanism::LocalErrors> {
    let declared = |op: &str| {
        precision.and_then(|p| {
            // `precision::declared` admits f16 and bf16 alone; anything else is judged as f32.
            p.declared
                .iter()
                .find(|d| d.op == op)
                .and_then(|d| match d.dtype {
                    Precision::F16 => Some(RoundFormat::F16),
                    Precision::Bf16 => Some(RoundFormat::Bf16),
                    _ => None,
                })
        })
    };
    let Some(dir) = model_dir else {
        anyhow::bail!("--local-errors needs --model DIR");
    };
    #[cfg(feature = "oracle")]
    {
        let oracle = xray_oracle::Oracle::discover()
            .map_err(|e| anyhow!("--local-errors: the oracle is unavailable: {e}"))?;
        let replayer = xray_harness::replay::OracleReplayer::new(&oracle, contract, dir);
        let sides = xray_harness::replay::Sides {
            replayer: Ok(&replayer),
            ..*sides
        };
        Ok(sides.sweep(&declared))
    }
    #[cfg(not(feature = "oracle"))]
    {
        let _ = (sides, contract, dir, declared);
        anyhow::bail!("--local-errors: {}", xray_harness::replay::NOT_BUILT)
    }
}
