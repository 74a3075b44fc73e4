//! `xray compare`'s evidence from two loaded dumps: the identity checks, the contract, the
//! policy's comparison, the notes, the run record, reference variants and the op-level origin.
//! One implementation for the CLI (`harness/src/cli/compare.rs`, which adds what needs X-Ray's
//! runtime: `--model`'s graph for the suspects and the op points, and reference replay) and the
//! Python bindings (`bindings/python`, `xray_parity.compare`).

use xray_core::contract::Contract;
use xray_core::dump::{Dump, Entry};
use xray_core::ops::{chain, PointNode};
use xray_core::Step;

use crate::align::token_alignment;
use crate::compare::{
    compare_dumps_isolated, compare_stats_dumps, oracle_versions, CompareOptions,
    IsolatedComparison,
};
use crate::evidence::{Evidence, Run, RunDumps, TokenAlignment, Transcript};
use crate::localize::dump_steps;
use crate::ops::{
    both_have_points, compare_points, dump_points, has_points, held_graph, localize_op,
    with_same_as,
};
use crate::ops::{OpDivergence, WeightLookup};
use crate::suppression::Suppression;
use crate::tolerance::Policy;

/// An error of [`compare_dumps_evidence`]: one line, with the cause chain of the library error
/// beneath it (anyhow's `{:#}` prints `context: cause`).
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// A refusal of the inputs themselves (family or identity mismatch, no config, ...).
    #[error("{0}")]
    Input(String),
    /// A library error, with what was being done.
    #[error("{context}")]
    Context {
        /// What was being done (`comparing`, the config the contract was resolved from).
        context: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn ctx<E: std::error::Error + Send + Sync + 'static>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> OfflineError {
    let context = context.into();
    move |e| OfflineError::Context {
        context,
        source: Box::new(e),
    }
}

/// What the comparison is told beyond the two dumps.
#[derive(Debug, Default)]
pub struct OfflineOptions<'a> {
    /// The model config the contract is resolved from and where it was read (`--model`'s
    /// config.json); `None`: the reference dump's `extra.config`.
    pub config: Option<(serde_json::Value, String)>,
    /// The suppress lists of the model's generation_config.json (`--model`); `None`: the
    /// reference dump's manifest.
    pub suppression: Option<Option<Suppression>>,
    /// The tolerance policy (default: per-dtype defaults).
    pub policy: Policy,
    /// A checkpoint absent from the dump under test fails instead of being unobserved.
    pub require_all: bool,
    /// Isolated runs (`--isolated`).
    pub isolated: Vec<&'a Dump>,
    /// Reference variant dumps (`--variant`).
    pub variants: Vec<&'a Dump>,
    /// The reference and candidate dump paths as the evidence records them (absolute).
    pub dump_paths: Option<RunDumps>,
}

/// [`compare_dumps_evidence`]'s result: the evidence and what was used to make it.
#[derive(Debug)]
pub struct Offline {
    /// The evidence (`xray.evidence/v1`), not yet localized to the op.
    pub evidence: Evidence,
    /// The resolved contract.
    pub contract: Contract,
    /// The comparison's options (policy, suppression).
    pub options: CompareOptions,
    /// Whether either dump is stats-only.
    pub stats_only: bool,
    /// Console lines, in order, each as printed (`xray: note: ...`, `xray: ...`).
    pub console: Vec<String>,
}

