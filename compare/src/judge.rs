//! The judge stage: every node of the checkpoint graph held to its tolerance. A pair of tensors
//! is measured ([`crate::metrics`]) under the tolerance the policy resolves for it
//! ([`crate::tolerance`]); summaries of a stats-only dump are judged by their estimated `rel_l2`
//! ([`judge_stats`]). The result ([`Judged`]) is what was observed at each node, its evidence
//! before localization, its error for the profile and the logits metrics per step.

use xray_core::contract::Contract;
use xray_core::dump::{Dump, Stats};
use xray_core::Step;

use ndarray::ArrayViewD;

use crate::align::{side_summary, Pair, PairMeta, PairSource, SideSummary};
use crate::compare::CompareOptions;
use crate::evidence::{CheckpointEvidence, ToleranceEvidence};
use crate::localize::{CheckpointGraph, ErrorPoint, Localization, Node, Observed, Status};
use crate::metrics::{compare, compare_logits, LogitsMetrics, Metrics};
use crate::tolerance::{Precision, ResolvedTolerance};
use crate::Error;

/// Every node judged, indexed like the graph's nodes.
#[derive(Debug, Clone, Default)]
pub struct Judged {
    /// What was observed at each node.
    pub observed: Vec<Observed>,
    /// Each node's evidence; its status and `propagated_from` are the localization's
    /// ([`Judged::localized`]).
    pub checkpoints: Vec<CheckpointEvidence>,
    /// Each node's error for the profile (`None` without metrics).
    pub errors: Vec<Option<ErrorPoint>>,
    /// The logits metrics of every logits node, by step.
    pub logits_steps: Vec<(Step, LogitsMetrics)>,
}

impl Judged {
    fn push(&mut self, observed: Observed, c: CheckpointEvidence) {
        if let Some(l) = c.metrics.as_ref().and_then(|m| m.logits.as_ref()) {
            self.logits_steps.push((c.step, l.clone()));
        }
        self.errors.push(c.metrics.as_ref().map(|m| ErrorPoint {
            rel_l2: m.rel_l2,
            max_abs: m.max_abs,
        }));
        self.observed.push(observed);
        self.checkpoints.push(c);
    }

    /// Whether any node was observed (neither unobserved nor not comparable).
    pub fn any_observed(&self) -> bool {
        self.observed
            .iter()
            .any(|o| !matches!(o, Observed::Unobserved | Observed::NotComparable))
    }

    /// Writes the localization's statuses and roots into the evidence.
    pub fn localized(&mut self, g: &CheckpointGraph, loc: &Localization) {
        let nodes = g.nodes();
        for (i, c) in self.checkpoints.iter_mut().enumerate() {
            c.status = loc.status[i];
            c.propagated_from = loc.propagated_from[i]
                .iter()
                .map(|&u| nodes[u].id())
                .collect();
        }
    }
}

/// A node's evidence before localization (status `pass`, no roots).
fn evidence(
    node: &Node,
    shape: Vec<usize>,
    dtype: Precision,
    layout: String,
    tol: &ResolvedTolerance,
    (metrics, local_metrics): (Option<Metrics>, Option<Metrics>),
    note: Option<String>,
) -> CheckpointEvidence {
    CheckpointEvidence {
        name: node.name.clone(),
        step: node.step,
        producer: node.producer.clone(),
        consumers: node.consumers.clone(),
        shape,
        dtype: dtype.as_str().into(),
        layout,
        metrics,
        local_metrics,
        tolerance: ToleranceEvidence::from(tol),
        status: Status::Pass,
        propagated_from: vec![],
        note,
    }
}

/// Judges every node of `graph` with the tensors of `src` under `opts` (a policy rule that
/// matches none of its checkpoints is refused first: a typo or another model's rule).
pub fn judge_graph(
    graph: &CheckpointGraph,
    src: &dyn PairSource,
    opts: &CompareOptions,
) -> Result<Judged, Error> {
    opts.policy.check_rules_match(
        graph
            .nodes()
            .iter()
            .map(|c| (c.name.as_str(), Some(c.step))),
    )?;
    let mut judged = Judged::default();
    for node in graph.nodes() {
        let (obs, c) = match opts.comparable_up_to_step.filter(|&k| node.step > k) {
            Some(k) => not_comparable(node, k, opts),
            None => judge_node(node, src, opts)?,
        };
        judged.push(obs, c);
    }
    Ok(judged)
}

