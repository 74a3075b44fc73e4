//! Localization of the first divergence along the checkpoint graph.
//!
//! The graph ([`CheckpointGraph`]) has one node per `(checkpoint name, step)` and an edge from each
//! checkpoint to every checkpoint computed from it (the contract's `inputs`). It is built from
//! the resolved contract's checkpoints ([`CheckpointSpec`], [`build_graph`]) or from explicit nodes
//! ([`CheckpointGraph::from_nodes`]).
//!
//! [`localize`] walks the nodes in topological order (step-major, then graph order) and classifies
//! every failing node:
//! - **origin**: the first failing node all of whose upstream nodes pass;
//! - **fail**: a later failing node all of whose upstream nodes pass (an independent divergence that
//!   the origin cannot explain; fix the origin first);
//! - **propagated**: a failing node with at least one non-passing upstream node (failing, missing or
//!   alignment fault); `propagated_from` names the root nodes it inherits from.
//!
//! A missing node or an alignment fault (a shape divergence) whose upstream nodes all pass is the
//! origin too when it comes first: the verdict is never `diverged` without a place to start.
//! Unobserved and not-comparable nodes are transparent: a failing node looks through them to its
//! nearest observed ancestors (and inherits any root behind them); a substituted (fed) node counts
//! as passing for its consumers, since they saw the reference's tensor. [`gap_before`] names the
//! unobserved region in front of a node.

use std::collections::{BTreeSet, BinaryHeap, HashMap};
use xray_core::Step;

use serde::{Deserialize, Serialize};

use xray_core::contract::Contract;
use xray_core::dump::Dump;

use crate::metrics::LogitsMetrics;
use crate::Error;

pub use xray_core::contract::{CheckpointSpec, StepRef, Steps};

/// A node given explicitly to [`CheckpointGraph::from_nodes`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeDef {
    /// Checkpoint name.
    pub name: String,
    /// Step.
    pub step: Step,
    /// Producing op.
    pub producer: String,
    /// Upstream `(name, step)` pairs.
    pub upstream: Vec<(String, Step)>,
    /// Repeat group and index.
    pub layer: Option<(String, u32)>,
    /// Whether the node holds logits.
    pub logits: bool,
}

/// A node of the checkpoint graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Checkpoint name.
    pub name: String,
    /// Step.
    pub step: Step,
    /// Producing op.
    pub producer: String,
    /// Consumer ops (by default the producers of downstream checkpoints; a caller holding the
    /// runtime graph may overwrite them).
    pub consumers: Vec<String>,
    /// Upstream node indices.
    pub upstream: Vec<usize>,
    /// Downstream node indices.
    pub downstream: Vec<usize>,
    /// Repeat group and index.
    pub layer: Option<(String, u32)>,
    /// Whether the node holds logits.
    pub logits: bool,
}

impl Node {
    /// `name@stepK`.
    pub fn id(&self) -> String {
        xray_core::key(&self.name, self.step).to_string()
    }
}

/// Checkpoint DAG with nodes in topological order (step-major, then declaration order among ready
/// nodes).
#[derive(Debug, Clone, Default)]
pub struct CheckpointGraph {
    nodes: Vec<Node>,
    index: HashMap<(String, Step), usize>,
}

