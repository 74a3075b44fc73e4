//! The comparison pipeline over a checkpoint graph: per node metrics and tolerance, status,
//! localization, the origin's signature, the error profile and the token drill-down.
//!
//! The caller supplies tensors through [`PairSource`] (for example two loaded dumps, or the
//! runtime and oracle outputs held in memory); [`compare_graph`] returns a [`Comparison`] whose
//! parts go straight into [`crate::evidence::Evidence`] ([`Comparison::into_evidence`]).

use std::collections::HashMap;

use ndarray::ArrayViewD;

use crate::evidence::{
    CheckpointEvidence, Evidence, FirstDivergence, InputEvidence, Run, ToleranceEvidence,
    Transcript, Verdict, SCHEMA,
};
use crate::localize::{
    drill_down, error_profile, first_divergent_token_step, localize, CheckpointGraph, DrillDown,
    ErrorPoint, ErrorProfile, Localization, Observed,
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
    /// Canonical layout name.
    pub layout: String,
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
    /// Absent from one side.
    Missing {
        /// Metadata, if one side has the tensor.
        meta: Option<PairMeta>,
        /// Which side lacks it and why.
        note: String,
    },
    /// Present on both sides but not alignable (shape or layout).
    AlignmentFault {
        /// Metadata of the reference side, if known.
        meta: Option<PairMeta>,
        /// Why it could not be aligned.
        note: String,
    },
}

/// Supplies tensors by checkpoint name and step.
pub trait PairSource {
    /// The pair for `name@stepK`.
    fn pair(&self, name: &str, step: u32) -> Pair<'_>;
}

/// In-memory [`PairSource`] (tests, small runs).
#[derive(Debug, Default)]
pub struct MemorySource {
    entries: HashMap<(String, u32), MemoryEntry>,
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
}