/// A node after the token streams parted at step `k`: it ran on other tokens.
fn not_comparable(node: &Node, k: Step, opts: &CompareOptions) -> (Observed, CheckpointEvidence) {
    let tol = opts
        .policy
        .resolve_kind(&node.name, node.step, Precision::F32, None, node.logits);
    let mut c = evidence(
        node,
        vec![],
        Precision::F32,
        String::new(),
        &tol,
        (None, None),
        Some(format!(
            "not comparable: the token streams parted at step {k}, so step {} ran on other tokens",
            node.step
        )),
    );
    c.status = Status::NotComparable;
    (Observed::NotComparable, c)
}

/// One node judged from its pair: metrics under the resolved tolerance (the isolated run's as
/// its local error), or why it could not be measured.
fn judge_node(
    node: &Node,
    src: &dyn PairSource,
    opts: &CompareOptions,
) -> Result<(Observed, CheckpointEvidence), Error> {
    let pair = src.pair(&node.name, node.step);
    let (meta, note) = match &pair {
        Pair::Tensors { meta, .. } => (Some(meta.clone()), None),
        Pair::Missing { meta, note }
        | Pair::Unobserved { meta, note }
        | Pair::AlignmentFault { meta, note, .. } => (meta.clone(), Some(note.clone())),
        Pair::NotInReference { note } => {
            return Err(Error::NotInReference {
                checkpoint: node.id(),
                note: note.clone(),
            })
        }
    };
    let dtype = meta.as_ref().map_or(Precision::F32, |m| m.dtype);
    let floor = opts.floors.get(&(node.name.clone(), node.step));
    let tol = opts
        .policy
        .resolve_kind(&node.name, node.step, dtype, floor, node.logits);
    let (obs, metrics) = match &pair {
        Pair::Tensors {
            reference,
            runtime,
            isolated,
            ..
        } => measure(node, reference, runtime, isolated.as_ref(), &tol)?,
        Pair::Missing { .. } => (Observed::Missing, (None, None)),
        Pair::Unobserved { .. } if opts.require_all => (Observed::Missing, (None, None)),
        Pair::Unobserved { .. } => (Observed::Unobserved, (None, None)),
        Pair::AlignmentFault { .. } | Pair::NotInReference { .. } => {
            (Observed::AlignmentFault, (None, None))
        }
    };
    let note = match (&pair, obs) {
        (
            Pair::Tensors {
                reference, runtime, ..
            },
            Observed::AlignmentFault,
        ) => Some(format!(
            "shape {:?} vs {:?} after alignment",
            reference.shape(),
            runtime.shape()
        )),
        _ => note,
    };
    let (shape, layout) = shape_and_layout(meta.as_ref());
    let c = evidence(node, shape, dtype, layout, &tol, metrics, note);
    Ok((obs, c))
}

/// The shape and layout a node's evidence records (empty without metadata).
fn shape_and_layout(meta: Option<&PairMeta>) -> (Vec<usize>, String) {
    (
        meta.map(|m| m.shape.clone()).unwrap_or_default(),
        meta.map(|m| m.layout.to_string()).unwrap_or_default(),
    )
}

/// The metrics of the side under test and of the isolated run (its local error), where taken.
type Measured = (Option<Metrics>, Option<Metrics>);

/// The runtime tensor (and the isolated run's, for the local error) measured against the
/// reference: pass or fail. A shape disagreement after alignment is a fault of this edge, not a
/// crash; a non-finite reference is an input error naming the checkpoint.
fn measure(
    node: &Node,
    reference: &ArrayViewD<f32>,
    runtime: &ArrayViewD<f32>,
    isolated: Option<&ArrayViewD<f32>>,
    tol: &ResolvedTolerance,
) -> Result<(Observed, Measured), Error> {
    let run = |x: &ArrayViewD<f32>| -> Result<Metrics, Error> {
        if node.logits {
            compare_logits(reference, x, &tol.tolerance)
        } else {
            compare(reference, x, &tol.tolerance)
        }
    };
    match run(runtime) {
        Ok(m) => {
            let local = isolated.map(run).transpose()?;
            let ok = m.passes(&tol.tolerance);
            Ok((
                if ok { Observed::Pass } else { Observed::Fail },
                (Some(m), local),
            ))
        }
        Err(Error::ShapeMismatch { .. } | Error::NotLogits { .. }) => {
            Ok((Observed::AlignmentFault, (None, None)))
        }
        Err(Error::NonFiniteReference {
            count,
            index,
            value,
            ..
        }) => Err(Error::NonFiniteReference {
            checkpoint: Some(node.id()),
            count,
            index,
            value,
        }),
        Err(e) => Err(e),
    }
}

