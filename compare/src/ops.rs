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
use xray_core::Step;

use crate::align::layout_axis_names;
use crate::align::to_canonical;
use crate::evidence::ToleranceEvidence;
use crate::localize::Status;
use crate::metrics::{compare, Metrics};
use crate::signatures::{explain_with, ExplainOptions, Explanation, OpContext};
use crate::tolerance::{Policy, Precision};

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
    pub step: Step,
    /// The engine's op that holds the bug, when exactly one op lies between the agreeing inputs
    /// and this point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// Every engine op between the agreeing inputs and this point, in graph order (the module
    /// itself when the points came from a dump without an engine graph).
    pub suspects: Vec<String>,
    /// Set when the suspects are one module's whole computation: the nearest agreeing input is
    /// `{module}:in` and this point `{module}:out` (names the contract declares `same_as` the
    /// points the dumps hold). `module` is that module: it is replayed and cut out as a whole.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub boundary: bool,
    /// The nearest observed points upstream.
    pub inputs: Vec<PointInput>,
    /// `fail`.
    pub status: Status,
    /// Metrics of the point (absent for a shape divergence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// The tolerance it was judged by.
    pub tolerance: ToleranceEvidence,
    /// Shapes when they differ (`reference`, `runtime`): never set since op-level points are
    /// aligned by declaration (a shared point whose shapes differ is a [`PointAlignment`] fault,
    /// not an origin); read in older evidence.
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
            None if self.boundary => format!(
                "module {} ({}, its {} ops from {} to {})",
                self.module,
                self.point,
                self.suspects.len(),
                self.suspects.first().map_or("?", String::as_str),
                self.suspects.last().map_or("?", String::as_str)
            ),
            None => format!("{} (one of: {})", self.point, self.suspects.join(", ")),
        };
        let misaligned: Vec<&str> = self
            .inputs
            .iter()
            .filter(|i| i.status == Status::AlignmentFault)
            .map(|i| i.point.as_str())
            .collect();
        let who = if misaligned.is_empty() {
            who
        } else {
            format!(
                "{who} [input point(s) not aligned, so not cleared: {}]",
                misaligned.join(", ")
            )
        };
        let sig = self
            .explanation
            .as_ref()
            .map(|e| format!(": {} ({})", e.signature, e.detail))
            .unwrap_or_default();
        format!("{}{sig}", xray_core::key(&who, self.step))
    }
}

/// Where the reference weight of a module can be read (`xray compare --model DIR`): for the
/// grid-quantization signature of a linear op whose input has fewer rows than features.
pub type WeightLookup<'a> = &'a dyn Fn(&str) -> Option<ArrayD<f32>>;

/// The names of the points a dump holds at `step`, in its manifest order (firing order for the
/// reference oracle).
pub fn dump_points(d: &Dump, step: Step) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for e in &d.manifest.checkpoints {
        if e.step == step && parse_point(&e.name).is_some() && !v.contains(&e.name) {
            v.push(e.name.clone());
        }
    }
    v
}

/// Whether a dump carries any op-level point.
pub fn has_points(d: &Dump) -> bool {
    d.manifest
        .checkpoints
        .iter()
        .any(|e| parse_point(&e.name).is_some())
}

/// Whether both dumps carry op-level points at `step`.
pub fn both_have_points(reference: &Dump, candidate: &Dump, step: Step) -> bool {
    !dump_points(reference, step).is_empty() && !dump_points(candidate, step).is_empty()
}

