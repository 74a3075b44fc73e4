//! The comparison pipeline over a checkpoint graph: per node metrics and tolerance, status,
//! localization, the origin's signature, the error profile and the token drill-down.
//!
//! The caller supplies tensors through [`PairSource`] (for example two loaded dumps, or the
//! runtime and oracle outputs held in memory); [`compare_graph`] returns a [`Comparison`] whose
//! parts go straight into [`crate::evidence::Evidence`] ([`Comparison::into_evidence`]).

use std::collections::HashMap;
use xray_core::{Layout, SignatureKind, Step};

use ndarray::ArrayViewD;

use crate::evidence::{
    compress_ids, coverage_of, CheckpointEvidence, DivergenceKind, Evidence, FedEdge,
    FirstDivergence, InputEvidence, Region, Run, TokenAlignment, ToleranceEvidence, Transcript,
    Verdict, SCHEMA,
};
use crate::localize::{
    drill_down, error_profile, first_divergent_token_step, gap_before, localize_fed,
    CheckpointGraph, DrillDown, ErrorPoint, ErrorProfile, Localization, Observed, Status,
};
use crate::metrics::{compare, compare_logits, Metrics};
use crate::signatures::{explain_with, origin_context, steps_subset, ExplainOptions};
use crate::tolerance::{Dtype, NoiseFloor, Policy};
use crate::Error;

/// Description of a checkpoint's tensors (as recorded in the evidence).
#[derive(Debug, Clone, PartialEq)]
pub struct PairMeta {
    /// Canonical shape.
    pub shape: Vec<usize>,
    /// Dtype of the runtime tensor.
    pub dtype: Dtype,
    /// Canonical layout.
    pub layout: Layout,
    /// Axis names for signature wording; empty = derived from the layout.
    pub axis_names: Vec<String>,
}

/// What a [`PairSource`] has for one `(name, step)`.
// Returned by value once per node; boxing the views would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Pair<'a> {
    /// Both tensors, aligned to the canonical shape.
    Tensors {
        /// Metadata.
        meta: PairMeta,
        /// Reference tensor.
        reference: ArrayViewD<'a, f32>,
        /// Runtime tensor (cumulative run).
        runtime: ArrayViewD<'a, f32>,
        /// Runtime tensor from isolated mode (reference substituted upstream), if it ran.
        isolated: Option<ArrayViewD<'a, f32>>,
    },
    /// Absent from a side that must have it (a failure).
    Missing {
        /// Metadata, if one side has the tensor.
        meta: Option<PairMeta>,
        /// Which side lacks it and why.
        note: String,
    },
    /// Absent from the side under test, which need not expose it (partial coverage): neither a
    /// pass nor a failure, unless [`CompareOptions::require_all`].
    Unobserved {
        /// Metadata of the reference side, if it has the tensor.
        meta: Option<PairMeta>,
        /// Which side lacks it.
        note: String,
    },
    /// Present on the side under test but absent from the reference: the reference must cover
    /// what is compared, so this is an error.
    NotInReference {
        /// Which side lacks it.
        note: String,
    },
    /// Present on both sides but not alignable (shape or layout).
    AlignmentFault {
        /// Metadata of the reference side, if known.
        meta: Option<PairMeta>,
        /// Why it could not be aligned.
        note: String,
        /// `(reference, runtime)` shapes when the tensors were read but their shapes differ.
        shapes: Option<(Vec<usize>, Vec<usize>)>,
    },
}

/// Supplies tensors by checkpoint name and step.
pub trait PairSource {
    /// The pair for `name@stepK`.
    fn pair(&self, name: &str, step: Step) -> Pair<'_>;
}

/// In-memory [`PairSource`] (tests, small runs).
#[derive(Debug, Default)]
pub struct MemorySource {
    entries: HashMap<(String, Step), MemoryEntry>,
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum MemoryEntry {
    Tensors {
        meta: PairMeta,
        reference: ndarray::ArrayD<f32>,
        runtime: ndarray::ArrayD<f32>,
        isolated: Option<ndarray::ArrayD<f32>>,
    },
    AlignmentFault(String),
    Unobserved,
}

impl MemorySource {
    /// Adds both tensors of a checkpoint (the layout is recorded as given).
    pub fn insert(
        &mut self,
        name: &str,
        step: Step,
        layout: Layout,
        reference: ndarray::ArrayD<f32>,
        runtime: ndarray::ArrayD<f32>,
    ) {
        let meta = PairMeta {
            shape: reference.shape().to_vec(),
            dtype: Dtype::F32,
            layout,
            axis_names: vec![],
        };
        self.entries.insert(
            (name.into(), step),
            MemoryEntry::Tensors {
                meta,
                reference,
                runtime,
                isolated: None,
            },
        );
    }

    /// Sets the isolated-mode runtime tensor of an inserted checkpoint.
    pub fn set_isolated(&mut self, name: &str, step: Step, isolated: ndarray::ArrayD<f32>) {
        if let Some(MemoryEntry::Tensors { isolated: i, .. }) =
            self.entries.get_mut(&(name.to_string(), step))
        {
            *i = Some(isolated);
        }
    }

    /// Sets the axis names of an inserted checkpoint (the contract's, for signature wording).
    pub fn set_axes(&mut self, name: &str, step: Step, axes: &[&str]) {
        if let Some(MemoryEntry::Tensors { meta, .. }) =
            self.entries.get_mut(&(name.to_string(), step))
        {
            meta.axis_names = axes.iter().map(|a| a.to_string()).collect();
        }
    }