/// Judges every node of `g` from the summaries of `reference` and `got` ([`judge_stats`],
/// tolerances from `opts.policy`): metrics `null`, the estimate in the checkpoint's `note`.
/// Statistics no tensor can have, and a non-finite reference, are input errors before anything
/// is judged (the content-hash shortcut would pass them unread); so is a checkpoint the
/// reference lacks.
pub fn judge_stats_graph(
    g: &CheckpointGraph,
    contract: &Contract,
    reference: &Dump,
    got: &Dump,
    opts: &CompareOptions,
) -> Result<Judged, Error> {
    let mut judged = Judged::default();
    for node in g.nodes() {
        let r = side_summary(contract, reference, &node.name, node.step);
        let x = side_summary(contract, got, &node.name, node.step);
        let tol = opts.policy.resolve(
            &node.name,
            node.step,
            Precision::F32,
            opts.floors.get(&(node.name.clone(), node.step)),
        );
        check_summaries(node, (&r, reference), (&x, got))?;
        let unobserved = if opts.require_all {
            Observed::Missing
        } else {
            Observed::Unobserved
        };
        let (obs, note, meta) = match (r, x) {
            (None, None) => (unobserved, "absent from both dumps".to_string(), None),
            (None, Some(_)) => {
                return Err(Error::NotInReference {
                    checkpoint: node.id(),
                    note: format!(
                        "in {} but absent from the reference dump {}",
                        got.dir.display(),
                        reference.dir.display()
                    ),
                })
            }
            (Some(Ok(r)), None) => (
                unobserved,
                "absent from the dump under test".into(),
                Some(r),
            ),
            (Some(Err(e)), _) | (_, Some(Err(e))) => (Observed::AlignmentFault, e, None),
            (Some(Ok(r)), Some(Ok(x))) => {
                let (obs, note) = judge_summaries(&r, &x, &tol);
                (obs, note, Some(r))
            }
        };
        let shape = meta.as_ref().map(|m| m.shape.clone()).unwrap_or_default();
        let layout = meta
            .as_ref()
            .map(|m| m.layout.to_string())
            .unwrap_or_default();
        let c = evidence(
            node,
            shape,
            Precision::F32,
            layout,
            &tol,
            (None, None),
            Some(note),
        );
        judged.push(obs, c);
    }
    Ok(judged)
}

type Summary = Option<Result<SideSummary, String>>;

/// The input errors of a node's summaries: statistics no tensor can have (on either side), a
/// non-finite reference where the dump under test has the checkpoint too.
fn check_summaries(
    node: &Node,
    (r, reference): (&Summary, &Dump),
    (x, got): (&Summary, &Dump),
) -> Result<(), Error> {
    for (side, d) in [(r, reference), (x, got)] {
        if let Some(Ok(s)) = side {
            s.stats.check().map_err(|reason| Error::InconsistentStats {
                dump: d.dir.display().to_string(),
                checkpoint: node.id(),
                reason,
            })?;
        }
    }
    if let (Some(Ok(rs)), Some(Ok(_))) = (r, x) {
        if rs.stats.nan + rs.stats.inf > 0 {
            return Err(Error::NonFiniteReferenceStats {
                checkpoint: node.id(),
                nan: rs.stats.nan,
                inf: rs.stats.inf,
            });
        }
    }
    Ok(())
}

/// Both summaries of a node judged: layouts and shapes must agree (summaries cannot be re-laid
/// out), then [`judge_stats`] under `tol`.
fn judge_summaries(
    r: &SideSummary,
    x: &SideSummary,
    tol: &ResolvedTolerance,
) -> (Observed, String) {
    if r.layout != x.layout {
        return (
            Observed::AlignmentFault,
            format!(
                "layout {} vs {} (reference); stats-only summaries cannot be re-laid out",
                x.layout, r.layout
            ),
        );
    }
    if r.shape != x.shape {
        return (
            Observed::AlignmentFault,
            format!("shape {:?} vs {:?} (reference)", x.shape, r.shape),
        );
    }
    let v = judge_stats(
        &r.stats,
        &r.content_sha256,
        &x.stats,
        &x.content_sha256,
        &tol.tolerance,
    );
    (
        if v.pass {
            Observed::Pass
        } else {
            Observed::Fail
        },
        v.note,
    )
}

