//! Op-level localization: from the origin checkpoint to the first op whose output differs while
//! its inputs agree.
//!
//! Both dumps carry op-level points (`{module}:{in|out}`, see `xray_core::ops`). The points form
//! a graph ([`PointNode`]): from the engine's own graph when it is known (each point's nearest
//! observed points upstream and the engine's ops in between), else the chain of the reference's
//! points in firing order ([`xray_core::ops::chain`]). At the origin's step the first point, in
//! graph order, that differs is the op-level origin: its inputs agree (or were not observed), so
//! the ops between them and it hold the bug. One op between them names it; more are listed as
//! suspects (a weightless stretch the reference exposes no tensor of, such as the attention core
//! between `q_proj:out` and `out_proj:in`).

use ndarray::{ArrayD, ArrayView2, Ix2};
use serde::{Deserialize, Serialize};
use xray_core::dump::Dump;
use xray_core::ops::{parse_point, PointNode, Side};
use xray_core::Layout;

use crate::compare::layout_axis_names;
use crate::evidence::ToleranceEvidence;
use crate::localize::Status;
use crate::metrics::{compare, Metrics};
use crate::pipeline::to_canonical;
use crate::signatures::{explain_with, ExplainOptions, Explanation, OpContext};
use crate::tolerance::{Dtype, Policy};

/// A point upstream of the op-level origin and its status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointInput {
    /// Point name.
    pub point: String,
    /// `pass`, or `unobserved` when neither dump holds it at this step.
    pub status: Status,
}

/// The op-level origin (`first_divergence.op` in the evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpDivergence {
    /// The first point that differs (`model.encoder.layers.3.fc2:out`).
    pub point: String,
    /// Its HF module.
    pub module: String,
    /// Its side of the module.
    pub side: Side,
    /// The step (the origin checkpoint's).
    pub step: u32,
    /// The engine's op that holds the bug, when exactly one op lies between the agreeing inputs
    /// and this point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// Every engine op between the agreeing inputs and this point, in graph order (the module
    /// itself when the points came from a dump without an engine graph).
    pub suspects: Vec<String>,
    /// The nearest observed points upstream.
    pub inputs: Vec<PointInput>,
    /// `fail`.
    pub status: Status,
    /// Metrics of the point (absent for a shape divergence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// The tolerance it was judged by.
    pub tolerance: ToleranceEvidence,
    /// Shapes when they differ (`reference`, `runtime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shapes: Option<(Vec<usize>, Vec<usize>)>,
    /// Its signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Explanation>,
    /// How many points were compared at this step.
    pub compared: usize,
    /// Reference replay at this op (`xray_compare::mechanism`): its local error (the module
    /// replayed on the engine's own input), cleared or convicted, and the mechanism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<crate::mechanism::ReplayEvidence>,
}

impl OpDivergence {
    /// One line: `op encoder.layer.3.fc2 (model.encoder.layers.3.fc2:out): grid_quantization`.
    pub fn summary(&self) -> String {
        let who = match &self.op {
            Some(op) => format!("op {op} ({})", self.point),
            None => format!("{} (one of: {})", self.point, self.suspects.join(", ")),
        };
        let sig = self
            .explanation
            .as_ref()
            .map(|e| format!(": {} ({})", e.signature, e.detail))
            .unwrap_or_default();
        format!("{who}@step{}{sig}", self.step)
    }
}

/// Where the reference weight of a module can be read (`xray compare --model DIR`): for the
/// grid-quantization signature of a linear op whose input has fewer rows than features.
pub type WeightLookup<'a> = &'a dyn Fn(&str) -> Option<ArrayD<f32>>;

/// The names of the points a dump holds at `step`, in its manifest order (firing order for the
/// reference oracle).
pub fn dump_points(d: &Dump, step: u32) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for e in &d.manifest.checkpoints {
        if e.step as u32 == step && parse_point(&e.name).is_some() && !v.contains(&e.name) {
            v.push(e.name.clone());
        }
    }
    v
}

/// Whether both dumps carry op-level points at `step`.
pub fn both_have_points(reference: &Dump, candidate: &Dump, step: u32) -> bool {
    !dump_points(reference, step).is_empty() && !dump_points(candidate, step).is_empty()
}

/// One side's tensor of `name@step`, in `layout` when it is stored in another one.
fn side(d: &Dump, name: &str, step: u32, layout: Layout) -> Option<(ArrayD<f32>, Layout)> {
    let e = d.entry(name, step as usize)?;
    let t = d.get(name, step as usize)?;
    if e.layout == layout {
        return Some((t.clone(), layout));
    }
    to_canonical(t, e.layout, layout, None)
        .ok()
        .map(|c| (c, layout))
}