    /// Marks a checkpoint as absent from the side under test (partial coverage).
    pub fn insert_unobserved(&mut self, name: &str, step: Step) {
        self.entries
            .insert((name.into(), step), MemoryEntry::Unobserved);
    }

    /// Marks a checkpoint as an alignment fault.
    pub fn insert_fault(&mut self, name: &str, step: Step, note: &str) {
        self.entries.insert(
            (name.into(), step),
            MemoryEntry::AlignmentFault(note.into()),
        );
    }
}

impl PairSource for MemorySource {
    fn pair(&self, name: &str, step: Step) -> Pair<'_> {
        match self.entries.get(&(name.to_string(), step)) {
            None => Pair::Missing {
                meta: None,
                note: "absent from both sides".into(),
            },
            Some(MemoryEntry::Unobserved) => Pair::Unobserved {
                meta: None,
                note: "absent from the dump under test".into(),
            },
            Some(MemoryEntry::AlignmentFault(n)) => Pair::AlignmentFault {
                meta: None,
                note: n.clone(),
                shapes: None,
            },
            Some(MemoryEntry::Tensors {
                meta,
                reference,
                runtime,
                isolated,
            }) => Pair::Tensors {
                meta: meta.clone(),
                reference: reference.view(),
                runtime: runtime.view(),
                isolated: isolated.as_ref().map(|a| a.view()),
            },
        }
    }
}

/// Options of [`compare_graph`].
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Tolerance policy.
    pub policy: Policy,
    /// Noise floors per `(name, step)` for calibrated mode.
    pub floors: HashMap<(String, Step), NoiseFloor>,
    /// A checkpoint absent from the side under test is a failure (`missing`) instead of
    /// `unobserved` (`xray check`, whose runtime graph declares every checkpoint;
    /// `xray compare --require-all`).
    pub require_all: bool,
    /// Checkpoints the side under test was fed with the reference's tensor (`extra.fed`): their
    /// consumers' errors are local.
    pub fed: Vec<String>,
    /// Steps after this one are `not_comparable` (the token streams parted there).
    pub comparable_up_to_step: Option<Step>,
    /// The ids the reference's generation config suppresses (for entries declaring
    /// `logits_processed: suppression`, and to name undeclared suppression).
    pub suppression: Option<crate::pipeline::Suppression>,
}

/// Result of [`compare_graph`].
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Per-checkpoint evidence in topological order.
    pub checkpoints: Vec<CheckpointEvidence>,
    /// Raw localization (indices into the graph).
    pub localization: Localization,
    /// The origin with its inputs and signature.
    pub first_divergence: Option<FirstDivergence>,
    /// The independent failures (`fail`: their observed inputs pass or were fed), described
    /// like the origin: in a run fed the reference's tensor, the fed stage's own divergence.
    pub independent: Vec<FirstDivergence>,
    /// Error along depth.
    pub error_profile: ErrorProfile,
    /// First step whose logits disagree in argmax.
    pub first_divergent_token_step: Option<Step>,
    /// Drill-down from that step.
    pub drill_down: Option<DrillDown>,
    /// The checkpoint graph compared (for [`Comparison::into_evidence`]'s regions).
    pub graph: CheckpointGraph,
    /// Substituted nodes, indexed like the graph.
    pub fed_nodes: Vec<bool>,
}

/// The divergence signature of a shape disagreement, in the contract's axis names: which axes
/// differ and by how much ("one key fewer along past+tokens: the cache lost a position").
pub fn shape_explanation(
    axis_names: &[String],
    reference: &[usize],
    runtime: &[usize],
) -> crate::signatures::Explanation {
    let axis = |i: usize| {
        axis_names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("axis {i}"))
    };
    let mut parts = Vec::new();
    let mut axes = Vec::new();
    if reference.len() != runtime.len() {
        parts.push(format!(
            "rank {} vs {} in the reference ({runtime:?} vs {reference:?})",
            runtime.len(),
            reference.len()
        ));
    } else {
        for (i, (&r, &x)) in reference.iter().zip(runtime).enumerate() {
            if r == x {
                continue;
            }
            let name = axis(i);
            // A cache axis counts keys (positions); any other axis counts entries.
            let cache = name.contains("past");
            let unit = |n: usize| match (cache, n) {
                (true, 1) => "key",
                (true, _) => "keys",
                (false, 1) => "entry",
                (false, _) => "entries",
            };
            let d = x.abs_diff(r);
            let count = if d == 1 {
                "one".to_string()
            } else {
                d.to_string()
            };
            let dir = if x < r { "fewer" } else { "more" };
            let mut t = format!(
                "{count} {} {dir} along {name} ({x} vs {r} in the reference)",
                unit(d)
            );
            if name == "tokens" && x == 1 && r > 1 {
                t.push_str(": the last position only? An engine that returns the last row declares \"token_positions\": \"last\" on the entry (docs/dump-format.md) and it is compared with the reference's last row");
            }
            if cache {
                let what = if d == 1 { "a position" } else { "positions" };
                t.push_str(&format!(
                    ": the cache {} {what}",
                    if x < r { "lost" } else { "gained" }
                ));
            }
            axes.push(name);
            parts.push(t);
        }
        let (mut rs, mut xs) = (reference.to_vec(), runtime.to_vec());
        rs.sort_unstable();
        xs.sort_unstable();
        if rs == xs && reference != runtime {
            parts = vec![format!(
                "the same extents in another axis order ({runtime:?} vs {reference:?} over {}): a layout the contract does not declare",
                axis_names.join(", ")
            )];
        }
    }
    crate::signatures::Explanation {
        signature: SignatureKind::Shape,
        detail: parts.join("; "),
        evidence: serde_json::json!({
            "reference_shape": reference,
            "runtime_shape": runtime,
            "axes": axis_names,
            "differing_axes": axes,
        }),
    }
}