impl CheckpointGraph {
    /// Builds a graph from explicit nodes; their order is the tie-break of the topological sort.
    pub fn from_nodes(defs: Vec<NodeDef>) -> Result<CheckpointGraph, Error> {
        let mut pos: HashMap<(String, Step), usize> = HashMap::with_capacity(defs.len());
        for (i, d) in defs.iter().enumerate() {
            if pos.insert((d.name.clone(), d.step), i).is_some() {
                return Err(Error::DuplicateNode {
                    name: d.name.clone(),
                    step: d.step,
                });
            }
        }
        let n = defs.len();
        let mut ups: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut downs: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, d) in defs.iter().enumerate() {
            for (un, us) in &d.upstream {
                let id = || xray_core::key(&d.name, d.step).to_string();
                let Some(&j) = pos.get(&(un.clone(), *us)) else {
                    return Err(Error::DanglingInput {
                        node: id(),
                        input: xray_core::key(un, *us).to_string(),
                    });
                };
                if *us > d.step {
                    return Err(Error::ForwardInStep {
                        node: id(),
                        input: xray_core::key(un, *us).to_string(),
                    });
                }
                if !ups[i].contains(&j) {
                    ups[i].push(j);
                    downs[j].push(i);
                }
            }
        }
        // Kahn's algorithm; the ready node with the smallest (step, declaration index) goes next.
        let mut indeg: Vec<usize> = ups.iter().map(Vec::len).collect();
        let mut heap: BinaryHeap<std::cmp::Reverse<(Step, usize)>> = (0..n)
            .filter(|&i| indeg[i] == 0)
            .map(|i| std::cmp::Reverse((defs[i].step, i)))
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(std::cmp::Reverse((_, i))) = heap.pop() {
            order.push(i);
            for &k in &downs[i] {
                indeg[k] -= 1;
                if indeg[k] == 0 {
                    heap.push(std::cmp::Reverse((defs[k].step, k)));
                }
            }
        }
        if order.len() < n {
            let stuck = (0..n).find(|&i| indeg[i] > 0).unwrap_or(0);
            return Err(Error::Cycle {
                step: defs[stuck].step,
                node: xray_core::key(&defs[stuck].name, defs[stuck].step).to_string(),
            });
        }
        let mut new_of = vec![0; n];
        for (new, &old) in order.iter().enumerate() {
            new_of[old] = new;
        }
        let mut defs: Vec<Option<NodeDef>> = defs.into_iter().map(Some).collect();
        let mut nodes = Vec::with_capacity(n);
        for &old in &order {
            let Some(d) = defs[old].take() else { continue };
            nodes.push(Node {
                name: d.name,
                step: d.step,
                producer: d.producer,
                consumers: Vec::new(),
                upstream: ups[old].iter().map(|&u| new_of[u]).collect(),
                downstream: downs[old].iter().map(|&u| new_of[u]).collect(),
                layer: d.layer,
                logits: d.logits,
            });
        }
        for i in 0..n {
            let mut cons: Vec<String> = Vec::new();
            for &k in &nodes[i].downstream {
                if !cons.contains(&nodes[k].producer) {
                    cons.push(nodes[k].producer.clone());
                }
            }
            nodes[i].consumers = cons;
        }
        let index = nodes
            .iter()
            .enumerate()
            .map(|(i, nd)| ((nd.name.clone(), nd.step), i))
            .collect();
        Ok(CheckpointGraph { nodes, index })
    }

    /// Nodes in topological order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Mutable nodes (to overwrite `consumers` from a runtime graph).
    pub fn nodes_mut(&mut self) -> &mut [Node] {
        &mut self.nodes
    }

    /// Index of `(name, step)`.
    pub fn find(&self, name: &str, step: Step) -> Option<usize> {
        self.index.get(&(name.to_string(), step)).copied()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Builds the graph of `specs` over the given steps (deduplicated; need not be contiguous).
///
/// A spec yields one node per step where [`Steps::present_at`] holds. `Same` inputs resolve to the
/// same step, or to step 0 when the input exists only at step 0 (`once`/`prefill`); `Prefill` to
/// step 0; `Previous` to `step - 1` (dropped at step 0 and when step - 1 is not among `steps`). An
/// input that resolves to no node is an error.
pub fn build_graph(specs: &[CheckpointSpec], steps: &[Step]) -> Result<CheckpointGraph, Error> {
    let mut steps: Vec<Step> = steps.to_vec();
    steps.sort_unstable();
    steps.dedup();
    let kinds: HashMap<&str, Steps> = specs.iter().map(|s| (s.name.as_str(), s.steps)).collect();
    let mut defs = Vec::new();
    for &s in &steps {
        for spec in specs.iter().filter(|sp| sp.steps.present_at(s)) {
            let mut upstream = Vec::with_capacity(spec.inputs.len());
            for (name, r) in &spec.inputs {
                let us = match r {
                    StepRef::Same if kinds.get(name.as_str()) == Some(&Steps::Every) => s,
                    StepRef::Same => 0,
                    StepRef::Prefill => 0,
                    StepRef::Previous => {
                        if s == 0 || steps.binary_search(&(s - 1)).is_err() {
                            continue;
                        }
                        s - 1
                    }
                };
                upstream.push((name.clone(), us));
            }
            defs.push(NodeDef {
                name: spec.name.clone(),
                step: s,
                producer: spec.producer.clone(),
                upstream,
                layer: spec.repeat.clone().zip(spec.layer.map(|l| l as u32)),
                logits: spec.kind.as_deref() == Some("logits"),
            });
        }
    }
    CheckpointGraph::from_nodes(defs)
}

/// Observed status of one node after comparing its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Within tolerance.
    Pass,
    /// Outside tolerance.
    Fail,
    /// Absent from one side.
    Missing,
    /// Shape or layout could not be aligned.
    AlignmentFault,
    /// Absent from the dump under test (its engine does not expose it): neither a pass nor a
    /// failure; transparent for localization.
    Unobserved,
    /// Not comparable: the two sides computed it from different inputs (after the token streams
    /// parted); transparent for localization.
    NotComparable,
}