/// The first 12 hex digits of a sha256 (console lines).
fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// Compares `got` with `reference` as `xray compare` does, up to the op-level origin (see
/// [`op_level`]), in stages: family and identity checks, the contract from the config, the
/// comparison (stats-only or full, with isolated runs), notes, the run record, variants.
pub fn compare_dumps_evidence(
    reference: &Dump,
    got: &Dump,
    o: OfflineOptions<'_>,
) -> Result<Offline, OfflineError> {
    check_sides(reference, got, &o.isolated)?;
    check_step_numbering(reference, got, &o.policy)?;
    let from_model = o.config.is_some();
    let (contract, config) = contract_of(reference, o.config)?;
    let suppression = match o.suppression {
        Some(s) => s,
        None => Suppression::of_dump(reference).map_err(|e| OfflineError::Input(e.to_string()))?,
    };
    let opts = CompareOptions {
        policy: o.policy,
        require_all: o.require_all,
        suppression,
        ..Default::default()
    };
    let stats_only = reference.manifest.stats_only || got.manifest.stats_only;
    let (cmp, fed, tokens, declared) =
        compare(&contract, reference, got, &o.isolated, &opts, stats_only)?;
    let mut said = Said::default();
    said.sides(reference, got, stats_only, from_model, &config);
    said.declared(declared, tokens.as_ref());
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
        isolated: !o.isolated.is_empty(),
        stats_only,
        contract_sha256: Some(contract.sha256()),
        dumps: o.dump_paths.map(|d| RunDumps {
            got_weights_sha256: (got.manifest.weights_sha256 != reference.manifest.weights_sha256)
                .then(|| got.manifest.weights_sha256.clone()),
            ..d
        }),
        engine_weights: got.manifest.engine_weights.clone(),
        ..Default::default()
    };
    let transcript = Transcript {
        runtime: got.manifest.transcript.clone(),
        reference: reference.manifest.transcript.clone(),
        tokens_equal: got.manifest.tokens == reference.manifest.tokens,
        first_divergent_step: None,
    };
    let Said { mut console, notes } = said;
    let mut ev = cmp.into_evidence_with(run, Some(transcript), None, notes, fed, tokens);
    for variant in &o.variants {
        let v = crate::variant::compare_variant(
            &contract,
            reference,
            got,
            variant,
            opts.suppression.as_ref(),
            &ev,
        )
        .map_err(ctx("comparing with the reference variant"))?;
        console.push(format!("xray: {}", v.summary));
        ev.notes.push(v.summary.clone());
        ev.reference_variants.push(v);
    }
    if let Some(n) = crate::report::not_compared(&ev) {
        ev.notes.push(n);
    }
    Ok(Offline {
        evidence: ev,
        contract,
        options: opts,
        stats_only,
        console,
    })
}

/// The dump under test and every isolated run must be of the reference's family; an isolated
/// run of its weights and audio too (local errors measured on others would measure nothing).
fn check_sides(reference: &Dump, got: &Dump, isolated: &[&Dump]) -> Result<(), OfflineError> {
    for (what, d) in std::iter::once(("got", got)).chain(isolated.iter().map(|d| ("isolated", *d)))
    {
        if reference.manifest.family != d.manifest.family {
            return Err(OfflineError::Input(format!(
                "family mismatch: reference is {}, {what} {} is {}",
                reference.manifest.family,
                d.dir.display(),
                d.manifest.family
            )));
        }
        if what == "isolated" {
            if let Some(diff) = identity_difference(reference, d) {
                return Err(OfflineError::Input(format!(
                    "{}: {diff}; an isolated run must use the reference's weights and audio",
                    d.dir.display()
                )));
            }
        }
    }
    Ok(())
}

/// A dump under test whose steps are numbered off from the reference's (an adapter that counts
/// decode steps from 1, or from the prefill's last position): its step `k` holds the reference's
/// step `k + d`. Told from the data: over every entry both dumps hold past step 0, in the same
/// layout and shape, the ones that agree with the reference `d` steps away against the ones that
/// agree at their own step. An input error naming the shift, before anything is compared; `Ok`
/// when the steps line up or too little is held to tell (stats-only dumps: no tensors).
fn check_step_numbering(reference: &Dump, got: &Dump, policy: &Policy) -> Result<(), OfflineError> {
    use crate::tolerance::Precision;
    let agree = |name: &str, step: Step, at: Step| -> Option<bool> {
        let (er, ex) = (reference.entry(name, at)?, got.entry(name, step)?);
        let (r, x) = (reference.get(name, at)?, got.get(name, step)?);
        if er.layout != ex.layout || r.shape() != x.shape() {
            return None;
        }
        let tol = policy
            .resolve_kind(name, at, Precision::F32, None, false)
            .tolerance;
        Some(crate::metrics::compare(&r.view(), &x.view(), &tol).is_ok_and(|m| m.passes(&tol)))
    };
    let tally = |t: &mut (usize, usize), a: Option<bool>| {
        if let Some(a) = a {
            t.0 += usize::from(a);
            t.1 += 1;
        }
    };
    let later: Vec<&Entry> = got
        .manifest
        .checkpoints
        .iter()
        .filter(|e| e.step > 0)
        .collect();
    // (agreeing, compared) at the entries' own step: a dump whose steps line up stops here, as
    // soon as more than one in ten agree (the comparison proper compares them again).
    let mut own = (0usize, 0usize);
    for e in &later {
        tally(&mut own, agree(&e.name, e.step, e.step));
        if own.1 >= 16 && own.0 * 10 > own.1 {
            return Ok(());
        }
    }
    // One step later and one step earlier.
    let mut off = [(0usize, 0usize); 2];
    for e in &later {
        // A step from an untrusted manifest: no overflow past the largest.
        if let Some(next) = e.step.checked_add(1) {
            tally(&mut off[0], agree(&e.name, e.step, next));
        }
        if e.step > 1 {
            tally(&mut off[1], agree(&e.name, e.step, e.step - 1));
        }
    }
    for ((agreeing, compared), d) in off.into_iter().zip([1i64, -1]) {
        if compared >= 8 && agreeing * 10 >= compared * 9 && own.0 * 10 <= own.1 {
            let (k, held) = if d > 0 {
                ("k + 1", "later")
            } else {
                ("k - 1", "earlier")
            };
            return Err(OfflineError::Input(format!(
                "{}: its steps are numbered off by one from the reference's: step k holds the reference's step {k} ({agreeing} of {compared} entries past step 0 agree with the reference's one step {held}, {} of {} at their own step); number the steps as the reference does (step 0 the prefill, then one step per generated token: docs/dump-format.md)",
                got.dir.display(),
                own.0,
                own.1
            )));
        }
    }
    Ok(())
}