/// The outcome of comparing two summaries of one checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsVerdict {
    /// Whether it passes.
    pub pass: bool,
    /// Estimated `rel_l2` (see [`stats_rel_l2`]).
    pub rel_l2: f64,
    /// The bound it was held to.
    pub bound: f64,
    /// One sentence for the evidence note.
    pub note: String,
}

/// Estimated `rel_l2 = ||x - y|| / ||y||` of a tensor `x` against its reference `y` from their
/// summaries: the larger of the sketch estimate `sqrt(mean_k (sketch_k(x) - sketch_k(y))^2) /
/// rms(y)` (unbiased in the square; a relative spread of ~sqrt(2/32) = 25 %) and the exact lower
/// bound `max(|rms(x) - rms(y)|, |mean(x) - mean(y)|) / rms(y)` (triangle and Cauchy-Schwarz
/// inequalities). Returns `(estimate, lower_bound)`; `None` when a side lacks a sketch.
pub fn stats_rel_l2(reference: &Stats, got: &Stats) -> Option<(f64, f64)> {
    let (a, b) = (reference.sketch.as_ref()?, got.sketch.as_ref()?);
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let scale = reference.rms.max(f64::MIN_POSITIVE);
    let ms = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>() / a.len() as f64;
    let lower = (reference.rms - got.rms)
        .abs()
        .max((reference.mean - got.mean).abs())
        / scale;
    Some((ms.sqrt() / scale, lower))
}

/// Judges one checkpoint from summaries under `tol`: inconsistent statistics ([`Stats::check`]),
/// any non-finite value, a count mismatch or a missing sketch fail; then identical content hashes
/// pass; otherwise the estimated `rel_l2`
/// (the larger of [`stats_rel_l2`]'s two) must be within `tol.max_rel_l2`, or, when the tolerance
/// sets none, within `rtol + atol / rms(ref)` (the largest `rel_l2` of a tensor whose every
/// element is within `atol + rtol * |ref|`).
pub fn judge_stats(
    reference: &Stats,
    ref_hash: &str,
    got: &Stats,
    got_hash: &str,
    tol: &crate::tolerance::Tolerance,
) -> StatsVerdict {
    let bound = tol
        .max_rel_l2
        .unwrap_or(tol.rtol + tol.atol / reference.rms.max(f64::MIN_POSITIVE));
    let fail = |note: String| StatsVerdict {
        pass: false,
        rel_l2: 0.0,
        bound,
        note,
    };
    // Never the content-hash shortcut on statistics no tensor can have (compare_stats_dumps
    // refuses them as an input error before judging).
    for (side, st) in [("the reference's", reference), ("the", got)] {
        if let Err(why) = st.check() {
            return fail(format!(
                "stats-only: {side} statistics are inconsistent: {why}"
            ));
        }
    }
    if reference.nan + reference.inf > 0 {
        return fail(format!(
            "stats-only: the reference holds {} NaN and {} Inf values; a non-finite reference cannot be compared",
            reference.nan, reference.inf
        ));
    }
    if got.nan + got.inf > 0 {
        return fail(format!(
            "stats-only: {} NaN and {} Inf values where the reference is finite",
            got.nan, got.inf
        ));
    }
    if reference.count != got.count {
        return fail(format!(
            "stats-only: {} elements vs {} in the reference",
            got.count, reference.count
        ));
    }
    if ref_hash == got_hash {
        return StatsVerdict {
            pass: true,
            rel_l2: 0.0,
            bound,
            note: "stats-only: identical content (same sha256)".into(),
        };
    }
    let Some((est, lower)) = stats_rel_l2(reference, got) else {
        return fail("stats-only: a side has no order-sensitive sketch".into());
    };
    let rel = est.max(lower);
    let pass = rel <= bound;
    let mut note = format!(
        "stats-only: rel_l2 ~ {rel:.2e} (sketch estimate {est:.2e}, lower bound from mean/rms {lower:.2e}), bound {bound:.2e}"
    );
    if !pass && lower <= bound {
        let (r, g) = (reference, got);
        let scale = r.rms.max(f64::MIN_POSITIVE);
        if ((r.min - g.min).abs().max((r.max - g.max).abs())) / scale <= bound {
            note.push_str(": the same mean, rms and range in another order (a permutation, shift or transposition)");
        }
    }
    StatsVerdict {
        pass,
        rel_l2: rel,
        bound,
        note,
    }
}