/// Final status of a checkpoint in the evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Within tolerance.
    Pass,
    /// The first failing node whose upstream nodes all pass (a first missing or not-aligned node
    /// is the origin too, but keeps its own status; see [`Localization::origin`]).
    Origin,
    /// Fails downstream of a non-passing node.
    Propagated,
    /// Could not be aligned.
    AlignmentFault,
    /// Absent from one side.
    Missing,
    /// Fails although every upstream node passes, after the origin (independent divergence).
    Fail,
    /// Absent from the dump under test (partial coverage): neither a pass nor a failure.
    Unobserved,
    /// Computed from different inputs on the two sides (a step after the token streams parted):
    /// not a divergence, not a pass.
    NotComparable,
}

impl Status {
    /// Lower-case name as in the evidence.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Origin => "origin",
            Status::Propagated => "propagated",
            Status::AlignmentFault => "alignment_fault",
            Status::Missing => "missing",
            Status::Fail => "fail",
            Status::Unobserved => "unobserved",
            Status::NotComparable => "not_comparable",
        }
    }

    /// Whether the node was compared (neither unobserved nor not comparable).
    pub fn is_observed(self) -> bool {
        !matches!(self, Status::Unobserved | Status::NotComparable)
    }

    /// Whether the node diverged (origin, fail or propagated).
    pub fn is_divergent(self) -> bool {
        matches!(self, Status::Origin | Status::Fail | Status::Propagated)
    }
}

/// Result of [`localize`], indexed like [`CheckpointGraph::nodes`].
#[derive(Debug, Clone, PartialEq)]
pub struct Localization {
    /// Final status per node.
    pub status: Vec<Status>,
    /// The origin node: the first failing, missing or not-aligned node whose observed upstream
    /// nodes all pass (looking through unobserved ones).
    pub origin: Option<usize>,
    /// Failing nodes with all-passing inputs after the origin.
    pub independent: Vec<usize>,
    /// For propagated nodes: the root nodes (origin, fail, missing, alignment fault) they inherit
    /// from, ascending; empty otherwise.
    pub propagated_from: Vec<Vec<usize>>,
    /// First divergent node in topological order (may be propagated from a missing node).
    pub first_divergent: Option<usize>,
}

/// Classifies every node (see the module doc); no node is substituted.
pub fn localize(g: &CheckpointGraph, observed: &[Observed]) -> Result<Localization, Error> {
    localize_fed(g, observed, &vec![false; observed.len()])
}

/// Checks that every per-node list is as long as the graph: `Error::Length` for the first not.
fn per_node(g: &CheckpointGraph, lens: &[usize]) -> Result<(), Error> {
    match lens.iter().find(|&&len| len != g.len()) {
        Some(&found) => Err(Error::Length {
            expected: g.len(),
            found,
        }),
        None => Ok(()),
    }
}

/// Classifies every node; `fed[i]` marks a node whose consumers received the reference's tensor
/// instead of this side's (an isolation feed): it counts as passing for them, whatever its own
/// status.
pub fn localize_fed(
    g: &CheckpointGraph,
    observed: &[Observed],
    fed: &[bool],
) -> Result<Localization, Error> {
    per_node(g, &[observed.len(), fed.len()])?;
    let n = g.len();
    let mut status = vec![Status::Pass; n];
    let mut from: Vec<Vec<usize>> = vec![Vec::new(); n];
    // Roots a node hands to its consumers: itself for a root, its inheritance for propagated,
    // unobserved and not-comparable nodes (transparent), nothing for a pass or a fed node.
    let mut carry: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut origin = None;
    let mut independent = Vec::new();
    let mut first_divergent = None;
    for (i, node) in g.nodes().iter().enumerate() {
        let mut roots = BTreeSet::new();
        for &u in &node.upstream {
            if !fed[u] {
                roots.extend(carry[u].iter().copied());
            }
        }
        status[i] = match observed[i] {
            Observed::Pass => Status::Pass,
            Observed::Unobserved | Observed::NotComparable => {
                carry[i] = roots.into_iter().collect();
                if observed[i] == Observed::Unobserved {
                    Status::Unobserved
                } else {
                    Status::NotComparable
                }
            }
            Observed::Missing | Observed::AlignmentFault => {
                let own = if observed[i] == Observed::Missing {
                    Status::Missing
                } else {
                    Status::AlignmentFault
                };
                // The origin keeps its own status (`missing`, `alignment_fault`): the kind of
                // divergence stays visible; `first_divergence` names it.
                if roots.is_empty() && origin.is_none() {
                    origin = Some(i);
                }
                carry[i] = vec![i];
                own
            }
            Observed::Fail => {
                first_divergent.get_or_insert(i);
                if !roots.is_empty() {
                    from[i] = roots.into_iter().collect();
                    carry[i] = from[i].clone();
                    Status::Propagated
                } else {
                    carry[i] = vec![i];
                    if origin.is_none() {
                        origin = Some(i);
                        Status::Origin
                    } else {
                        independent.push(i);
                        Status::Fail
                    }
                }
            }
        };
    }
    Ok(Localization {
        status,
        origin,
        independent,
        propagated_from: from,
        first_divergent,
    })
}