/// The contract resolved from `config` (`--model`'s config.json and where it was read), else
/// from the reference dump's `extra.config`; with the config it was resolved from.
fn contract_of(
    reference: &Dump,
    config: Option<(serde_json::Value, String)>,
) -> Result<(Contract, serde_json::Value), OfflineError> {
    let (config, config_source) = match config {
        Some((v, source)) => (v, source),
        None => (
            reference
                .manifest
                .extra
                .get("config")
                .cloned()
                .ok_or_else(|| {
                    OfflineError::Input(format!(
                        "{}: the manifest records no model config; pass --model DIR",
                        reference.dir.display()
                    ))
                })?,
            format!("{}: the manifest's extra.config", reference.dir.display()),
        ),
    };
    // A foreign dump's extra.config is untrusted like a config.json: core bounds what it reads.
    let contract =
        Contract::for_family(&reference.manifest.family, &config).map_err(ctx(config_source))?;
    Ok((contract, config))
}

/// The comparison itself: stats-only (large-model) dumps judged from their summaries
/// ([`compare_stats_dumps`]), else full dumps with their isolated runs
/// ([`compare_dumps_isolated`]).
fn compare(
    contract: &Contract,
    reference: &Dump,
    got: &Dump,
    isolated: &[&Dump],
    opts: &CompareOptions,
    stats_only: bool,
) -> Result<IsolatedComparison, OfflineError> {
    if !stats_only {
        return compare_dumps_isolated(contract, reference, got, isolated.to_vec(), opts)
            .map_err(ctx("comparing"));
    }
    if !isolated.is_empty() {
        return Err(OfflineError::Input(format!(
            "--isolated needs full dumps; {} or {} is stats-only",
            reference.dir.display(),
            got.dir.display()
        )));
    }
    // The token alignment from the manifests, so a parting is placed at its step; the stats-only
    // comparison judges every step, so none is claimed not comparable.
    let tokens = token_alignment(contract, reference, got)
        .map_err(ctx("comparing"))?
        .map(|mut t| {
            t.not_comparable_steps = None;
            t
        });
    let cmp = compare_stats_dumps(contract, reference, got, opts).map_err(ctx("comparing"))?;
    Ok((cmp, vec![], tokens, vec![]))
}

/// What `xray compare` says: console lines, in order, each as printed, and the evidence notes.
#[derive(Default)]
struct Said {
    console: Vec<String>,
    notes: Vec<String>,
}

impl Said {
    /// A note the console prints too, with its prefix (`xray: note: `, `xray: `).
    fn both(&mut self, prefix: &str, msg: String) {
        self.console.push(format!("{prefix}{msg}"));
        self.notes.push(msg);
    }

    /// What the two dumps say of themselves: stats-only, files their manifests do not list, an
    /// identity difference, the engine's own weights, a config of its own.
    fn sides(
        &mut self,
        reference: &Dump,
        got: &Dump,
        stats_only: bool,
        from_model: bool,
        config: &serde_json::Value,
    ) {
        if stats_only {
            self.notes.push("stats-only comparison: metrics are estimated from each checkpoint's summary (see its note); re-tap with `xray run --only` for full tensors".to_string());
        }
        for (side, d) in [("reference", reference), ("dump under test", got)] {
            if !d.unlisted.is_empty() {
                let msg = format!(
                    "{} ({side}) holds files its manifest does not list (ignored): {}",
                    d.dir.display(),
                    d.unlisted.join(", ")
                );
                self.both("xray: note: ", msg);
            }
        }
        // Identity: the HF weights (`weights_sha256`, for a converted engine the source its
        // `engine_weights` were converted from or into) and the audio; a difference is said on
        // the console, naming which.
        if let Some(diff) = identity_difference(reference, got) {
            self.both("xray: note: ", diff);
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
            self.both("xray: ", msg);
        }
        if let Some(msg) = config_difference(reference, got, from_model, config) {
            self.both("xray: note: ", msg);
        }
    }