/// One side's tensor of `name@step`, in `layout` when it is stored in another one.
fn side(d: &Dump, name: &str, step: Step, layout: Layout) -> Option<(ArrayD<f32>, Layout)> {
    let e = d.entry(name, step)?;
    let t = d.get(name, step)?;
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
    step: Step,
    policy: &Policy,
    weight: Option<WeightLookup<'_>>,
) -> Option<OpDivergence> {
    // The name of each node both dumps hold at this step (its first such alias).
    let held: Vec<Option<&String>> = nodes
        .iter()
        .map(|n| {
            n.names
                .iter()
                .find(|p| reference.entry(p, step).is_some() && candidate.entry(p, step).is_some())
        })
        .collect();
    let mut compared = 0;
    // Nodes whose shared point could not be aligned: no evidence either way.
    let mut misaligned = vec![false; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let Some(name) = held[i] else { continue };
        let Some((module, point_side)) = parse_point(name) else {
            continue;
        };
        let layout = reference.entry(name, step)?.layout;
        let (Some((r, _)), Some((x, _))) = (
            side(reference, name, step, layout),
            side(candidate, name, step, layout),
        ) else {
            misaligned[i] = true;
            continue;
        };
        // A shape disagreement is an alignment fault (`compare_points` reports it), never the
        // op-level origin: the op may compute correctly on a tensor held in another form.
        if r.shape() != x.shape() {
            misaligned[i] = true;
            continue;
        }
        compared += 1;
        let tol = policy.resolve_kind(name, step, Precision::F32, None, false);
        // Every input held by both dumps came earlier in graph order and agreed.
        let inputs: Vec<PointInput> = node
            .inputs
            .iter()
            .filter(|&&u| u < nodes.len())
            .map(|&u| match held[u] {
                Some(p) if misaligned[u] => PointInput {
                    point: p.clone(),
                    status: Status::AlignmentFault,
                },
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
        // An input that could not be aligned, or that neither dump holds, was not seen to agree:
        // the op is not named alone.
        let cleared = inputs
            .iter()
            .all(|p| !matches!(p.status, Status::AlignmentFault | Status::Unobserved));
        let (op, suspects) = match node.ops.as_slice() {
            [one] if cleared => (Some(one.clone()), vec![one.clone()]),
            many => (None, many.to_vec()),
        };
        // Several ops that are one module's whole computation: that module.
        let enclosing = (op.is_none() && cleared)
            .then(|| boundary_module(nodes, node, &inputs))
            .flatten();
        let mut out = OpDivergence {
            point: name.clone(),
            module: enclosing.clone().unwrap_or_else(|| module.to_string()),
            side: point_side,
            step,
            op,
            suspects,
            boundary: enclosing.is_some(),
            inputs,
            status: Status::Fail,
            metrics: None,
            tolerance: ToleranceEvidence::from(&tol),
            shapes: None,
            explanation: None,
            compared,
            replay: None,
        };
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
            [u] if *u < nodes.len() && !misaligned[*u] => held[*u].and_then(|p| {
                let l = reference.entry(p, step)?.layout;
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
                let t = reference.get(&p, step)?;
                (t.shape() == r.shape()).then(|| (xray_core::key(&p, step).to_string(), t.clone()))
            })
            .collect();
        let oc = OpContext {
            op_input: input.as_ref().map(|t| t.view()),
            weight: w2,
            candidates: others.iter().map(|(n, t)| (n.clone(), t.view())).collect(),
            ..Default::default()
        };
        let eopts = ExplainOptions::judged_by(layout_axis_names(layout, r.ndim()), tol.tolerance);
        out.explanation = Some(
            carried(reference, candidate, name, step, layout, &x, &tol.tolerance)
                .unwrap_or_else(|| explain_with(&r.view(), &x.view(), &eopts, &oc)),
        );
        out.metrics = Some(m);
        return Some(out);
    }
    None
}

/// A decoder cache point (`:keys` / `:values`, `[heads, past+tokens, head_dim]`) at `step` whose
/// past rows are not what the engine's own same point held at the step before, while that one
/// agreed with the reference: the cache changed between the steps (the state an engine carries,
/// not the append that wrote it). The rows are named, whether this step's new rows agree, and the
/// reference's cache tensor at the step before that the past rows hold instead, if one does.
/// `None` when it does not hold (or either step is not held).
fn carried(
    reference: &Dump,
    candidate: &Dump,
    name: &str,
    step: Step,
    layout: Layout,
    x: &ArrayD<f32>,
    tol: &crate::tolerance::Tolerance,
) -> Option<Explanation> {
    use ndarray::{s, Ix3};
    let (_, Side::Keys | Side::Values) = parse_point(name)? else {
        return None;
    };
    let before = step.checked_sub(1)?;
    let (r0, _) = side(reference, name, before, layout)?;
    let (x0, _) = side(candidate, name, before, layout)?;
    let (x, x0, r0) = (
        x.view().into_dimensionality::<Ix3>().ok()?,
        x0.into_dimensionality::<Ix3>().ok()?,
        r0.into_dimensionality::<Ix3>().ok()?,
    );
    let past = x0.shape()[1];
    if past == 0
        || x0.shape() != r0.shape()
        || x.shape()[1] <= past
        || x.shape()[0] != x0.shape()[0]
    {
        return None;
    }
    let agrees = |a: &ndarray::ArrayViewD<f32>, b: &ndarray::ArrayViewD<f32>| {
        compare(a, b, tol).is_ok_and(|m| m.passes(tol))
    };
    let read_back = x.slice(s![.., ..past, ..]).into_dyn();
    if !agrees(&r0.view().into_dyn(), &x0.view().into_dyn())
        || agrees(&x0.view().into_dyn(), &read_back)
    {
        return None;
    }
    let new_rows = side(reference, name, step, layout).and_then(|(r, _)| {
        let r = r.into_dimensionality::<Ix3>().ok()?;
        (r.shape() == x.shape()).then(|| {
            agrees(
                &r.slice(s![.., past.., ..]).into_dyn(),
                &x.slice(s![.., past.., ..]).into_dyn(),
            )
        })
    });
    // What the past rows hold instead: another of the reference's tensors of their shape at the
    // step before (the other half of the cache, another layer's).
    let source = dump_points(reference, before)
        .into_iter()
        .filter(|p| p != name)
        .find(|p| {
            side(reference, p, before, layout).is_some_and(|(t, _)| {
                t.shape() == read_back.shape() && agrees(&t.view(), &read_back)
            })
        })
        .map(|p| xray_core::key(&p, before).to_string());
    let mut detail = format!(
        "positions 0..{} of the cache ({} rows the step reads back) are not what the engine wrote at step {before} (its own {}), which agreed with the reference: the cache changed between the steps",
        past - 1,
        past,
        xray_core::key(name, before)
    );
    if let Some(s) = &source {
        detail.push_str(&format!("; they hold the reference's {s}"));
    }
    match new_rows {
        Some(true) => detail.push_str("; this step's new rows agree"),
        Some(false) => detail.push_str("; this step's new rows differ too"),
        None => {}
    }
    Some(Explanation {
        signature: xray_core::signature::SignatureKind::Carried,
        detail,
        evidence: serde_json::json!({
            "past_rows": past,
            "written": xray_core::key(name, before).to_string(),
            "source": source,
            "new_rows_agree": new_rows,
        }),
    })
}

/// The module whose `:out` the node carries and whose `:in` every one of its agreeing inputs
/// carries (a module with no input observed does not qualify): the suspects between them are its
/// whole computation.
fn boundary_module(nodes: &[PointNode], node: &PointNode, inputs: &[PointInput]) -> Option<String> {
    if inputs.is_empty() || inputs.iter().any(|i| i.status != Status::Pass) {
        return None;
    }
    node.names.iter().find_map(|n| {
        let (m, s) = parse_point(n)?;
        let want = format!("{m}:in");
        (s == Side::Out
            && node
                .inputs
                .iter()
                .all(|&u| nodes.get(u).is_some_and(|x| x.names.contains(&want))))
        .then(|| m.to_string())
    })
}

/// `nodes` with the names the contract declares the same tensor as one a node carries
/// (`Contract::same_as`: (the module's point, the point it is)) added to that node.
pub fn with_same_as(mut nodes: Vec<PointNode>, same_as: &[(String, String)]) -> Vec<PointNode> {
    for (alias, of) in same_as {
        for n in nodes.iter_mut() {
            if n.names.iter().any(|p| p == of) && !n.names.contains(alias) {
                n.names.push(alias.clone());
            }
        }
    }
    nodes
}

/// The points' graph as two dumps observe it at `step`: a node both dumps hold whose inputs
/// they do not hold takes instead its nearest held ancestors as inputs, and every op on the way
/// as its ops (in graph order), so an engine that exposes few points (candle: its encoder's input
/// and output) is localized between the points it does expose, never to the one op next to an
/// unobserved input. A path reaching an unobserved node with no inputs (a feed) keeps it, as
/// unobserved; a node none of whose paths reaches a held one is left as it was. A point both
/// hold at step 0 only (a prefill-time tensor the later steps read) counts as held at every step.
pub fn held_graph(
    nodes: &[PointNode],
    reference: &Dump,
    candidate: &Dump,
    step: Step,
) -> Vec<PointNode> {
    // A point both dumps hold only at the prefill (a cross-attention projection the decode steps
    // reuse) bounds a later step's region as well: what those steps read is that tensor.
    let both =
        |p: &str, k: Step| reference.entry(p, k).is_some() && candidate.entry(p, k).is_some();
    let prefill_only = |p: &str| {
        step > 0
            && both(p, 0)
            && reference.entry(p, step).is_none()
            && candidate.entry(p, step).is_none()
    };
    let held: Vec<bool> = nodes
        .iter()
        .map(|n| n.names.iter().any(|p| both(p, step) || prefill_only(p)))
        .collect();
    let mut out = nodes.to_vec();
    for (i, n) in nodes.iter().enumerate() {
        if !held[i]
            || n.inputs
                .iter()
                .all(|&u| held.get(u).copied().unwrap_or(true))
        {
            continue;
        }
        let mut inputs: Vec<usize> = Vec::new();
        let mut crossed: Vec<usize> = Vec::new();
        let mut stack: Vec<usize> = n.inputs.clone();
        let mut seen = std::collections::BTreeSet::new();
        while let Some(u) = stack.pop() {
            if u >= nodes.len() || !seen.insert(u) {
                continue;
            }
            if held[u] || nodes[u].inputs.is_empty() {
                inputs.push(u);
            } else {
                crossed.push(u);
                stack.extend(nodes[u].inputs.iter().copied());
            }
        }
        if !inputs.iter().any(|&u| held[u]) {
            continue;
        }
        inputs.sort_unstable();
        crossed.sort_unstable();
        let mut ops: Vec<String> = Vec::new();
        for o in crossed.iter().flat_map(|&u| &nodes[u].ops).chain(&n.ops) {
            if !ops.contains(o) {
                ops.push(o.clone());
            }
        }
        out[i].inputs = inputs;
        out[i].ops = ops;
    }
    out
}

/// A point both dumps hold at one step, in forms that cannot be compared element for element
/// after the reference was brought to the engine's form by the contract's declared rules: an
/// alignment fault, reported, never a divergence and never passed over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointAlignment {
    /// Point name.
    pub point: String,
    /// Step.
    pub step: Step,
    /// The reference's shape and layout (after its declared transforms).
    pub reference: (Vec<usize>, Layout),
    /// The engine's.
    pub engine: (Vec<usize>, Layout),
    /// What does not fit.
    pub reason: String,
}

/// Every op-level point both dumps hold, compared (`op_points` in the evidence).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpPoints {
    /// (point, step) pairs both dumps hold.
    pub shared: usize,
    /// Of those, compared element for element.
    pub compared: usize,
    /// Within tolerance.
    pub pass: usize,
    /// Beyond tolerance (ids `name@stepN`, the first 20; `failed_count` has them all).
    pub failed: Vec<String>,
    /// How many failed.
    pub failed_count: usize,
    /// Shared points that could not be aligned.
    pub alignment_faults: Vec<PointAlignment>,
    /// Points only the reference holds (the engine does not observe them).
    pub reference_only: usize,
    /// Points only the engine holds.
    pub engine_only: usize,
}