/// The unobserved region in front of node `target`: walking upstream through unobserved and
/// not-comparable nodes, the nodes crossed (`region`, ascending) and the observed nodes where the
/// walk stops (`boundary`, ascending). Both empty when every input of `target` was observed.
pub fn gap_before(
    g: &CheckpointGraph,
    status: &[Status],
    target: usize,
) -> (Vec<usize>, Vec<usize>) {
    let nodes = g.nodes();
    let mut region = BTreeSet::new();
    let mut boundary = BTreeSet::new();
    let mut stack: Vec<usize> = nodes.get(target).map_or(vec![], |t| t.upstream.clone());
    while let Some(u) = stack.pop() {
        match status.get(u) {
            Some(s) if !s.is_observed() && region.insert(u) => {
                stack.extend(nodes[u].upstream.iter().copied());
            }
            Some(s) if !s.is_observed() => {}
            Some(_) => {
                boundary.insert(u);
            }
            None => {}
        }
    }
    (region.into_iter().collect(), boundary.into_iter().collect())
}

/// The steps a dump holds tensors at, ascending (0 always included).
pub fn dump_steps(d: &Dump) -> Vec<Step> {
    let mut steps: Vec<Step> = d.manifest.checkpoints.iter().map(|e| e.step).collect();
    steps.push(0);
    steps.sort_unstable();
    steps.dedup();
    steps
}

/// The checkpoint graph of a contract over the steps present in the reference dump.
pub fn graph_for(c: &Contract, reference: &Dump) -> Result<CheckpointGraph, Error> {
    build_graph(&c.checkpoints, &dump_steps(reference))
}

/// What the localize stage finds from the judged nodes ([`locate`]).
#[derive(Debug, Clone)]
pub struct Located {
    /// Statuses, origin, independent failures.
    pub localization: Localization,
    /// Error along depth.
    pub error_profile: ErrorProfile,
    /// First step whose logits disagree in argmax.
    pub first_divergent_token_step: Option<Step>,
    /// Drill-down from that step to checkpoints.
    pub drill_down: Option<DrillDown>,
}

/// The localize stage: every node classified ([`localize_fed`]; `fed[i]`: node `i`'s consumers
/// saw the reference's tensor), the error profile of `errors` (per node, `None` without
/// metrics), and from the logits metrics per step the first divergent token step and its
/// drill-down.
pub fn locate(
    g: &CheckpointGraph,
    observed: &[Observed],
    errors: &[Option<ErrorPoint>],
    logits: &[(Step, LogitsMetrics)],
    fed: &[bool],
) -> Result<Located, Error> {
    let localization = localize_fed(g, observed, fed)?;
    let error_profile = error_profile(g, errors, &localization.status)?;
    let token_step = first_divergent_token_step(logits.iter().map(|(s, l)| (*s, l)));
    Ok(Located {
        error_profile,
        first_divergent_token_step: token_step,
        drill_down: token_step.map(|k| drill_down(g, &localization, k)),
        localization,
    })
}

/// Error of one node for the profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorPoint {
    /// `rel_l2` of the node.
    pub rel_l2: f64,
    /// `max_abs` of the node.
    pub max_abs: f64,
}

/// Largest error within one layer of a repeat group at one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// Repeat group (`encoder_layers`, `decoder_layers`).
    pub stack: String,
    /// Layer index.
    pub layer: u32,
    /// Step.
    pub step: Step,
    /// Largest `rel_l2` in the layer.
    pub max_rel_l2: f64,
    /// Largest `max_abs` in the layer.
    pub max_abs: f64,
    /// Checkpoint with the largest `rel_l2`.
    pub worst_checkpoint: String,
}

/// Largest error at one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepProfile {
    /// Step.
    pub step: Step,
    /// Largest `rel_l2` at the step.
    pub max_rel_l2: f64,
    /// Largest `max_abs` at the step.
    pub max_abs: f64,
    /// Checkpoint with the largest `rel_l2`.
    pub worst_checkpoint: String,
    /// Number of divergent checkpoints at the step.
    pub divergent: u32,
}

/// Error profile along depth: per layer and step, and per step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorProfile {
    /// Per (stack, layer, step), in first-appearance (topological) order.
    pub by_layer: Vec<LayerProfile>,
    /// Per step, ascending.
    pub by_step: Vec<StepProfile>,
}