/// The unobserved region in front of node `o` as evidence, and the suspects (producers of the
/// region's checkpoints, then `o`'s own), following the checkpoint graph.
fn region_and_suspects(
    graph: &CheckpointGraph,
    status: &[Status],
    fed: &[bool],
    o: usize,
    own_label: &str,
) -> (Option<Region>, Vec<String>) {
    let nodes = graph.nodes();
    let (region, boundary) = gap_before(graph, status, o);
    let mut suspects: Vec<String> = Vec::new();
    for &u in region.iter().chain(std::iter::once(&o)) {
        if !suspects.contains(&nodes[u].producer) {
            suspects.push(nodes[u].producer.clone());
        }
    }
    if region.is_empty() {
        return (None, suspects);
    }
    let label = |u: usize| {
        if fed.get(u).copied().unwrap_or(false) {
            "fed".to_string()
        } else {
            status[u].as_str().to_string()
        }
    };
    let short = |u: usize| format!("{}@{}", nodes[u].name, nodes[u].step);
    let before: Vec<String> = boundary
        .iter()
        .map(|&u| format!("{} ({})", short(u), label(u)))
        .collect();
    let summary = if before.is_empty() {
        format!(
            "before {} ({own_label}): nothing upstream observed",
            short(o)
        )
    } else {
        format!(
            "between {} and {} ({own_label})",
            before.join(", "),
            short(o)
        )
    };
    let all: Vec<(&str, Step)> = nodes.iter().map(|n| (n.name.as_str(), n.step)).collect();
    let sel: Vec<(&str, Step)> = region
        .iter()
        .map(|&u| (nodes[u].name.as_str(), nodes[u].step))
        .collect();
    (
        Some(Region {
            summary,
            after: boundary
                .iter()
                .map(|&u| InputEvidence {
                    checkpoint: nodes[u].name.clone(),
                    step: nodes[u].step,
                    status: status[u],
                })
                .collect(),
            unobserved: compress_ids(&all, &sel),
            unobserved_count: region.len(),
        }),
        suspects,
    )
}

/// Default axis names for a layout and rank.
pub fn layout_axis_names(layout: Layout, rank: usize) -> Vec<String> {
    let names: &[&str] = match (layout, rank) {
        (Layout::HeadMajor, 3) => &["heads", "tokens", "head_dim"],
        (Layout::TokenMajor, 2) => &["tokens", "features"],
        (Layout::ChannelMajor, 2) => &["channels", "frames"],
        _ => &[],
    };
    names.iter().map(|s| s.to_string()).collect()
}