/// The first point at `step` (in `nodes` order) that differs between `reference` and
/// `candidate`, with its signature; `None` when every point both dumps hold agrees (or they hold
/// none). Tolerances come from `policy` (points have no calibrated floors).
pub fn localize_op(
    nodes: &[PointNode],
    reference: &Dump,
    candidate: &Dump,
    step: u32,
    policy: &Policy,
    weight: Option<WeightLookup<'_>>,
) -> Option<OpDivergence> {
    // The name of each node both dumps hold at this step (its first such alias).
    let held: Vec<Option<&String>> = nodes
        .iter()
        .map(|n| {
            n.names.iter().find(|p| {
                reference.entry(p, step as usize).is_some()
                    && candidate.entry(p, step as usize).is_some()
            })
        })
        .collect();
    let mut compared = 0;
    for (i, node) in nodes.iter().enumerate() {
        let Some(name) = held[i] else { continue };
        let Some((module, point_side)) = parse_point(name) else {
            continue;
        };
        let layout = reference.entry(name, step as usize)?.layout;
        let (Some((r, _)), Some((x, _))) = (
            side(reference, name, step, layout),
            side(candidate, name, step, layout),
        ) else {
            continue;
        };
        compared += 1;
        let tol = policy.resolve_kind(name, step, Dtype::F32, None, false);
        // Every input held by both dumps came earlier in graph order and agreed.
        let inputs: Vec<PointInput> = node
            .inputs
            .iter()
            .filter(|&&u| u < nodes.len())
            .map(|&u| match held[u] {
                Some(p) => PointInput {
                    point: p.clone(),
                    status: Status::Pass,
                },
                None => PointInput {
                    point: nodes[u].names[0].clone(),
                    status: Status::Unobserved,
                },
            })
            .collect();
        let (op, suspects) = match node.ops.as_slice() {
            [one] => (Some(one.clone()), vec![one.clone()]),
            many => (None, many.to_vec()),
        };
        let mut out = OpDivergence {
            point: name.clone(),
            module: module.to_string(),
            side: point_side,
            step,
            op,
            suspects,
            inputs,
            status: Status::Fail,
            metrics: None,
            tolerance: ToleranceEvidence::from(&tol),
            shapes: None,
            explanation: None,
            compared,
            replay: None,
        };
        if r.shape() != x.shape() {
            out.shapes = Some((r.shape().to_vec(), x.shape().to_vec()));
            return Some(out);
        }
        // A reference holding a NaN or Inf at a point is no op-level evidence: the next one is.
        let Ok(m) = compare(&r.view(), &x.view(), &tol.tolerance) else {
            continue;
        };
        if m.passes(&tol.tolerance) {
            continue;
        }
        // The op's input in the reference: the one upstream point (an elementwise op's input,
        // a linear op's `x`).
        let input: Option<ArrayD<f32>> = match node.inputs.as_slice() {
            [u] => held[*u].and_then(|p| {
                let l = reference.entry(p, step as usize)?.layout;
                side(reference, p, step, l).map(|(t, _)| t)
            }),
            _ => None,
        };
        let w = match (point_side, weight) {
            (Side::Out, Some(f)) => f(module),
            _ => None,
        };
        let w2: Option<ArrayView2<f32>> = w
            .as_ref()
            .and_then(|w| w.view().into_dimensionality::<Ix2>().ok());
        // Wiring candidates: the reference's other points of this shape at this step (another
        // layer's projection, another head's slab).
        let others: Vec<(String, ArrayD<f32>)> = dump_points(reference, step)
            .into_iter()
            .filter(|p| p != name)
            .filter_map(|p| {
                let t = reference.get(&p, step as usize)?;
                (t.shape() == r.shape()).then(|| (format!("{p}@step{step}"), t.clone()))
            })
            .collect();
        let oc = OpContext {
            op_input: input.as_ref().map(|t| t.view()),
            weight: w2,
            candidates: others.iter().map(|(n, t)| (n.clone(), t.view())).collect(),
            ..Default::default()
        };
        let eopts = ExplainOptions {
            axis_names: layout_axis_names(&layout.to_string(), r.ndim()),
            tolerance: tol.tolerance,
            ..Default::default()
        };
        out.explanation = Some(explain_with(&r.view(), &x.view(), &eopts, &oc));
        out.metrics = Some(m);
        return Some(out);
    }
    None
}