/// Aggregates per-node errors (`None` for nodes without metrics) into an [`ErrorProfile`].
pub fn error_profile(
    g: &CheckpointGraph,
    errors: &[Option<ErrorPoint>],
    status: &[Status],
) -> Result<ErrorProfile, Error> {
    per_node(g, &[errors.len(), status.len()])?;
    let mut layers: Vec<LayerProfile> = Vec::new();
    let mut layer_pos: HashMap<(String, u32, Step), usize> = HashMap::new();
    let mut steps: Vec<StepProfile> = Vec::new();
    let mut step_pos: HashMap<Step, usize> = HashMap::new();
    for (i, node) in g.nodes().iter().enumerate() {
        let sp = *step_pos.entry(node.step).or_insert_with(|| {
            steps.push(StepProfile {
                step: node.step,
                max_rel_l2: 0.0,
                max_abs: 0.0,
                worst_checkpoint: String::new(),
                divergent: 0,
            });
            steps.len() - 1
        });
        steps[sp].divergent += status[i].is_divergent() as u32;
        let Some(e) = errors[i] else { continue };
        let s = &mut steps[sp];
        if s.worst_checkpoint.is_empty() || e.rel_l2 > s.max_rel_l2 {
            s.max_rel_l2 = e.rel_l2;
            s.worst_checkpoint = node.name.clone();
        }
        s.max_abs = s.max_abs.max(e.max_abs);
        if let Some((stack, layer)) = &node.layer {
            let key = (stack.clone(), *layer, node.step);
            let lp = *layer_pos.entry(key).or_insert_with(|| {
                layers.push(LayerProfile {
                    stack: stack.clone(),
                    layer: *layer,
                    step: node.step,
                    max_rel_l2: 0.0,
                    max_abs: 0.0,
                    worst_checkpoint: String::new(),
                });
                layers.len() - 1
            });
            let l = &mut layers[lp];
            if l.worst_checkpoint.is_empty() || e.rel_l2 > l.max_rel_l2 {
                l.max_rel_l2 = e.rel_l2;
                l.worst_checkpoint = node.name.clone();
            }
            l.max_abs = l.max_abs.max(e.max_abs);
        }
    }
    steps.sort_by_key(|s| s.step);
    Ok(ErrorProfile {
        by_layer: layers,
        by_step: steps,
    })
}

/// First step whose logits disagree in argmax at any position (the first divergent token under
/// teacher forcing).
pub fn first_divergent_token_step<'a>(
    logits: impl IntoIterator<Item = (Step, &'a LogitsMetrics)>,
) -> Option<Step> {
    logits
        .into_iter()
        .filter(|(_, l)| l.first_argmax_disagreement.is_some())
        .map(|(s, _)| s)
        .min()
}

/// Drill-down from a divergent token step to checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillDown {
    /// Step K of the first divergent token.
    pub token_step: Step,
    /// First divergent checkpoint at step K (`name@stepK`).
    pub first_at_step: Option<String>,
    /// First divergent checkpoint at any step <= K.
    pub first_up_to_step: Option<String>,
    /// First origin or independent failure at a step <= K: the localized cause.
    pub cause_up_to_step: Option<String>,
}