/// Compares every node of `graph` with tensors from `src`, localizes the first divergence and
/// explains it.
pub fn compare_graph(
    graph: &CheckpointGraph,
    src: &dyn PairSource,
    opts: &CompareOptions,
) -> Result<Comparison, Error> {
    let n = graph.len();
    // A policy rule that matches none of these checkpoints is a typo or another model's rule.
    opts.policy.check_rules_match(
        graph
            .nodes()
            .iter()
            .map(|c| (c.name.as_str(), Some(c.step))),
    )?;
    let mut observed = Vec::with_capacity(n);
    let mut partial: Vec<CheckpointEvidence> = Vec::with_capacity(n);
    let mut errors: Vec<Option<ErrorPoint>> = Vec::with_capacity(n);
    let mut logits_steps = Vec::new();
    let fed: Vec<bool> = graph
        .nodes()
        .iter()
        .map(|n| opts.fed.contains(&n.name))
        .collect();
    for node in graph.nodes() {
        if let Some(k) = opts.comparable_up_to_step.filter(|&k| node.step > k) {
            let tol =
                opts.policy
                    .resolve_kind(&node.name, node.step, Dtype::F32, None, node.logits);
            errors.push(None);
            observed.push(Observed::NotComparable);
            partial.push(CheckpointEvidence {
                name: node.name.clone(),
                step: node.step,
                producer: node.producer.clone(),
                consumers: node.consumers.clone(),
                shape: vec![],
                dtype: Dtype::F32.as_str().into(),
                layout: String::new(),
                metrics: None,
                local_metrics: None,
                tolerance: ToleranceEvidence::from(&tol),
                status: Status::NotComparable,
                propagated_from: vec![],
                note: Some(format!(
                    "not comparable: the token streams parted at step {k}, so step {} ran on other tokens",
                    node.step
                )),
            });
            continue;
        }
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
        let dtype = meta.as_ref().map_or(Dtype::F32, |m| m.dtype);
        let floor = opts.floors.get(&(node.name.clone(), node.step));
        let tol = opts
            .policy
            .resolve_kind(&node.name, node.step, dtype, floor, node.logits);
        let (obs, metrics, local) = match &pair {
            Pair::Tensors {
                reference,
                runtime,
                isolated,
                ..
            } => {
                let run = |x: &ArrayViewD<f32>| -> Result<Metrics, Error> {
                    if node.logits {
                        compare_logits(reference, x, &tol.tolerance)
                    } else {
                        compare(reference, x, &tol.tolerance)
                    }
                };
                match run(runtime) {
                    Ok(m) => {
                        let local = isolated.as_ref().map(&run).transpose()?;
                        let ok = m.passes(&tol.tolerance);
                        (
                            if ok { Observed::Pass } else { Observed::Fail },
                            Some(m),
                            local,
                        )
                    }
                    // A shape disagreement after alignment is a fault of this edge, not a crash.
                    Err(Error::ShapeMismatch { .. } | Error::NotLogits { .. }) => {
                        (Observed::AlignmentFault, None, None)
                    }
                    // A non-finite reference is an input error: name the checkpoint and stop.
                    Err(Error::NonFiniteReference {
                        count,
                        index,
                        value,
                        ..
                    }) => {
                        return Err(Error::NonFiniteReference {
                            checkpoint: Some(node.id()),
                            count,
                            index,
                            value,
                        })
                    }
                    Err(e) => return Err(e),
                }
            }
            Pair::Missing { .. } => (Observed::Missing, None, None),
            Pair::Unobserved { .. } if opts.require_all => (Observed::Missing, None, None),
            Pair::Unobserved { .. } => (Observed::Unobserved, None, None),
            Pair::AlignmentFault { .. } | Pair::NotInReference { .. } => {
                (Observed::AlignmentFault, None, None)
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
        if let Some(l) = metrics.as_ref().and_then(|m| m.logits.as_ref()) {
            logits_steps.push((node.step, l.clone()));
        }
        errors.push(metrics.as_ref().map(|m| ErrorPoint {
            rel_l2: m.rel_l2,
            max_abs: m.max_abs,
        }));
        observed.push(obs);
        partial.push(CheckpointEvidence {
            name: node.name.clone(),
            step: node.step,
            producer: node.producer.clone(),
            consumers: node.consumers.clone(),
            shape: meta.as_ref().map(|m| m.shape.clone()).unwrap_or_default(),
            dtype: dtype.as_str().into(),
            layout: meta
                .as_ref()
                .map(|m| m.layout.to_string())
                .unwrap_or_default(),
            metrics,
            local_metrics: local,
            tolerance: ToleranceEvidence::from(&tol),
            status: crate::localize::Status::Pass,
            propagated_from: vec![],
            note,
        });
    }
    let loc = localize_fed(graph, &observed, &fed)?;
    let nodes = graph.nodes();
    for (i, c) in partial.iter_mut().enumerate() {
        c.status = loc.status[i];
        c.propagated_from = loc.propagated_from[i]
            .iter()
            .map(|&u| nodes[u].id())
            .collect();
    }
    let profile = error_profile(graph, &errors, &loc.status)?;
    let diverge = |o: usize| {
        let node = &nodes[o];
        let inputs = node
            .upstream
            .iter()
            .map(|&u| InputEvidence {
                checkpoint: nodes[u].name.clone(),
                step: nodes[u].step,
                status: loc.status[u],
            })
            .collect();
        let axis_names_of = |meta: &PairMeta, rank: usize| {
            if meta.axis_names.is_empty() {
                layout_axis_names(meta.layout, rank)
            } else {
                meta.axis_names.clone()
            }
        };
        let kind = match observed[o] {
            Observed::AlignmentFault => DivergenceKind::Shape,
            Observed::Missing => DivergenceKind::Missing,
            _ => DivergenceKind::Values,
        };
        let explanation = match src.pair(&node.name, node.step) {
            Pair::Tensors {
                meta,
                reference,
                runtime,
                ..
            } if kind == DivergenceKind::Shape => Some(shape_explanation(
                &axis_names_of(&meta, reference.ndim()),
                reference.shape(),
                runtime.shape(),
            )),
            Pair::AlignmentFault { meta, note, shapes } => Some(match shapes {
                Some((r, x)) => {
                    shape_explanation(&meta.map_or(vec![], |m| axis_names_of(&m, r.len())), &r, &x)
                }
                None => crate::signatures::Explanation {
                    signature: SignatureKind::Layout,
                    detail: note,
                    evidence: serde_json::json!({}),
                },
            }),
            Pair::Missing { note, .. } | Pair::Unobserved { note, .. } => {
                Some(crate::signatures::Explanation {
                    signature: SignatureKind::Missing,
                    detail: note,
                    evidence: serde_json::json!({}),
                })
            }
            Pair::Tensors {
                meta,
                reference,
                runtime,
                ..
            } => {
                let axis_names = if meta.axis_names.is_empty() {
                    layout_axis_names(meta.layout, reference.ndim())
                } else {
                    meta.axis_names.clone()
                };
                let eopts = ExplainOptions {
                    axis_names,
                    tolerance: partial[o].tolerance.tolerance(),
                    ..Default::default()
                };
                let oc = origin_context(graph, src, o);
                let mut e = explain_with(&reference, &runtime, &eopts, &oc);
                let per_step: Vec<(Step, bool)> = (0..n)
                    .filter(|&i| nodes[i].name == node.name)
                    .map(|i| (nodes[i].step, loc.status[i].is_divergent()))
                    .collect();
                if per_step.len() > 1 {
                    if let (Some(s), serde_json::Value::Object(m)) =
                        (steps_subset(&per_step), &mut e.evidence)
                    {
                        m.insert("failing_steps".into(), serde_json::json!(s));
                    }
                }
                Some(e)
            }
            Pair::NotInReference { .. } => None,
        };
        let own = match kind {
            DivergenceKind::Shape => "shape",
            DivergenceKind::Missing => "missing",
            _ => "fail",
        };
        let (region, suspects) = region_and_suspects(graph, &loc.status, &fed, o, own);
        FirstDivergence {
            checkpoint: node.name.clone(),
            step: node.step,
            producer: node.producer.clone(),
            inputs,
            explanation,
            kind,
            region,
            suspects,
            op: None,
        }
    };
    let first_divergence = loc.origin.map(diverge);
    let independent = loc.independent.iter().map(|&o| diverge(o)).collect();
    let token_step = first_divergent_token_step(logits_steps.iter().map(|(s, l)| (*s, l)));
    Ok(Comparison {
        checkpoints: partial,
        first_divergence,
        independent,
        error_profile: profile,
        first_divergent_token_step: token_step,
        drill_down: token_step.map(|k| drill_down(graph, &loc, k)),
        localization: loc,
        graph: graph.clone(),
        fed_nodes: fed,
    })
}

/// Why the token streams part while every observed checkpoint passes, in words that hold for
/// what is known: a stream that ends (a reference dump with fewer steps, or truncated: no
/// numerical divergence), a near tie only when the logits metrics show one, and no step number
/// when none is known (e.g. a stats-only comparison without the token alignment).
fn tokens_part_detail(
    e: &Evidence,
    step: Option<Step>,
    logits: usize,
    logits_id: &str,
    status: Status,
) -> String {
    let at = step.map_or(
        "at a step not known (no logits metrics to find it)".to_string(),
        |k| format!("at step {k}"),
    );
    if let Some(t) = e.tokens.as_ref().filter(|t| t.parted_at_step.is_some()) {
        match (t.reference_token, t.candidate_token) {
            (None, Some(c)) => {
                return format!(
                    "the reference's tokens end {at} where the candidate's go on (candidate token {c}): the reference dump holds fewer steps (made with a lower --max-steps, or truncated); no numerical divergence was observed, re-make the reference with as many steps"
                )
            }
            (Some(r), None) => {
                return format!(
                    "the candidate's tokens end {at} where the reference's go on (reference token {r}): the candidate stopped early (a lower step cap, or its own end-of-text); every observed checkpoint passes"
                )
            }
            _ => {}
        }
    }
    let why = if !status.is_observed() {
        " (unobserved)".to_string()
    } else {
        match e
            .checkpoints
            .get(logits)
            .and_then(|c| c.metrics.as_ref())
            .and_then(|m| m.logits.as_ref())
        {
            Some(l) if l.argmax_near_ties > 0 => {
                " within tolerance (a near tie of the reference's top logits)".to_string()
            }
            Some(_) => " within tolerance".to_string(),
            None => " within tolerance (judged without the logits themselves)".to_string(),
        }
    };
    format!(
        "the token streams part {at} while every observed checkpoint passes: the argmax of {logits_id} differs{why}"
    )
}

impl Comparison {
    /// Assembles the evidence document; the verdict is derived from the content
    /// ([`Evidence::derive_verdict`]). `transcript.first_divergent_step` is filled from the logits
    /// when the caller left it `None`.
    pub fn into_evidence(
        self,
        run: Run,
        transcript: Option<Transcript>,
        capture_neutral: Option<bool>,
        notes: Vec<String>,
    ) -> Evidence {
        self.into_evidence_with(run, transcript, capture_neutral, notes, vec![], None)
    }

    /// [`Comparison::into_evidence`] with the fed edges and the token alignment of an outside
    /// engine. Adds the coverage block, and when the verdict is `diverged` with no origin among
    /// the checkpoints (the tokens part while every observed checkpoint passes, or capture is
    /// not neutral), a `first_divergence` of kind `tokens` / `capture` at the logits of the
    /// parting step (or the last logits), with the unobserved region before it: a divergence is
    /// never reported without a place to start.
    pub fn into_evidence_with(
        self,
        run: Run,
        mut transcript: Option<Transcript>,
        capture_neutral: Option<bool>,
        notes: Vec<String>,
        fed: Vec<FedEdge>,
        tokens: Option<TokenAlignment>,
    ) -> Evidence {
        if let Some(t) = transcript.as_mut() {
            t.first_divergent_step = t
                .first_divergent_step
                .or(tokens.as_ref().and_then(|a| a.parted_at_step))
                .or(self.first_divergent_token_step);
        }
        let coverage = coverage_of(&self.checkpoints);
        let mut e = Evidence {
            schema: SCHEMA.into(),
            verdict: Verdict::Pass,
            run,
            checkpoints: self.checkpoints,
            first_divergence: self.first_divergence,
            independent: self.independent,
            error_profile: self.error_profile,
            drill_down: self.drill_down,
            capture_neutral,
            transcript,
            notes,
            coverage: Some(coverage),
            fed,
            tokens,
            op_points: None,
            reference_variants: vec![],
            precision: None,
        };
        e.verdict = e.derive_verdict();
        if e.verdict == Verdict::Diverged && e.first_divergence.is_none() {
            let nodes = self.graph.nodes();
            let status: Vec<Status> = e.checkpoints.iter().map(|c| c.status).collect();
            let token_step = e
                .transcript
                .as_ref()
                .filter(|t| !t.tokens_equal)
                .and_then(|t| t.first_divergent_step);
            let (kind, target) = if e.transcript.as_ref().is_some_and(|t| !t.tokens_equal) {
                let at = token_step.unwrap_or(0);
                (
                    DivergenceKind::Tokens,
                    (0..nodes.len())
                        .find(|&i| nodes[i].logits && nodes[i].step == at)
                        .or_else(|| (0..nodes.len()).rev().find(|&i| nodes[i].logits)),
                )
            } else {
                (
                    DivergenceKind::Capture,
                    (0..nodes.len()).rev().find(|&i| nodes[i].logits),
                )
            };
            let target = target.or(nodes.len().checked_sub(1));
            if let Some(o) = target.filter(|&o| o < status.len()) {
                let node = &nodes[o];
                let (detail, own) = match kind {
                    DivergenceKind::Tokens => (
                        tokens_part_detail(&e, token_step, o, &node.id(), status[o]),
                        "tokens differ",
                    ),
                    _ => (
                        "capture changed the runtime's outputs: the observers are not neutral"
                            .to_string(),
                        "capture",
                    ),
                };
                let (region, suspects) =
                    region_and_suspects(&self.graph, &status, &self.fed_nodes, o, own);
                e.first_divergence = Some(FirstDivergence {
                    checkpoint: node.name.clone(),
                    step: node.step,
                    producer: node.producer.clone(),
                    inputs: node
                        .upstream
                        .iter()
                        .map(|&u| InputEvidence {
                            checkpoint: nodes[u].name.clone(),
                            step: nodes[u].step,
                            status: status[u],
                        })
                        .collect(),
                    explanation: Some(crate::signatures::Explanation {
                        signature: match kind {
                            DivergenceKind::Tokens => SignatureKind::Tokens,
                            _ => SignatureKind::Capture,
                        },
                        detail,
                        evidence: serde_json::json!({}),
                    }),
                    kind,
                    region,
                    suspects,
                    op: None,
                });
            }
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::localize::tests::spec;
    use crate::localize::{build_graph, CheckpointSpec, Status, StepRef, Steps};
    use ndarray::{ArrayD, IxDyn};

    fn ramp(shape: &[usize], k: f32) -> ArrayD<f32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(
            IxDyn(shape),
            (0..n).map(|i| ((i as f32) * k).sin()).collect(),
        )
        .unwrap()
    }

    fn specs() -> Vec<CheckpointSpec> {
        let s = |name: &str, steps, inputs, logits| spec(name, steps, inputs, logits, None);
        vec![
            s("mem", Steps::Once, vec![], false),
            s("k", Steps::Prefill, vec![("mem", StepRef::Same)], false),
            s("attn", Steps::Every, vec![("k", StepRef::Prefill)], false),
            s("logits", Steps::Every, vec![("attn", StepRef::Same)], true),
        ]
    }

    #[test]
    fn pipeline_localizes_and_explains_a_transposed_cache() {
        let g = build_graph(&specs(), &[0, 1]).unwrap();
        let mut src = MemorySource::default();
        let mem = ramp(&[8, 12], 0.37);
        src.insert("mem", 0, Layout::TokenMajor, mem.clone(), mem.clone());
        let k = ramp(&[3, 8, 4], 0.11);
        let bad_k = ArrayD::from_shape_vec(
            IxDyn(&[3, 8, 4]),
            k.view()
                .permuted_axes(IxDyn(&[1, 0, 2]))
                .iter()
                .copied()
                .collect(),
        )
        .unwrap();
        src.insert("k", 0, Layout::HeadMajor, k.clone(), bad_k);
        for step in 0..2 {
            let a = ramp(&[2, 5], 0.5 + step as f32);
            src.insert("attn", step, Layout::TokenMajor, a.clone(), &a + 0.3f32);
            let l = ramp(&[2, 7], 1.3);
            let mut lx = l.clone();
            if step == 1 {
                lx[[0, 0]] = 5.0;
            }
            src.insert("logits", step, Layout::TokenMajor, l, lx);
        }
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!((fd.checkpoint.as_str(), fd.step), ("k", 0));
        assert_eq!(fd.inputs[0].status, Status::Pass);
        let ex = fd.explanation.as_ref().unwrap();
        assert_eq!(ex.signature, SignatureKind::Permutation);
        assert!(
            ex.detail.contains("tokens, heads, head_dim"),
            "{}",
            ex.detail
        );
        let st: Vec<Status> = c.checkpoints.iter().map(|c| c.status).collect();
        assert_eq!(st[0], Status::Pass);
        assert!(st[2..]
            .iter()
            .all(|s| *s == Status::Propagated || *s == Status::Pass));
        assert_eq!(c.first_divergent_token_step, Some(1));
        assert_eq!(
            c.drill_down.as_ref().unwrap().cause_up_to_step.as_deref(),
            Some("k@step0")
        );
        let e = c.into_evidence(Run::default(), None, Some(true), vec![]);
        assert_eq!(e.verdict, Verdict::Diverged);
    }

    #[test]
    fn missing_fault_and_isolation() {
        let g = build_graph(&specs()[..2], &[0]).unwrap();
        let mut src = MemorySource::default();
        let mem = ramp(&[4, 4], 0.2);
        src.insert("mem", 0, Layout::TokenMajor, mem.clone(), mem.clone());
        src.set_isolated("mem", 0, &mem + 1.0f32);
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::Missing);
        assert!(c.checkpoints[0].local_metrics.as_ref().unwrap().max_abs > 0.9);
        // The first alignment fault is the origin (it keeps its status); before issue 12 item 3
        // `first_divergence` was empty here.
        src.insert_fault("k", 0, "layout plain has no transform to head_major");
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::AlignmentFault);
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("k", DivergenceKind::Shape)
        );
        assert_eq!(
            fd.explanation.as_ref().unwrap().signature,
            SignatureKind::Layout
        );
        // A shape disagreement inside a pair is an alignment fault too, not an error.
        src.insert(
            "k",
            0,
            Layout::HeadMajor,
            ramp(&[2, 3], 1.0),
            ramp(&[3, 2], 1.0),
        );
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::AlignmentFault);
        assert!(c.checkpoints[1].note.as_deref().unwrap().contains("[2, 3]"));
    }

    /// A chain mel -> conv -> layer -> mem -> logits@0..2 (logits read the previous step too).
    fn chain() -> CheckpointGraph {
        let s = |name: &str, steps, inputs, logits| spec(name, steps, inputs, logits, None);
        build_graph(
            &[
                s("mel", Steps::Once, vec![], false),
                s("conv", Steps::Once, vec![("mel", StepRef::Same)], false),
                s(
                    "layer.0.out",
                    Steps::Once,
                    vec![("conv", StepRef::Same)],
                    false,
                ),
                s(
                    "layer.1.out",
                    Steps::Once,
                    vec![("layer.0.out", StepRef::Same)],
                    false,
                ),
                s(
                    "mem",
                    Steps::Once,
                    vec![("layer.1.out", StepRef::Same)],
                    false,
                ),
                s(
                    "logits",
                    Steps::Every,
                    vec![("mem", StepRef::Same), ("logits", StepRef::Previous)],
                    true,
                ),
            ],
            &[0, 1, 2],
        )
        .unwrap()
    }

    /// Every tensor equal; `diff` lists the `(name, step)` whose runtime side is off by 0.5.
    fn chain_source(unobserved: &[&str], diff: &[(&str, Step)]) -> MemorySource {
        let g = chain();
        let mut src = MemorySource::default();
        for n in g.nodes() {
            if unobserved.contains(&n.name.as_str()) {
                src.insert_unobserved(&n.name, n.step);
                continue;
            }
            let r = ramp(&[3, 8], 0.3 + n.step as f32);
            let mut x = r.clone();
            if diff.contains(&(n.name.as_str(), n.step)) {
                x += 0.5;
            }
            src.insert(&n.name, n.step, Layout::TokenMajor, r, x);
        }
        src
    }

    #[test]
    fn partial_coverage_names_the_region_and_its_suspects() {
        let g = chain();
        let gap = ["conv", "layer.0.out", "layer.1.out"];
        let src = chain_source(
            &gap,
            &[("mem", 0), ("logits", 0), ("logits", 1), ("logits", 2)],
        );
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        let fd = c.first_divergence.clone().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("mem", DivergenceKind::Values)
        );
        let r = fd.region.as_ref().unwrap();
        assert_eq!(r.summary, "between mel@0 (pass) and mem@0 (fail)");
        assert_eq!(r.unobserved, ["conv", "layer.0..1.out"]);
        assert_eq!(r.unobserved_count, 3);
        assert_eq!(
            fd.suspects,
            ["op.conv", "op.layer.0.out", "op.layer.1.out", "op.mem"]
        );
        let e = c.into_evidence(Run::default(), None, None, vec![]);
        assert_eq!(e.verdict, Verdict::Diverged);
        let cov = e.coverage.unwrap();
        assert_eq!((cov.observed, cov.unobserved), (5, 3));
        assert_eq!(cov.unobserved_names, ["conv", "layer.0..1.out"]);
        // Every observed checkpoint passes: a pass, over what was observed.
        let c = compare_graph(&g, &chain_source(&gap, &[]), &CompareOptions::default()).unwrap();
        let e = c.into_evidence(Run::default(), None, None, vec![]);
        assert_eq!(e.verdict, Verdict::Pass);
        assert!(e
            .checkpoints
            .iter()
            .filter(|c| gap.contains(&c.name.as_str()))
            .all(|c| c.status == Status::Unobserved));
        // --require-all: absence is a failure, the first absent checkpoint the origin.
        let opts = CompareOptions {
            require_all: true,
            ..Default::default()
        };
        let c = compare_graph(&g, &chain_source(&gap, &[]), &opts).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::Missing);
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("conv", DivergenceKind::Missing)
        );
    }

    #[test]
    fn steps_after_the_parting_are_not_comparable_and_fed_edges_isolate() {
        let g = chain();
        let src = chain_source(&[], &[("logits", 1), ("logits", 2)]);
        let opts = CompareOptions {
            comparable_up_to_step: Some(1),
            ..Default::default()
        };
        let c = compare_graph(&g, &src, &opts).unwrap();
        let st: Vec<(String, Status)> = c.checkpoints.iter().map(|c| (c.id(), c.status)).collect();
        assert!(
            st.contains(&("logits@step1".into(), Status::Origin)),
            "{st:?}"
        );
        assert!(
            st.contains(&("logits@step2".into(), Status::NotComparable)),
            "{st:?}"
        );
        // The mel differs but the reference's mel was fed downstream: conv's error is its own.
        let src = chain_source(&[], &[("mel", 0), ("conv", 0)]);
        let opts = CompareOptions {
            fed: vec!["mel".into()],
            ..Default::default()
        };
        let c = compare_graph(&g, &src, &opts).unwrap();
        assert_eq!(c.checkpoints[0].status, Status::Origin);
        assert_eq!(c.checkpoints[1].status, Status::Fail);
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::Propagated);
    }

    #[test]
    fn shape_divergence_is_named_in_the_contracts_axes() {
        let axes: Vec<String> = ["heads", "tokens", "past+tokens"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let e = shape_explanation(&axes, &[6, 1, 5], &[6, 1, 4]);
        assert_eq!(e.signature, SignatureKind::Shape);
        assert_eq!(
            e.detail,
            "one key fewer along past+tokens (4 vs 5 in the reference): the cache lost a position"
        );
        let e = shape_explanation(&axes, &[6, 1, 5], &[6, 3, 5]);
        assert_eq!(
            e.detail,
            "2 entries more along tokens (3 vs 1 in the reference)"
        );
        let e = shape_explanation(&axes, &[6, 2, 5], &[5, 2, 6]);
        assert!(e.detail.contains("another axis order"), "{}", e.detail);
        // Through the pipeline: a cache one position short is the origin, its consumer inherits.
        let g = build_graph(&specs(), &[0, 1]).unwrap();
        let mut src = MemorySource::default();
        let mem = ramp(&[8, 12], 0.37);
        src.insert("mem", 0, Layout::TokenMajor, mem.clone(), mem);
        let k = ramp(&[3, 5, 4], 0.11);
        let short = k.slice(ndarray::s![.., ..4, ..]).to_owned().into_dyn();
        src.insert("k", 0, Layout::HeadMajor, k, short);
        src.set_axes("k", 0, &["heads", "past+tokens", "head_dim"]);
        for step in 0..2 {
            let a = ramp(&[2, 5], 0.5);
            src.insert("attn", step, Layout::TokenMajor, a.clone(), &a + 1.0f32);
            let l = ramp(&[2, 7], 1.3);
            src.insert("logits", step, Layout::TokenMajor, l.clone(), l);
        }
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!(
            (fd.checkpoint.as_str(), fd.kind),
            ("k", DivergenceKind::Shape)
        );
        assert!(fd
            .explanation
            .as_ref()
            .unwrap()
            .detail
            .starts_with("one key fewer along past+tokens"));
        assert_eq!(c.checkpoints[2].status, Status::Propagated);
    }

    /// Whatever makes the verdict `diverged`, `first_divergence` names a place to start.
    #[test]
    fn first_divergence_is_never_empty_when_diverged() {
        let g = chain();
        let transcript = |equal: bool| Transcript {
            runtime: "a".into(),
            reference: "b".into(),
            tokens_equal: equal,
            first_divergent_step: None,
        };
        let tokens = |k: Step| TokenAlignment {
            teacher_forced: false,
            prefix: 2,
            parted_at_step: Some(k),
            reference_token: Some(1),
            candidate_token: Some(2),
            not_comparable_steps: None,
        };
        let run = |src: &MemorySource,
                   opts: &CompareOptions,
                   t: Option<Transcript>,
                   neutral: Option<bool>,
                   a: Option<TokenAlignment>| {
            compare_graph(&g, src, opts).unwrap().into_evidence_with(
                Run::default(),
                t,
                neutral,
                vec![],
                vec![],
                a,
            )
        };
        let plain = CompareOptions::default();
        let mut shape = chain_source(&[], &[]);
        shape.insert(
            "conv",
            0,
            Layout::TokenMajor,
            ramp(&[3, 8], 0.3),
            ramp(&[3, 7], 0.3),
        );
        let mut fault = chain_source(&[], &[]);
        fault.insert_fault("layer.0.out", 0, "no transform");
        let mut missing = chain_source(&[], &[]);
        missing.insert_unobserved("mem", 0);
        let require = CompareOptions {
            require_all: true,
            ..Default::default()
        };
        let gap = chain_source(&["mem", "layer.1.out"], &[]);
        let cases: Vec<(&str, Evidence, DivergenceKind, &str)> = vec![
            (
                "values",
                run(&chain_source(&[], &[("conv", 0)]), &plain, None, None, None),
                DivergenceKind::Values,
                "conv",
            ),
            (
                "shape",
                run(&shape, &plain, None, None, None),
                DivergenceKind::Shape,
                "conv",
            ),
            (
                "alignment fault",
                run(&fault, &plain, None, None, None),
                DivergenceKind::Shape,
                "layer.0.out",
            ),
            (
                "missing under --require-all",
                run(&missing, &require, None, None, None),
                DivergenceKind::Missing,
                "mem",
            ),
            (
                "tokens part, every observed checkpoint passes",
                run(
                    &chain_source(&[], &[]),
                    &plain,
                    Some(transcript(false)),
                    None,
                    Some(tokens(1)),
                ),
                DivergenceKind::Tokens,
                "logits",
            ),
            (
                "tokens part behind unobserved checkpoints",
                run(&gap, &plain, Some(transcript(false)), None, Some(tokens(0))),
                DivergenceKind::Tokens,
                "logits",
            ),
            (
                "capture not neutral",
                run(
                    &chain_source(&[], &[]),
                    &plain,
                    Some(transcript(true)),
                    Some(false),
                    None,
                ),
                DivergenceKind::Capture,
                "logits",
            ),
        ];
        for (what, e, kind, at) in cases {
            assert_eq!(e.verdict, Verdict::Diverged, "{what}");
            let fd = e
                .first_divergence
                .as_ref()
                .unwrap_or_else(|| panic!("{what}: empty"));
            assert_eq!((fd.kind, fd.checkpoint.as_str()), (kind, at), "{what}");
            assert!(!fd.suspects.is_empty(), "{what}");
        }
        // The tokens part at step 1: the logits of step 1 are the place; behind a gap, the region.
        let e = run(
            &chain_source(&[], &[]),
            &plain,
            Some(transcript(false)),
            None,
            Some(tokens(1)),
        );
        assert_eq!(e.first_divergence.as_ref().unwrap().step, 1);
        let e = run(&gap, &plain, Some(transcript(false)), None, Some(tokens(0)));
        let r = e.first_divergence.unwrap().region.unwrap();
        assert_eq!(
            r.summary,
            "between layer.0.out@0 (pass) and logits@0 (tokens differ)"
        );
    }
}