impl OpPoints {
    /// One line: `op-level points: 207 shared, 207 pass, 0 alignment faults`.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "op-level points: {} shared, {} pass, {} fail, {} alignment fault(s)",
            self.shared,
            self.pass,
            self.failed_count,
            self.alignment_faults.len()
        );
        if let Some(a) = self.alignment_faults.first() {
            s.push_str(&format!(
                " (first: {}: {})",
                xray_core::key(&a.point, a.step),
                a.reason
            ));
        }
        s
    }
}

/// Compare every op-level point both dumps hold, at every step. A point whose shapes or layouts
/// cannot be brought together is a [`PointAlignment`] fault; a non-finite reference value is
/// counted as neither pass nor fail (the checkpoint level reports non-finite references).
pub fn compare_points(reference: &Dump, candidate: &Dump, policy: &Policy) -> OpPoints {
    let mut out = OpPoints::default();
    for e in &reference.manifest.checkpoints {
        if parse_point(&e.name).is_none() {
            continue;
        }
        let step = e.step;
        let Some(c) = candidate.entry(&e.name, e.step) else {
            out.reference_only += 1;
            continue;
        };
        out.shared += 1;
        let fault = |reason: String| PointAlignment {
            point: e.name.clone(),
            step,
            reference: (e.shape.clone(), e.layout),
            engine: (c.shape.clone(), c.layout),
            reason,
        };
        let (Some(r), Some(x)) = (
            reference.get(&e.name, e.step),
            side(candidate, &e.name, step, e.layout),
        ) else {
            out.alignment_faults.push(fault(format!(
                "the engine's {} {:?} has no {} form",
                c.layout, c.shape, e.layout
            )));
            continue;
        };
        let x = x.0;
        if r.shape() != x.shape() {
            out.alignment_faults.push(fault(format!(
                "shapes differ: reference {:?} vs engine {:?} ({})",
                r.shape(),
                x.shape(),
                e.layout
            )));
            continue;
        }
        let tol = policy.resolve_kind(&e.name, step, Precision::F32, None, false);
        let Ok(m) = compare(&r.view(), &x.view(), &tol.tolerance) else {
            continue;
        };
        out.compared += 1;
        if m.passes(&tol.tolerance) {
            out.pass += 1;
        } else {
            out.failed_count += 1;
            if out.failed.len() < 20 {
                out.failed.push(xray_core::key(&e.name, step).to_string());
            }
        }
    }
    out.engine_only = candidate
        .manifest
        .checkpoints
        .iter()
        .filter(|c| parse_point(&c.name).is_some() && reference.entry(&c.name, c.step).is_none())
        .count();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::IxDyn;
    use xray_core::capture::Captured;

    fn dump(entries: &[(&str, f32)]) -> Dump {
        let m = xray_core::dump::Manifest::empty("whisper", "t", "test");
        let data = entries
            .iter()
            .map(|&(n, v)| Captured {
                name: n.into(),
                step: 0,
                layout: Layout::TokenMajor,
                data: ArrayD::from_shape_fn(IxDyn(&[4, 3]), |d| v + (d[0] * 3 + d[1]) as f32),
            })
            .collect();
        Dump::from_captured(m, data)
    }

    fn node(names: &[&str], inputs: &[usize], ops: &[&str]) -> PointNode {
        PointNode {
            names: names.iter().map(|s| s.to_string()).collect(),
            inputs: inputs.to_vec(),
            ops: ops.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// An engine holding only a module's first input and last output: without the held graph the
    /// op beside the unobserved input would be named; with it, the whole stretch is the suspects,
    /// and with the contract's `same_as` names the module is named as a whole.
    #[test]
    fn sparse_dumps_localize_between_held_points_to_the_enclosing_module() {
        let nodes = vec![
            node(&["enc.a:in"], &[], &[]),
            node(&["enc.a:out", "enc.b:in"], &[0], &["a"]),
            node(&["enc.b:out"], &[1], &["gelu", "b"]),
        ];
        let r = dump(&[
            ("enc.a:in", 0.0),
            ("enc.a:out", 1.0),
            ("enc.b:in", 1.0),
            ("enc.b:out", 2.0),
        ]);
        let x = dump(&[("enc.a:in", 0.0), ("enc.b:out", 2.5)]);
        let p = Policy::default();
        // The runtime graph as it is: `enc.b:out`'s input unobserved, two ops between.
        let plain = localize_op(&nodes, &r, &x, 0, &p, None).unwrap();
        assert_eq!(plain.inputs[0].status, Status::Unobserved);
        let held = held_graph(&nodes, &r, &x, 0);
        assert_eq!(held[2].inputs, [0]);
        assert_eq!(held[2].ops, ["a", "gelu", "b"]);
        let op = localize_op(&held, &r, &x, 0, &p, None).unwrap();
        assert_eq!(op.op, None);
        assert_eq!(op.suspects, ["a", "gelu", "b"]);
        assert_eq!(op.inputs[0].status, Status::Pass);
        assert!(!op.boundary);
        let same_as = [
            ("enc:in".to_string(), "enc.a:in".to_string()),
            ("enc:out".to_string(), "enc.b:out".to_string()),
        ];
        let named = held_graph(&with_same_as(nodes.clone(), &same_as), &r, &x, 0);
        assert_eq!(named[0].names, ["enc.a:in", "enc:in"]);
        let op = localize_op(&named, &r, &x, 0, &p, None).unwrap();
        assert!(op.boundary);
        assert_eq!(op.module, "enc");
        assert_eq!(op.point, "enc.b:out");
        assert!(
            op.summary()
                .starts_with("module enc (enc.b:out, its 3 ops from a to b)"),
            "{}",
            op.summary()
        );
        // Dumps that hold every point: the graph is left as it was.
        let full = dump(&[
            ("enc.a:in", 0.0),
            ("enc.a:out", 1.0),
            ("enc.b:in", 1.0),
            ("enc.b:out", 2.5),
        ]);
        assert_eq!(held_graph(&nodes, &r, &full, 0), nodes);
    }
}