/// Finds the first divergent checkpoints at and before `token_step`.
pub fn drill_down(g: &CheckpointGraph, loc: &Localization, token_step: Step) -> DrillDown {
    let nodes = g.nodes();
    let first = |pred: &dyn Fn(usize) -> bool| {
        (0..nodes.len())
            .find(|&i| pred(i) && loc.status.get(i).is_some_and(|s| s.is_divergent()))
            .map(|i| nodes[i].id())
    };
    DrillDown {
        token_step,
        first_at_step: first(&|i| nodes[i].step == token_step),
        first_up_to_step: first(&|i| nodes[i].step <= token_step),
        cause_up_to_step: first(&|i| {
            nodes[i].step <= token_step
                && matches!(loc.status.get(i), Some(Status::Origin | Status::Fail))
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A spec with only what the checkpoint graph reads (tests build small synthetic graphs).
    pub(crate) fn spec(
        name: &str,
        steps: Steps,
        inputs: Vec<(&str, StepRef)>,
        logits: bool,
        layer: Option<(&str, u32)>,
    ) -> CheckpointSpec {
        CheckpointSpec {
            kind: logits.then(|| "logits".to_string()),
            layer: layer.map(|(_, l)| l as usize),
            repeat: layer.map(|(r, _)| r.to_string()),
            ..CheckpointSpec::bare(name, steps, inputs)
        }
    }

    fn def(name: &str, step: Step, up: &[(&str, Step)]) -> NodeDef {
        NodeDef {
            name: name.into(),
            step,
            producer: format!("op.{name}"),
            upstream: up.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            layer: None,
            logits: false,
        }
    }

    /// A graph of step-0 nodes: each `(name, inputs)`, in declaration order.
    fn graph(nodes: &[(&str, &[&str])]) -> CheckpointGraph {
        let defs = nodes.iter().map(|(name, inputs)| {
            let up: Vec<(&str, Step)> = inputs.iter().map(|i| (*i, 0)).collect();
            def(name, 0, &up)
        });
        CheckpointGraph::from_nodes(defs.collect()).unwrap()
    }

    fn obs(g: &CheckpointGraph, failing: &[&str], missing: &[&str]) -> Vec<Observed> {
        g.nodes()
            .iter()
            .map(|n| {
                let id = n.id();
                if missing.contains(&id.as_str()) {
                    Observed::Missing
                } else if failing.contains(&id.as_str()) {
                    Observed::Fail
                } else {
                    Observed::Pass
                }
            })
            .collect()
    }

    fn status_of(g: &CheckpointGraph, l: &Localization, id: &str) -> Status {
        let i = g.nodes().iter().position(|n| n.id() == id).unwrap();
        l.status[i]
    }

    fn origin_id(g: &CheckpointGraph, l: &Localization) -> Option<String> {
        l.origin.map(|i| g.nodes()[i].id())
    }

    #[test]
    fn chain_origin_is_first_failure() {
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &["c"])]);
        let l = localize(&g, &obs(&g, &["c@step0", "d@step0"], &[])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("c@step0"));
        assert_eq!(status_of(&g, &l, "d@step0"), Status::Propagated);
        assert_eq!(l.propagated_from[3], vec![2]);
        let l = localize(&g, &obs(&g, &[], &[])).unwrap();
        assert_eq!(l.origin, None);
        assert!(l.status.iter().all(|s| *s == Status::Pass));
    }

    #[test]
    fn topological_order_ignores_declaration_order() {
        let g = graph(&[("c", &["b"]), ("b", &["a"]), ("a", &[])]);
        let names: Vec<_> = g.nodes().iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(g.nodes()[0].consumers, vec!["op.b".to_string()]);
    }

    #[test]
    fn graph_errors() {
        assert!(matches!(
            CheckpointGraph::from_nodes(vec![def("a", 0, &[("b", 0)]), def("b", 0, &[("a", 0)])]),
            Err(Error::Cycle { .. })
        ));
        assert!(matches!(
            CheckpointGraph::from_nodes(vec![def("a", 0, &[("zz", 0)])]),
            Err(Error::DanglingInput { .. })
        ));
        assert!(matches!(
            CheckpointGraph::from_nodes(vec![def("a", 0, &[]), def("a", 0, &[])]),
            Err(Error::DuplicateNode { .. })
        ));
        assert!(matches!(
            CheckpointGraph::from_nodes(vec![def("a", 1, &[]), def("b", 0, &[("a", 1)])]),
            Err(Error::ForwardInStep { .. })
        ));
        let g = CheckpointGraph::from_nodes(vec![def("a", 0, &[])]).unwrap();
        assert!(localize(&g, &[]).is_err());
    }

    /// Encoder memory feeds every decoder layer's cross K/V (fan-out).
    fn fan_out() -> CheckpointGraph {
        let mut d = vec![def("mem", 0, &[])];
        for l in 0..3 {
            d.push(def(&format!("k{l}"), 0, &[("mem", 0)]));
            d.push(def(&format!("v{l}"), 0, &[("mem", 0)]));
        }
        CheckpointGraph::from_nodes(d).unwrap()
    }

    #[test]
    fn fan_out_from_shared_memory() {
        let g = fan_out();
        let all: Vec<String> = g.nodes().iter().map(Node::id).collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let l = localize(&g, &obs(&g, &all, &[])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("mem@step0"));
        assert_eq!(
            l.status
                .iter()
                .filter(|s| **s == Status::Propagated)
                .count(),
            6
        );
        // Only one layer's K is wrong: that node is the origin, its siblings pass.
        let l = localize(&g, &obs(&g, &["k1@step0"], &[])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("k1@step0"));
    }

    #[test]
    fn fan_in_with_one_bad_branch() {
        let g = graph(&[
            ("x", &[]),
            ("left", &["x"]),
            ("right", &["x"]),
            ("join", &["left", "right"]),
            ("out", &["join"]),
        ]);
        let l = localize(
            &g,
            &obs(&g, &["right@step0", "join@step0", "out@step0"], &[]),
        )
        .unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("right@step0"));
        assert_eq!(status_of(&g, &l, "join@step0"), Status::Propagated);
        assert_eq!(status_of(&g, &l, "out@step0"), Status::Propagated);
        // Both branches pass but the join fails: the join's op is the origin.
        let l = localize(&g, &obs(&g, &["join@step0", "out@step0"], &[])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("join@step0"));
        // Two independent failures: the first is the origin, the second is "fail".
        let l = localize(
            &g,
            &obs(&g, &["left@step0", "right@step0", "join@step0"], &[]),
        )
        .unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("left@step0"));
        assert_eq!(status_of(&g, &l, "right@step0"), Status::Fail);
        assert_eq!(l.propagated_from[3], vec![1, 2]);
    }

    #[test]
    fn missing_and_alignment_faults_block_attribution() {
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &["a"])]);
        // A missing node whose inputs pass is the origin (keeping its status): never diverged
        // without a place to start.
        let l = localize(&g, &obs(&g, &["c@step0"], &["b@step0"])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("b@step0"));
        assert_eq!(status_of(&g, &l, "b@step0"), Status::Missing);
        assert_eq!(status_of(&g, &l, "c@step0"), Status::Propagated);
        assert_eq!(
            l.first_divergent.map(|i| g.nodes()[i].id()).as_deref(),
            Some("c@step0")
        );
        let mut o = obs(&g, &["c@step0"], &[]);
        o[1] = Observed::AlignmentFault;
        let l = localize(&g, &o).unwrap();
        assert_eq!(status_of(&g, &l, "b@step0"), Status::AlignmentFault);
        assert_eq!(origin_id(&g, &l).as_deref(), Some("b@step0"));
        assert_eq!(status_of(&g, &l, "c@step0"), Status::Propagated);
        // A failing node beside the missing one, later in order: an independent failure.
        let l = localize(&g, &obs(&g, &["c@step0", "d@step0"], &["b@step0"])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("b@step0"));
        assert_eq!(status_of(&g, &l, "d@step0"), Status::Fail);
        // Behind a failing node, a missing one is not the origin.
        let l = localize(&g, &obs(&g, &["a@step0"], &["b@step0"])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("a@step0"));
    }

    #[test]
    fn unobserved_nodes_are_transparent_and_fed_nodes_pass_for_consumers() {
        // mel -> conv -> l0 -> l1 -> mem -> logits; only mel, mem and logits observed.
        let g = graph(&[
            ("mel", &[]),
            ("conv", &["mel"]),
            ("l0", &["conv"]),
            ("l1", &["l0"]),
            ("mem", &["l1"]),
            ("logits", &["mem"]),
        ]);
        let with = |fail: &[&str]| {
            let mut o = obs(&g, fail, &[]);
            for x in &mut o[1..4] {
                *x = Observed::Unobserved;
            }
            o
        };
        // mem fails with mel passing: the origin, the gap before it is conv, l0, l1.
        let l = localize(&g, &with(&["mem@step0", "logits@step0"])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("mem@step0"));
        assert_eq!(status_of(&g, &l, "conv@step0"), Status::Unobserved);
        assert_eq!(status_of(&g, &l, "logits@step0"), Status::Propagated);
        assert_eq!(gap_before(&g, &l.status, 4), (vec![1, 2, 3], vec![0]));
        assert_eq!(gap_before(&g, &l.status, 5), (vec![], vec![4]));
        // mel fails: mem inherits through the unobserved nodes (propagated, not an origin).
        let l = localize(&g, &with(&["mel@step0", "mem@step0"])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("mel@step0"));
        assert_eq!(status_of(&g, &l, "mem@step0"), Status::Propagated);
        assert_eq!(l.propagated_from[4], vec![0]);
        // The reference's mel fed downstream: mem's failure is its own (independent).
        let mut fed = vec![false; g.len()];
        fed[0] = true;
        let l = localize_fed(&g, &with(&["mel@step0", "mem@step0"]), &fed).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("mel@step0"));
        assert_eq!(status_of(&g, &l, "mem@step0"), Status::Fail);
        assert!(localize_fed(&g, &with(&[]), &[]).is_err());
    }

    /// A tiny decoder: cache (prefill only), self (every, @previous), out (every).
    fn decoder_specs() -> Vec<CheckpointSpec> {
        let spec = |name: &str, steps, inputs| spec(name, steps, inputs, false, None);
        vec![
            spec("mem", Steps::Once, vec![]),
            spec("cache", Steps::Prefill, vec![("mem", StepRef::Same)]),
            spec("self", Steps::Every, vec![("self", StepRef::Previous)]),
            spec(
                "cross",
                Steps::Every,
                vec![("self", StepRef::Same), ("cache", StepRef::Prefill)],
            ),
            spec("logits", Steps::Every, vec![("cross", StepRef::Same)]),
        ]
    }

    #[test]
    fn multi_step_prefill_and_previous_edges() {
        let g = build_graph(&decoder_specs(), &[0, 1, 2, 3]).unwrap();
        assert_eq!(g.len(), 2 + 3 * 4);
        let cross2 = g.find("cross", 2).unwrap();
        let ups: Vec<String> = g.nodes()[cross2]
            .upstream
            .iter()
            .map(|&u| g.nodes()[u].id())
            .collect();
        assert_eq!(ups, ["self@step2", "cache@step0"]);
        let self0 = g.find("self", 0).unwrap();
        assert!(
            g.nodes()[self0].upstream.is_empty(),
            "@previous has no edge at step 0"
        );
        let self3 = g.find("self", 3).unwrap();
        assert_eq!(g.nodes()[self3].upstream, vec![g.find("self", 2).unwrap()]);
        // Step-major order.
        assert!(g.nodes().windows(2).all(|w| w[0].step <= w[1].step));

        // A fault planted in the self-attention at step 2 propagates along @previous.
        let fail = [
            "self@step2",
            "cross@step2",
            "logits@step2",
            "self@step3",
            "cross@step3",
            "logits@step3",
        ];
        let l = localize(&g, &obs(&g, &fail, &[])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("self@step2"));
        assert_eq!(status_of(&g, &l, "self@step3"), Status::Propagated);
        // A stale cache: fails at prefill, everything after is propagated through @prefill.
        let fail = [
            "cache@step0",
            "cross@step0",
            "cross@step1",
            "logits@step1",
            "cross@step3",
        ];
        let l = localize(&g, &obs(&g, &fail, &[])).unwrap();
        assert_eq!(origin_id(&g, &l).as_deref(), Some("cache@step0"));
        assert_eq!(status_of(&g, &l, "cross@step3"), Status::Propagated);

        // Drill-down from the first divergent token.
        let d = drill_down(&g, &l, 1);
        assert_eq!(d.first_at_step.as_deref(), Some("cross@step1"));
        assert_eq!(d.first_up_to_step.as_deref(), Some("cache@step0"));
        assert_eq!(d.cause_up_to_step.as_deref(), Some("cache@step0"));

        // A same-step reference to a step-0-only checkpoint resolves to step 0.
        let mut sp = decoder_specs();
        sp[4].inputs.push(("mem".into(), StepRef::Same));
        let g2 = build_graph(&sp, &[0, 1]).unwrap();
        let l1 = g2.find("logits", 1).unwrap();
        assert!(g2.nodes()[l1]
            .upstream
            .contains(&g2.find("mem", 0).unwrap()));

        // Non-contiguous steps drop @previous edges to absent steps.
        let g = build_graph(&decoder_specs(), &[0, 2]).unwrap();
        assert!(g.nodes()[g.find("self", 2).unwrap()].upstream.is_empty());
    }

    #[test]
    fn late_declared_input_sorts_before_its_consumer() {
        let specs = vec![
            spec(
                "enc.0",
                Steps::Once,
                vec![("stem", StepRef::Same)],
                false,
                None,
            ),
            spec(
                "mem",
                Steps::Once,
                vec![("enc.0", StepRef::Same)],
                false,
                None,
            ),
            spec("stem", Steps::Once, vec![], false, None),
            spec(
                "logits",
                Steps::Every,
                vec![("mem", StepRef::Prefill)],
                true,
                None,
            ),
        ];
        let g = build_graph(&specs, &[0, 1]).unwrap();
        assert!(g.find("stem", 0).unwrap() < g.find("enc.0", 0).unwrap());
        assert!(g.nodes()[g.find("logits", 1).unwrap()].logits);
        assert!(
            build_graph(&specs[..2], &[0]).is_err(),
            "an input naming no checkpoint"
        );
    }

    #[test]
    fn error_profile_per_layer_and_step() {
        let spec =
            |name: &str, layer: u32| spec(name, Steps::Every, vec![], false, Some(("dec", layer)));
        let g = build_graph(
            &[spec("l0.a", 0), spec("l0.b", 0), spec("l1.a", 1)],
            &[0, 1],
        )
        .unwrap();
        let errs: Vec<Option<ErrorPoint>> = (0..g.len())
            .map(|i| {
                (i != 5).then_some(ErrorPoint {
                    rel_l2: (i + 1) as f64 * 1e-6,
                    max_abs: 1e-5,
                })
            })
            .collect();
        let st = vec![
            Status::Pass,
            Status::Pass,
            Status::Pass,
            Status::Origin,
            Status::Propagated,
            Status::Missing,
        ];
        let p = error_profile(&g, &errs, &st).unwrap();
        assert_eq!(p.by_step.len(), 2);
        assert_eq!(p.by_step[1].divergent, 2);
        assert_eq!(p.by_step[1].worst_checkpoint, "l0.b");
        assert_eq!(p.by_layer.len(), 3, "no entry for a layer without metrics");
        assert_eq!((p.by_layer[0].layer, p.by_layer[0].step), (0, 0));
        assert_eq!(p.by_layer[0].worst_checkpoint, "l0.b");
    }

    #[test]
    fn first_divergent_token() {
        let mk = |d: Option<u64>| LogitsMetrics {
            positions: 1,
            argmax_agreement: if d.is_some() { 0.0 } else { 1.0 },
            first_argmax_disagreement: d,
            argmax_near_ties: 0,
            kl_undefined: 0,
            top5_overlap_mean: 1.0,
            top5_overlap_min: 5,
            kl_mean: 0.0,
            kl_max: 0.0,
            per_position: vec![],
        };
        let (a, b) = (mk(None), mk(Some(0)));
        assert_eq!(
            first_divergent_token_step([(0, &a), (3, &b), (2, &b)]),
            Some(2)
        );
        assert_eq!(first_divergent_token_step([(0, &a)]), None);
    }
}