impl MemorySource {
    /// Adds both tensors of a checkpoint (the layout is recorded as given).
    pub fn insert(
        &mut self,
        name: &str,
        step: u32,
        layout: &str,
        reference: ndarray::ArrayD<f32>,
        runtime: ndarray::ArrayD<f32>,
    ) {
        let meta = PairMeta {
            shape: reference.shape().to_vec(),
            dtype: Dtype::F32,
            layout: layout.into(),
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
    pub fn set_isolated(&mut self, name: &str, step: u32, isolated: ndarray::ArrayD<f32>) {
        if let Some(MemoryEntry::Tensors { isolated: i, .. }) =
            self.entries.get_mut(&(name.to_string(), step))
        {
            *i = Some(isolated);
        }
    }

    /// Marks a checkpoint as an alignment fault.
    pub fn insert_fault(&mut self, name: &str, step: u32, note: &str) {
        self.entries.insert(
            (name.into(), step),
            MemoryEntry::AlignmentFault(note.into()),
        );
    }
}

impl PairSource for MemorySource {
    fn pair(&self, name: &str, step: u32) -> Pair<'_> {
        match self.entries.get(&(name.to_string(), step)) {
            None => Pair::Missing {
                meta: None,
                note: "absent from both sides".into(),
            },
            Some(MemoryEntry::AlignmentFault(n)) => Pair::AlignmentFault {
                meta: None,
                note: n.clone(),
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
    pub floors: HashMap<(String, u32), NoiseFloor>,
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
    /// Error along depth.
    pub error_profile: ErrorProfile,
    /// First step whose logits disagree in argmax.
    pub first_divergent_token_step: Option<u32>,
    /// Drill-down from that step.
    pub drill_down: Option<DrillDown>,
}

/// Default axis names for a layout and rank.
pub fn layout_axis_names(layout: &str, rank: usize) -> Vec<String> {
    let names: &[&str] = match (layout, rank) {
        ("head_major", 3) => &["heads", "tokens", "head_dim"],
        ("token_major", 2) => &["tokens", "features"],
        ("channel_major", 2) => &["channels", "frames"],
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
    for node in graph.nodes() {
        let pair = src.pair(&node.name, node.step);
        let (meta, note) = match &pair {
            Pair::Tensors { meta, .. } => (Some(meta.clone()), None),
            Pair::Missing { meta, note } | Pair::AlignmentFault { meta, note } => {
                (meta.clone(), Some(note.clone()))
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
            Pair::AlignmentFault { .. } => (Observed::AlignmentFault, None, None),
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
            layout: meta.as_ref().map(|m| m.layout.clone()).unwrap_or_default(),
            metrics,
            local_metrics: local,
            tolerance: ToleranceEvidence::from(&tol),
            status: crate::localize::Status::Pass,
            propagated_from: vec![],
            note,
        });
    }
    let loc = localize(graph, &observed)?;
    let nodes = graph.nodes();
    for (i, c) in partial.iter_mut().enumerate() {
        c.status = loc.status[i];
        c.propagated_from = loc.propagated_from[i]
            .iter()
            .map(|&u| nodes[u].id())
            .collect();
    }
    let profile = error_profile(graph, &errors, &loc.status)?;
    let first_divergence = loc.origin.map(|o| {
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
        let explanation = match src.pair(&node.name, node.step) {
            Pair::Tensors {
                meta,
                reference,
                runtime,
                ..
            } => {
                let axis_names = if meta.axis_names.is_empty() {
                    layout_axis_names(&meta.layout, reference.ndim())
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
                let per_step: Vec<(u32, bool)> = (0..n)
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
            _ => None,
        };
        FirstDivergence {
            checkpoint: node.name.clone(),
            step: node.step,
            producer: node.producer.clone(),
            inputs,
            explanation,
        }
    });
    let token_step = first_divergent_token_step(logits_steps.iter().map(|(s, l)| (*s, l)));
    Ok(Comparison {
        checkpoints: partial,
        first_divergence,
        error_profile: profile,
        first_divergent_token_step: token_step,
        drill_down: token_step.map(|k| drill_down(graph, &loc, k)),
        localization: loc,
    })
}

impl Comparison {
    /// Assembles the evidence document; the verdict is derived from the content
    /// ([`Evidence::derive_verdict`]). `transcript.first_divergent_step` is filled from the logits
    /// when the caller left it `None`.
    pub fn into_evidence(
        self,
        run: Run,
        mut transcript: Option<Transcript>,
        capture_neutral: Option<bool>,
        notes: Vec<String>,
    ) -> Evidence {
        if let Some(t) = transcript.as_mut() {
            t.first_divergent_step = t.first_divergent_step.or(self.first_divergent_token_step);
        }
        let mut e = Evidence {
            schema: SCHEMA.into(),
            verdict: Verdict::Pass,
            run,
            checkpoints: self.checkpoints,
            first_divergence: self.first_divergence,
            error_profile: self.error_profile,
            drill_down: self.drill_down,
            capture_neutral,
            transcript,
            notes,
        };
        e.verdict = e.derive_verdict();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let s = |name: &str, steps, inputs: Vec<(&str, StepRef)>, logits| CheckpointSpec {
            name: name.into(),
            producer: format!("op.{name}"),
            steps,
            inputs: inputs.into_iter().map(|(n, r)| (n.into(), r)).collect(),
            layer: None,
            logits,
        };
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
        src.insert("mem", 0, "token_major", mem.clone(), mem.clone());
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
        src.insert("k", 0, "head_major", k.clone(), bad_k);
        for step in 0..2 {
            let a = ramp(&[2, 5], 0.5 + step as f32);
            src.insert("attn", step, "token_major", a.clone(), &a + 0.3f32);
            let l = ramp(&[2, 7], 1.3);
            let mut lx = l.clone();
            if step == 1 {
                lx[[0, 0]] = 5.0;
            }
            src.insert("logits", step, "token_major", l, lx);
        }
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        let fd = c.first_divergence.as_ref().unwrap();
        assert_eq!((fd.checkpoint.as_str(), fd.step), ("k", 0));
        assert_eq!(fd.inputs[0].status, Status::Pass);
        let ex = fd.explanation.as_ref().unwrap();
        assert_eq!(ex.signature, "permutation");
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
        src.insert("mem", 0, "token_major", mem.clone(), mem.clone());
        src.set_isolated("mem", 0, &mem + 1.0f32);
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::Missing);
        assert!(c.checkpoints[0].local_metrics.as_ref().unwrap().max_abs > 0.9);
        src.insert_fault("k", 0, "layout plain has no transform to head_major");
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::AlignmentFault);
        assert!(c.first_divergence.is_none());
        // A shape disagreement inside a pair is an alignment fault too, not an error.
        src.insert("k", 0, "head_major", ramp(&[2, 3], 1.0), ramp(&[3, 2], 1.0));
        let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
        assert_eq!(c.checkpoints[1].status, Status::AlignmentFault);
        assert!(c.checkpoints[1].note.as_deref().unwrap().contains("[2, 3]"));
    }
}