    /// The declarations applied (one line each) and teacher forcing of the dump under test.
    fn declared(&mut self, declared: Vec<String>, tokens: Option<&TokenAlignment>) {
        for n in declared {
            self.both("xray: ", n);
        }
        if let Some(t) = tokens.filter(|t| t.teacher_forced) {
            self.notes.push(format!(
                "the dump under test was teacher-forced on the reference's tokens (extra.fed.tokens): every step is compared{}",
                t.parted_at_step.map_or(String::new(), |k| format!(
                    "; its own argmax first differs at step {k}"
                ))
            ));
        }
    }
}

/// What differs between the reference's identity and a dump's, in one sentence naming which
/// (weights, audio or both, with both sides' sha256 and, for a converted engine, its own file),
/// or `None` when both match.
pub fn identity_difference(reference: &Dump, d: &Dump) -> Option<String> {
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

/// Where [`op_level`] takes the op-level points' graph from.
pub struct PointGraph<'a> {
    /// The point nodes at a step (X-Ray's runtime graph's, or the reference's in firing order:
    /// [`PointGraph::firing_order`]).
    pub nodes: &'a dyn Fn(Step) -> Vec<PointNode>,
    /// A module's reference weight (`{module}.weight`), when a model is at hand.
    pub weight: Option<WeightLookup<'a>>,
    /// How the evidence's note names the source.
    pub source: &'a str,
}

impl PointGraph<'_> {
    /// The note's name for the reference's points in firing order (no model given).
    pub const FIRING_ORDER: &'static str = "the reference's op-level points in firing order (pass --model DIR for the runtime graph's ops and weights)";

    /// The reference's op-level points at `step`, in firing order.
    pub fn firing_order(reference: &Dump, step: Step) -> Vec<PointNode> {
        chain(&dump_points(reference, step))
    }
}

/// When both dumps carry op-level points (`--ops`), localizes to the op: at the origin's step,
/// the first point that differs ([`localize_op`]) becomes `first_divergence.op`, and `replay`
/// (reference replay, when the caller has an oracle) adds its notes. Without an origin, a point
/// that differs while every checkpoint agrees is noted.
pub fn op_level(
    ev: &mut Evidence,
    reference: &Dump,
    got: &Dump,
    contract: &Contract,
    policy: &Policy,
    graph: &PointGraph<'_>,
    replay: &mut dyn FnMut(&mut OpDivergence, &[PointNode]) -> Vec<String>,
) {
    if has_points(reference) && has_points(got) {
        ev.op_points = Some(compare_points(reference, got, policy));
    }
    // The points' graph as both dumps observe it: the contract's `same_as` names added (a
    // module boundary such as `model.encoder:in` on the node of `model.encoder.conv1:in`), and
    // a node whose inputs the dumps do not hold linked to its nearest held ancestors.
    let same_as = contract.same_as();
    let nodes = |step: Step| {
        held_graph(
            &with_same_as((graph.nodes)(step), &same_as),
            reference,
            got,
            step,
        )
    };
    let source = graph.source;
    if let Some(fd) = ev.first_divergence.as_mut() {
        let step = fd.step;
        if !both_have_points(reference, got, step) {
            return;
        }
        fd.op = localize_op(&nodes(step), reference, got, step, policy, graph.weight);
        let note = match &fd.op {
            Some(op) => format!("op-level origin from {source}: {}", op.summary()),
            None => format!("the op-level points both dumps hold at step {step} agree ({source})"),
        };
        ev.notes.push(note);
        if let Some(op) = fd.op.as_mut() {
            let notes = replay(op, &nodes(step));
            ev.notes.extend(notes);
        }
        return;
    }
    for step in dump_steps(reference) {
        if !both_have_points(reference, got, step) {
            continue;
        }
        if let Some(op) = localize_op(&nodes(step), reference, got, step, policy, graph.weight) {
            ev.notes.push(format!(
                "op-level point {} differs while every checkpoint agrees: {}",
                xray_core::key(&op.point, step),
                op.summary()
            ));
            return;
        }
    }
}
