//! The graph is the spec: ops in a Vec, tensor edges declared once with producer, consumers, shape,
//! dtype and physical layout, checkpoint labels on edges, feeds as sources. It holds no weights
//! and no caches: weights are a [`Weights`] table passed to [`Graph::run`], caches are feeds.
//!
//! A formula is a choice of feeds and wanted outputs on the same graph: only the ops between them
//! run. Whisper's encode, prefill, decode-step and full-window formulas all run on one graph.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use xray_core::Step;

use serde::Serialize;

use crate::error::{Result, RuntimeError};
use crate::faults::FaultPlan;
use crate::weights::Weights;
use xray_core::capture::{Observer, Substitute};
use xray_core::contract::Contract;
use xray_core::ops::{module_of_weight_key, parse_point, point_name, PointNode, PointSelect, Side};

/// Index of an edge in its graph.
pub type EdgeId = usize;

pub use xray_core::{fmt_shape, Dim, Layout, Shape, Tensor};

/// Build a [`Shape`] from a mix of numbers and symbol names: `shape![tokens, 384]` is not valid
/// Rust, so write `shape!["tokens", 384]`.
#[macro_export]
macro_rules! shape {
    ($($d:expr),* $(,)?) => { vec![$($crate::graph::Dim::from($d)),*] };
}

/// The layout a kernel port requires or produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortLayout {
    /// Exactly this layout.
    Is(Layout),
    /// Layout-polymorphic: all `Same` ports of the op carry one layout (elementwise ops).
    Same,
}

/// A kernel port: its name and layout contract.
#[derive(Debug, Clone, Copy)]
pub struct Port {
    /// Port name (`x`, `q`, `k`, `v`, `y`...).
    pub name: &'static str,
    /// Layout contract.
    pub layout: PortLayout,
}

/// Shorthand for a port with a fixed layout.
pub const fn port(name: &'static str, layout: Layout) -> Port {
    Port {
        name,
        layout: PortLayout::Is(layout),
    }
}

/// Shorthand for a layout-polymorphic port.
pub const fn port_any(name: &'static str) -> Port {
    Port {
        name,
        layout: PortLayout::Same,
    }
}

/// Context a kernel gets at run time.
pub struct KernelCtx<'a> {
    /// The op's name.
    pub op: &'a str,
    /// The decode step.
    pub step: Step,
    /// Per weight role, the weight's exact f16 mirror when the table holds one and the kernel
    /// asked for it ([`Kernel::f16_weight_roles`]); see [`crate::weights::Weights::mirror_f16`].
    pub weights_f16: &'a [Option<&'a [u16]>],
}

impl KernelCtx<'_> {
    /// The exact f16 mirror of weight role `i`, if any.
    pub fn weight_f16(&self, i: usize) -> Option<&[u16]> {
        self.weights_f16.get(i).copied().flatten()
    }
}

/// What [`Kernel::run`] returns: the output tensors, one per output port, or why it could not
/// compute them (the executor names the op).
pub type KernelOut = std::result::Result<Vec<Tensor>, String>;

/// An op's computation. Kernels are pure: outputs depend on inputs, weights and parameters only.
pub trait Kernel: Send + Sync + fmt::Debug {
    /// Kind name (`linear`, `layer_norm`, `attention`...).
    fn kind(&self) -> &'static str;
    /// Input ports, in order.
    fn inputs(&self) -> Vec<Port>;
    /// Output ports, in order.
    fn outputs(&self) -> Vec<Port>;
    /// Weight roles, in order (matched to the op's weight refs).
    fn weight_roles(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// Infer output shapes from input shapes and weight shapes; `Err` says why they don't fit.
    fn infer(
        &self,
        inputs: &[Shape],
        weights: &[Vec<usize>],
    ) -> std::result::Result<Vec<Shape>, String>;
    /// Compute.
    fn run(&self, ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut;
    /// Parameters for the JSON export.
    fn params(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// A copy of this kernel with a parameter fault applied (`eps`, `scale`, `causal`, ...), or
    /// `None` when this kernel has no such parameter. This is the one seam for parameter faults.
    fn with_param_fault(&self, _fault: &crate::faults::ParamFault) -> Option<Box<dyn Kernel>> {
        None
    }
    /// Weight roles (indices) this kernel can read from an exact f16 mirror with the same result
    /// bits (see [`KernelCtx::weight_f16`]). Default: none.
    fn f16_weight_roles(&self) -> Vec<usize> {
        Vec::new()
    }
    /// The sides at which this kernel computes what the HF module its weights belong to computes
    /// (`nn.Linear`, `nn.LayerNorm`, `nn.Conv1d`: its first input and its output; an embedding:
    /// its output, as HF's positional embeddings take other arguments than the runtime's ids).
    /// These edges become op-level points (`xray_core::ops`). Default: none, so a kernel that
    /// fuses or reorders a module's work is never compared as if it were the module.
    fn points(&self) -> &'static [Side] {
        &[]
    }
    /// Whether the kernel only moves data: its one output is its one input in another declared
    /// layout (a head split or merge, a transpose). A drill-down exonerates such a suspect by
    /// checking its output against the layout transform of its input, computed independently.
    fn is_layout(&self) -> bool {
        false
    }
    /// The learned table the kernel reads, if any, as replay's counterfactuals on it see it (a
    /// positional table read rows off, never added, scaled). Default: none.
    fn table(&self) -> Option<LearnedTable> {
        None
    }
    /// The role of the weight the kernel convolves along time (its last axis the taps), if any:
    /// replay flips it (a convolution computed where the module computes a cross-correlation, a
    /// kernel stored in the other time order). Default: none.
    fn time_kernel(&self) -> Option<&'static str> {
        None
    }
}

/// A learned table a kernel reads ([`Kernel::table`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedTable {
    /// Its weight role.
    pub role: &'static str,
    /// Its rows (first axis) are positions: a row offset applies.
    pub positions: bool,
    /// It is added to the kernel's input: never added and scaled apply; with `positions`, its
    /// rows are the output's rows.
    pub added: bool,
}

/// A layout-only op ([`Kernel::is_layout`]): its edges and their layouts.
#[derive(Debug, Clone)]
pub struct LayoutOp {
    /// Op name.
    pub op: String,
    /// Input edge name.
    pub input: String,
    /// Output edge name.
    pub output: String,
    /// Input layout.
    pub from: Layout,
    /// Output layout.
    pub to: Layout,
}

/// A weight reference of an op: role, HF state-dict key, expected shape.
#[derive(Debug, Clone, Serialize)]
pub struct WeightRef {
    /// The kernel's role name for it.
    pub role: &'static str,
    /// HF state-dict key.
    pub key: String,
    /// Expected shape.
    pub shape: Vec<usize>,
}

/// An op instance.
#[derive(Debug)]
pub struct Op {
    /// Unique name (`decoder.layer.3.cross_attn`).
    pub name: String,
    /// The computation.
    pub kernel: Box<dyn Kernel>,
    /// Input edges, one per kernel input port.
    pub inputs: Vec<EdgeId>,
    /// Output edges, one per kernel output port.
    pub outputs: Vec<EdgeId>,
    /// Weights, one per kernel weight role.
    pub weights: Vec<WeightRef>,
    /// The HF module it mirrors when its weight keys do not name it (a tied weight: the logits
    /// read `embed_tokens.weight` as `proj_out`), set with [`GraphBuilder::hf_module`].
    pub module: Option<String>,
}

/// An endpoint of an edge: op and port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// Op name.
    pub op: String,
    /// Port name.
    pub port: String,
}

/// A declared tensor edge.
#[derive(Debug, Clone)]
pub struct Edge {
    /// Unique edge name.
    pub name: String,
    /// Producer (None for a feed).
    pub producer: Option<(usize, usize)>,
    /// Consumers: (op index, input port index).
    pub consumers: Vec<(usize, usize)>,
    /// Declared shape.
    pub shape: Shape,
    /// Declared layout.
    pub layout: Layout,
    /// Checkpoint label, if this edge is a checkpoint.
    pub checkpoint: Option<String>,
    /// Op-level point names (`model.encoder.layers.3.fc2:out`, ...), derived at build time from
    /// the ops that mirror an HF module ([`Kernel::points`]); the producer's `:out` first.
    pub points: Vec<String>,
}

/// Declaration of one output edge for [`GraphBuilder::op`].
#[derive(Debug, Clone)]
pub struct Out {
    /// Edge name; `None` = `{op}.{port}`.
    pub name: Option<String>,
    /// Declared shape.
    pub shape: Shape,
    /// Declared layout.
    pub layout: Layout,
}

impl Out {
    /// Output with the default name.
    pub fn new(shape: Shape, layout: Layout) -> Out {
        Out {
            name: None,
            shape,
            layout,
        }
    }
}

/// Builds and validates a [`Graph`].
pub struct GraphBuilder {
    family: String,
    ops: Vec<Op>,
    edges: Vec<Edge>,
    outputs: Vec<EdgeId>,
    allowed_unused: Vec<String>,
}

impl GraphBuilder {
    /// A new empty graph for a model family.
    pub fn new(family: &str) -> Self {
        GraphBuilder {
            family: family.to_string(),
            ops: Vec::new(),
            edges: Vec::new(),
            outputs: Vec::new(),
            allowed_unused: Vec::new(),
        }
    }

    fn new_edge(&mut self, name: String, shape: Shape, layout: Layout) -> Result<EdgeId> {
        if self.edges.iter().any(|e| e.name == name) {
            return Err(RuntimeError::Graph(format!("edge '{name}' declared twice")));
        }
        self.edges.push(Edge {
            name,
            producer: None,
            consumers: Vec::new(),
            shape,
            layout,
            checkpoint: None,
            points: Vec::new(),
        });
        Ok(self.edges.len() - 1)
    }

    /// Declare a feed (a source edge: audio, token ids, a cache).
    pub fn feed(&mut self, name: &str, shape: Shape, layout: Layout) -> Result<EdgeId> {
        self.new_edge(name.to_string(), shape, layout)
    }

    /// Add an op with declared outputs; returns the output edges.
    pub fn op(
        &mut self,
        name: &str,
        kernel: Box<dyn Kernel>,
        inputs: &[EdgeId],
        weights: &[(&str, Vec<usize>)],
        outputs: Vec<Out>,
    ) -> Result<Vec<EdgeId>> {
        if self.ops.iter().any(|o| o.name == name) {
            return Err(RuntimeError::Graph(format!("op '{name}' declared twice")));
        }
        let in_ports = kernel.inputs();
        let out_ports = kernel.outputs();
        let roles = kernel.weight_roles();
        // An arity mismatch names the op, its kernel and what it takes against what it got.
        let arity =
            |what: String| RuntimeError::Graph(format!("op '{name}' ({}) {what}", kernel.kind()));
        if in_ports.len() != inputs.len() {
            let (n, got) = (in_ports.len(), inputs.len());
            return Err(arity(format!("takes {n} inputs, {got} given")));
        }
        if out_ports.len() != outputs.len() {
            let (n, got) = (out_ports.len(), outputs.len());
            return Err(arity(format!("has {n} outputs, {got} declared")));
        }
        if roles.len() != weights.len() {
            return Err(arity(format!(
                "takes weights {roles:?}, {} given",
                weights.len()
            )));
        }
        for &e in inputs {
            if e >= self.edges.len() {
                return Err(RuntimeError::Graph(format!(
                    "op '{name}' reads unknown edge #{e}"
                )));
            }
        }
        let op_idx = self.ops.len();
        let mut out_ids = Vec::with_capacity(outputs.len());
        for (p, o) in out_ports.iter().zip(outputs) {
            let ename = o.name.unwrap_or_else(|| format!("{name}.{}", p.name));
            let id = self.new_edge(ename, o.shape, o.layout)?;
            self.edges[id].producer = Some((op_idx, out_ids.len()));
            out_ids.push(id);
        }
        for (i, &e) in inputs.iter().enumerate() {
            self.edges[e].consumers.push((op_idx, i));
        }
        let weights = roles
            .iter()
            .zip(weights)
            .map(|(role, (key, shape))| WeightRef {
                role,
                key: key.to_string(),
                shape: shape.clone(),
            })
            .collect();
        self.ops.push(Op {
            name: name.to_string(),
            kernel,
            inputs: inputs.to_vec(),
            outputs: out_ids.clone(),
            weights,
            module: None,
        });
        Ok(out_ids)
    }

    /// Add a single-output op; returns its output edge.
    pub fn op1(
        &mut self,
        name: &str,
        kernel: Box<dyn Kernel>,
        inputs: &[EdgeId],
        weights: &[(&str, Vec<usize>)],
        shape: Shape,
        layout: Layout,
    ) -> Result<EdgeId> {
        Ok(self.op(name, kernel, inputs, weights, vec![Out::new(shape, layout)])?[0])
    }

    /// Label an edge as a checkpoint.
    pub fn checkpoint(&mut self, edge: EdgeId, name: &str) -> Result<()> {
        if self
            .edges
            .iter()
            .any(|e| e.checkpoint.as_deref() == Some(name))
        {
            return Err(RuntimeError::Graph(format!(
                "checkpoint '{name}' labelled twice"
            )));
        }
        let e = self.edges.get_mut(edge).ok_or_else(|| {
            RuntimeError::Graph(format!("checkpoint '{name}' on unknown edge #{edge}"))
        })?;
        if e.checkpoint.is_some() {
            return Err(RuntimeError::Graph(format!(
                "edge '{}' already labelled",
                e.name
            )));
        }
        e.checkpoint = Some(name.to_string());
        Ok(())
    }

    /// Mark an edge as a graph output (a formula result such as logits or an updated cache).
    pub fn output(&mut self, edge: EdgeId) {
        if !self.outputs.contains(&edge) {
            self.outputs.push(edge);
        }
    }

    /// Weights in the file that the graph deliberately does not read (e.g. a tied duplicate).
    /// Each must be named; anything else unused is an error at bind time.
    pub fn allow_unused(&mut self, key: &str) {
        self.allowed_unused.push(key.to_string());
    }

    /// The HF module op `op` mirrors, where its weight keys name another (a tied weight).
    pub fn hf_module(&mut self, op: &str, module: &str) -> Result<()> {
        let o = self
            .ops
            .iter_mut()
            .find(|o| o.name == op)
            .ok_or_else(|| RuntimeError::Graph(format!("hf_module: no op named '{op}'")))?;
        o.module = Some(module.to_string());
        Ok(())
    }

    /// Name the op-level points: each op whose kernel mirrors an HF module ([`Kernel::points`])
    /// names its first input `{module}:in` and its output `{module}:out`, the module being the one
    /// its weight keys share (or [`GraphBuilder::hf_module`]'s). Weight keys of several modules
    /// are an error naming the op: such an op is not one module. A module that two ops mirror
    /// (a shared weight) names no point.
    fn name_points(&mut self) -> Result<()> {
        let mut named: Vec<(EdgeId, String)> = Vec::new();
        for op in &self.ops {
            let sides = op.kernel.points();
            if sides.is_empty() {
                continue;
            }
            let module = match &op.module {
                Some(m) => m.clone(),
                None => {
                    let mut mods = op.weights.iter().map(|w| module_of_weight_key(&w.key));
                    let first = mods.next().flatten().ok_or_else(|| {
                        RuntimeError::Graph(format!(
                            "op '{}' mirrors an HF module but has no weight key naming it",
                            op.name
                        ))
                    })?;
                    if let Some(other) = mods.find(|m| *m != Some(first)) {
                        return Err(RuntimeError::Graph(format!(
                            "op '{}' reads weights of modules '{first}' and '{}'; set its HF module",
                            op.name,
                            other.unwrap_or("")
                        )));
                    }
                    first.to_string()
                }
            };
            for &side in sides {
                let edge = match side {
                    Side::In => op.inputs.first(),
                    // A cache append's output: the cache after the call.
                    Side::Out | Side::Keys | Side::Values => op.outputs.first(),
                };
                if let Some(&e) = edge {
                    named.push((e, point_name(&module, side)));
                }
            }
        }
        // A module two ops mirror (a weight shared by two ops) names no point on either side:
        // which call a reference hook saw would be ambiguous, and one op's input is not the
        // other's (a tied head's input is no embedding's ids).
        let module = |n: &str| parse_point(n).map_or(String::new(), |(m, _)| m.to_string());
        let mut count: HashMap<String, usize> = HashMap::new();
        for (_, n) in &named {
            if n.ends_with(":out") {
                *count.entry(module(n)).or_default() += 1;
            }
        }
        let once: Vec<bool> = named
            .iter()
            .map(|(_, n)| count.get(&module(n)).copied().unwrap_or(0) <= 1)
            .collect();
        for ((e, name), once) in named.into_iter().zip(once) {
            if !once {
                continue;
            }
            // The producer's `:out` first, then the consumers' `:in`.
            let pts = &mut self.edges[e].points;
            if name.ends_with(":out") {
                pts.insert(0, name);
            } else {
                pts.push(name);
            }
        }
        Ok(())
    }

    /// Validate every edge and op, fail closed, and return the graph.
    pub fn build(mut self) -> Result<Graph> {
        self.name_points()?;
        let g = Graph {
            family: self.family,
            ops: self.ops,
            edges: self.edges,
            outputs: self.outputs,
            allowed_unused: self.allowed_unused,
        };
        g.validate()?;
        Ok(g)
    }
}

/// A validated graph.
#[derive(Debug)]
pub struct Graph {
    family: String,
    ops: Vec<Op>,
    edges: Vec<Edge>,
    outputs: Vec<EdgeId>,
    allowed_unused: Vec<String>,
}

/// Inputs of one run: edge name -> tensor.
pub type Feeds = HashMap<String, Tensor>;

/// Per-run options: step, capture, substitution (isolation), faults.
#[derive(Default)]
pub struct RunCtx<'a> {
    /// Decode step (0 = encoder + prefill).
    pub step: Step,
    /// Receives each checkpoint tensor as it is produced.
    pub observer: Option<&'a mut dyn Observer>,
    /// Substitutes a reference tensor at checkpoint edges before consumers run (isolation).
    pub substitute: Option<&'a dyn Substitute>,
    /// Deliberate faults (self-test).
    pub faults: Option<&'a FaultPlan>,
    /// Op-level points to hand to the observer (none by default).
    pub points: Option<&'a PointSelect>,
    /// Wall time of every op run, when set (`xray bench --profile`).
    pub profile: Option<&'a mut OpProfile>,
}

/// Wall time per op of the runs it was handed to ([`RunCtx::profile`]): what `xray bench
/// --profile` prints per op kind, and per GEMM shape as GFLOP/s.
#[derive(Debug, Default, Clone)]
pub struct OpProfile {
    /// One entry per op run, in execution order.
    pub runs: Vec<OpRun>,
}

/// One timed op run.
#[derive(Debug, Clone)]
pub struct OpRun {
    /// Op name (`enc.block.3.mlp.fc1`).
    pub op: String,
    /// Op kind (`linear`, `attention`, ...).
    pub kind: &'static str,
    /// Input shapes.
    pub inputs: Vec<Vec<usize>>,
    /// Weight shapes, in the kernel's weight-role order.
    pub weights: Vec<Vec<usize>>,
    /// Wall seconds of the kernel call.
    pub seconds: f64,
}

fn endpoint(g: &Graph, (op, port): (usize, usize), output: bool) -> String {
    let o = &g.ops[op];
    let ports = if output {
        o.kernel.outputs()
    } else {
        o.kernel.inputs()
    };
    let p = ports.get(port).map(|p| p.name).unwrap_or("?");
    format!("{}:{}", o.name, p)
}

impl Graph {
    /// Family name.
    pub fn family(&self) -> &str {
        &self.family
    }

    /// All ops in topological order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// All edges.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// Edge id by name.
    pub fn edge_id(&self, name: &str) -> Result<EdgeId> {
        self.edges
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| RuntimeError::Graph(format!("no edge named '{name}'")))
    }

    /// Edge id of a checkpoint label.
    pub fn checkpoint_edge(&self, checkpoint: &str) -> Option<EdgeId> {
        self.edges
            .iter()
            .position(|e| e.checkpoint.as_deref() == Some(checkpoint))
    }

    /// Checkpoint labels in topological order of their producers (feeds first).
    pub fn checkpoints(&self) -> Vec<(String, EdgeId)> {
        let mut v: Vec<(usize, String, EdgeId)> = self
            .edges
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                e.checkpoint
                    .as_ref()
                    .map(|c| (e.producer.map(|p| p.0 + 1).unwrap_or(0), c.clone(), i))
            })
            .collect();
        v.sort_by_key(|(o, _, i)| (*o, *i));
        v.into_iter().map(|(_, c, i)| (c, i)).collect()
    }

    /// Producer op name of an edge (`None` for a feed).
    pub fn producer_name(&self, edge: EdgeId) -> Option<&str> {
        self.edges[edge]
            .producer
            .map(|(o, _)| self.ops[o].name.as_str())
    }

    /// The ops that may hold a bug first seen at checkpoint `to`, given that the checkpoints (or
    /// op-level points) `after` are known good: every op `to` depends on that none of `after`
    /// upstream of `to` depends on (nor produces), in graph order. Follows the graph's edges, so weightless ops
    /// and ops without a checkpoint are included. A name that labels no edge is an error naming
    /// it.
    pub fn ops_between(&self, after: &[&str], to: &str) -> Result<Vec<String>> {
        let edge = |c: &str| {
            let point = || {
                self.edges
                    .iter()
                    .position(|e| e.points.iter().any(|p| p == c))
            };
            self.checkpoint_edge(c).or_else(point).ok_or_else(|| {
                RuntimeError::Graph(format!("'{c}' labels no edge of the {} graph", self.family))
            })
        };
        let ancestors = |start: EdgeId| -> Vec<bool> {
            let mut seen = vec![false; self.ops.len()];
            let mut stack: Vec<EdgeId> = vec![start];
            while let Some(e) = stack.pop() {
                if let Some((o, _)) = self.edges[e].producer {
                    if !seen[o] {
                        seen[o] = true;
                        stack.extend(self.ops[o].inputs.iter().copied());
                    }
                }
            }
            seen
        };
        let bad = ancestors(edge(to)?);
        // Only a good name upstream of `to` clears ops: one downstream of its producer (an
        // attention's context, when `to` is its probabilities) may agree while `to` does not.
        let upstream = |e: EdgeId| self.edges[e].producer.is_none_or(|(o, _)| bad[o]);
        let mut good = vec![false; self.ops.len()];
        for a in after {
            let e = edge(a)?;
            // `to` itself at an earlier step (state carried across steps, a feed here) and any
            // name not upstream of it bound nothing; nor does an output of an op with several
            // (an attention's probabilities agree while its context, which reads the values
            // they never read, may not: which inputs each output reads is not declared).
            let several = self.edges[e]
                .producer
                .is_some_and(|(o, _)| self.ops[o].outputs.len() > 1);
            if *a == to || !upstream(e) || several {
                continue;
            }
            for (o, g) in ancestors(e).into_iter().enumerate() {
                good[o] |= g;
            }
        }
        Ok(bad
            .into_iter()
            .enumerate()
            .filter(|(o, bad)| *bad && !good[*o])
            .map(|(o, _)| self.ops[o].name.clone())
            .collect())
    }

    /// The checkpoints and op-level points downstream of the ops `from`: for every edge one of
    /// them reaches (its own outputs included) along the graph's edges, each checkpoint label and
    /// point name of the edge with the first op of `from` (in graph order) it depends on. A name
    /// in `from` that is no op of the graph is an error naming it.
    pub fn reached_from(&self, from: &[&str]) -> Result<Vec<(String, String)>> {
        let mut declared = vec![false; self.ops.len()];
        for f in from {
            let i = self.ops.iter().position(|o| o.name == *f).ok_or_else(|| {
                RuntimeError::Graph(format!("'{f}' is no op of the {} graph", self.family))
            })?;
            declared[i] = true;
        }
        // Ops are stored in topological order (the builder adds an op after its inputs).
        let mut first: Vec<Option<usize>> = vec![None; self.edges.len()];
        for (i, op) in self.ops.iter().enumerate() {
            let mut r = op.inputs.iter().filter_map(|&e| first[e]).min();
            if declared[i] {
                r = Some(r.map_or(i, |x| x.min(i)));
            }
            for &e in &op.outputs {
                first[e] = r;
            }
        }
        let mut out = Vec::new();
        for (e, edge) in self.edges.iter().enumerate() {
            let Some(o) = first[e] else { continue };
            let op = &self.ops[o].name;
            for n in edge.checkpoint.iter().chain(&edge.points) {
                out.push((n.clone(), op.clone()));
            }
        }
        Ok(out)
    }

    /// Hand edge `e`'s op-level points that the run wants to the observer.
    fn observe_points(&self, ctx: &mut RunCtx, e: EdgeId, t: &Tensor) {
        let edge = &self.edges[e];
        let (Some(sel), Some(obs)) = (ctx.points, ctx.observer.as_deref_mut()) else {
            return;
        };
        for p in &edge.points {
            if sel.wants(p) && obs.wants(p, ctx.step) {
                obs.observe(p, ctx.step, edge.layout, t.view());
            }
        }
        // A runtime-internal edge asked for by name (a drill-down checking a layout op).
        if matches!(sel, PointSelect::Only(_))
            && sel.wants(&edge.name)
            && obs.wants(&edge.name, ctx.step)
        {
            obs.observe(&edge.name, ctx.step, edge.layout, t.view());
        }
    }

    /// The layout-only ops ([`Kernel::is_layout`]) among `names`, with their edges.
    pub fn layout_ops(&self, names: &[String]) -> Vec<LayoutOp> {
        self.ops
            .iter()
            .filter(|o| {
                o.kernel.is_layout()
                    && names.contains(&o.name)
                    && o.inputs.len() == 1
                    && o.outputs.len() == 1
            })
            .map(|o| {
                let (i, x) = (&self.edges[o.inputs[0]], &self.edges[o.outputs[0]]);
                LayoutOp {
                    op: o.name.clone(),
                    input: i.name.clone(),
                    output: x.name.clone(),
                    from: i.layout,
                    to: x.layout,
                }
            })
            .collect()
    }

    /// Every op-level point name with its edge, in graph order (feeds first, then by producer).
    pub fn point_edges(&self) -> Vec<(String, EdgeId)> {
        self.point_edge_ids()
            .into_iter()
            .flat_map(|e| self.edges[e].points.iter().map(move |p| (p.clone(), e)))
            .collect()
    }

    /// The edges that carry points, in graph order (feeds first, then by producer).
    fn point_edge_ids(&self) -> Vec<EdgeId> {
        let mut v: Vec<(usize, EdgeId)> = (0..self.edges.len())
            .filter(|&e| !self.edges[e].points.is_empty())
            .map(|e| (self.edges[e].producer.map_or(0, |p| p.0 + 1), e))
            .collect();
        v.sort();
        v.into_iter().map(|(_, e)| e).collect()
    }

    /// The observed-edge graph over the op-level points, in graph order: for each edge that
    /// carries points, the nearest point-carrying edges upstream and the ops in between (its
    /// producer included): what [`xray_core::ops::PointNode`] holds for localizing to an op.
    pub fn point_nodes(&self) -> Vec<PointNode> {
        let ids = self.point_edge_ids();
        let index: HashMap<EdgeId, usize> = ids.iter().enumerate().map(|(i, &e)| (e, i)).collect();
        ids.iter()
            .map(|&e| {
                let mut inputs = Vec::new();
                let mut ops = Vec::new();
                let mut stack: Vec<usize> =
                    self.edges[e].producer.map(|p| p.0).into_iter().collect();
                let mut seen = vec![false; self.ops.len()];
                while let Some(o) = stack.pop() {
                    if std::mem::replace(&mut seen[o], true) {
                        continue;
                    }
                    ops.push(o);
                    for &i in &self.ops[o].inputs {
                        match (index.get(&i), self.edges[i].producer) {
                            (Some(&n), _) => {
                                if !inputs.contains(&n) {
                                    inputs.push(n);
                                }
                            }
                            (None, Some((p, _))) => stack.push(p),
                            (None, None) => {}
                        }
                    }
                }
                ops.sort();
                inputs.sort();
                PointNode {
                    names: self.edges[e].points.clone(),
                    inputs,
                    ops: ops.into_iter().map(|o| self.ops[o].name.clone()).collect(),
                }
            })
            .collect()
    }

    /// The op-level points a drill-down captures to find the op behind a divergence first seen at
    /// checkpoint `to` with checkpoints `after` good: the first name of every point-carrying edge
    /// that an op of [`Graph::ops_between`] reads or writes, in graph order.
    pub fn points_between(&self, after: &[&str], to: &str) -> Result<Vec<String>> {
        let ops = self.ops_between(after, to)?;
        let mut edges: Vec<EdgeId> = Vec::new();
        for o in self.ops.iter().filter(|o| ops.contains(&o.name)) {
            edges.extend(o.inputs.iter().chain(&o.outputs).copied());
        }
        Ok(self
            .point_edge_ids()
            .into_iter()
            .filter(|e| edges.contains(e))
            .map(|e| self.edges[e].points[0].clone())
            .collect())
    }

    /// Consumer op names of an edge.
    pub fn consumer_names(&self, edge: EdgeId) -> Vec<String> {
        self.edges[edge]
            .consumers
            .iter()
            .map(|(o, _)| self.ops[*o].name.clone())
            .collect()
    }

    fn validate(&self) -> Result<()> {
        // Layouts: every edge's declared layout must equal the producer port's and every consumer
        // port's; polymorphic ports take one layout per op.
        for (oi, op) in self.ops.iter().enumerate() {
            let ins = op.kernel.inputs();
            let outs = op.kernel.outputs();
            let mut same: Option<(Layout, String)> = None;
            for (pi, (&e, p)) in op.inputs.iter().zip(&ins).enumerate() {
                let edge = &self.edges[e];
                let prod = match edge.producer {
                    Some(pp) => format!("{}/{}", endpoint(self, pp, true), edge.layout),
                    None => format!("feed:{}/{}", edge.name, edge.layout),
                };
                match p.layout {
                    PortLayout::Is(l) if l != edge.layout => {
                        return Err(RuntimeError::LayoutMismatch {
                            edge: edge.name.clone(),
                            producer: prod,
                            consumer: format!("{}/{}", endpoint(self, (oi, pi), false), l),
                        });
                    }
                    PortLayout::Same => match &same {
                        Some((l, first)) if *l != edge.layout => {
                            return Err(RuntimeError::LayoutMismatch {
                                edge: edge.name.clone(),
                                producer: prod,
                                consumer: format!(
                                    "{}/{} (op joins it with {first}/{l})",
                                    endpoint(self, (oi, pi), false),
                                    edge.layout
                                ),
                            });
                        }
                        None => same = Some((edge.layout, format!("{}:{}", op.name, p.name))),
                        _ => {}
                    },
                    _ => {}
                }
            }
            for (pi, (&e, p)) in op.outputs.iter().zip(&outs).enumerate() {
                let edge = &self.edges[e];
                let want = match p.layout {
                    PortLayout::Is(l) => Some(l),
                    PortLayout::Same => same.as_ref().map(|(l, _)| *l),
                };
                if let Some(l) = want {
                    if l != edge.layout {
                        return Err(RuntimeError::LayoutMismatch {
                            edge: edge.name.clone(),
                            producer: format!("{}/{}", endpoint(self, (oi, pi), true), l),
                            consumer: format!("edge declaration/{}", edge.layout),
                        });
                    }
                }
            }
            // Shapes: inference from declared input shapes and weight shapes must give the
            // declared output shapes.
            let in_shapes: Vec<Shape> = op
                .inputs
                .iter()
                .map(|&e| self.edges[e].shape.clone())
                .collect();
            let w_shapes: Vec<Vec<usize>> = op.weights.iter().map(|w| w.shape.clone()).collect();
            let inferred =
                op.kernel
                    .infer(&in_shapes, &w_shapes)
                    .map_err(|reason| RuntimeError::Op {
                        op: op.name.clone(),
                        reason: format!(
                            "inputs {} do not fit: {reason}",
                            op.inputs
                                .iter()
                                .map(|&e| format!(
                                    "{}{}",
                                    self.edges[e].name,
                                    fmt_shape(&self.edges[e].shape)
                                ))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    })?;
            for (&e, s) in op.outputs.iter().zip(&inferred) {
                let edge = &self.edges[e];
                if !shapes_agree(&edge.shape, s) {
                    return Err(RuntimeError::ShapeMismatch {
                        edge: edge.name.clone(),
                        declared: fmt_shape(&edge.shape),
                        context: format!("producer '{}' ({})", op.name, op.kernel.kind()),
                        found: fmt_shape(s),
                    });
                }
            }
        }
        for e in &self.edges {
            if e.producer.is_none() && e.consumers.is_empty() {
                return Err(RuntimeError::Graph(format!(
                    "feed '{}' has no consumer",
                    e.name
                )));
            }
        }
        Ok(())
    }

    /// Check a weight table against every op's weight refs. Missing key: error naming the key and
    /// the file; wrong shape: error with both shapes; unused keys: error unless allowed.
    pub fn check_weights(&self, w: &Weights) -> Result<()> {
        let mut used = std::collections::HashSet::new();
        for op in &self.ops {
            for r in &op.weights {
                let t = w.get(&r.key).ok_or_else(|| RuntimeError::MissingWeight {
                    key: r.key.clone(),
                    op: op.name.clone(),
                    file: w.path().to_path_buf(),
                })?;
                if t.shape() != r.shape.as_slice() {
                    return Err(RuntimeError::WeightShape {
                        key: r.key.clone(),
                        op: op.name.clone(),
                        file: w.path().to_path_buf(),
                        expected: r.shape.clone(),
                        found: t.shape().to_vec(),
                    });
                }
                used.insert(r.key.as_str());
            }
        }
        let mut unused: Vec<&str> = w
            .keys()
            .filter(|k| !used.contains(k) && !self.allowed_unused.iter().any(|a| a == k))
            .collect();
        unused.sort();
        if !unused.is_empty() {
            return Err(RuntimeError::UnusedWeights {
                file: w.path().to_path_buf(),
                count: unused.len(),
                keys: unused
                    .iter()
                    .take(8)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(())
    }

    /// Build exact f16 mirrors in `w` for every weight a kernel can read as f16
    /// ([`Kernel::f16_weight_roles`]) and whose values are all exactly f16 (a derived view of the
    /// state; the graph itself is unchanged). Returns (mirrored, candidates).
    pub fn mirror_f16_weights(&self, w: &mut Weights) -> (usize, usize) {
        let mut keys: Vec<&str> = Vec::new();
        for op in &self.ops {
            for i in op.kernel.f16_weight_roles() {
                if let Some(r) = op.weights.get(i) {
                    if !keys.contains(&r.key.as_str()) {
                        keys.push(&r.key);
                    }
                }
            }
        }
        (w.mirror_f16(keys.iter().copied()), keys.len())
    }

    /// Run a formula: compute `want` from `feeds`, running only the ops in between. Every
    /// produced tensor is checked against its edge's declared shape (symbols bind per run).
    pub fn run(
        &self,
        weights: &Weights,
        feeds: Feeds,
        want: &[EdgeId],
        ctx: &mut RunCtx,
    ) -> Result<Vec<Tensor>> {
        crate::kernels::in_pool(|| self.run_here(weights, feeds, want, ctx))
    }

    /// [`Graph::run`] on the calling thread.
    fn run_here(
        &self,
        weights: &Weights,
        mut feeds: Feeds,
        want: &[EdgeId],
        ctx: &mut RunCtx,
    ) -> Result<Vec<Tensor>> {
        let n = self.edges.len();
        let mut fed = vec![false; n];
        for name in feeds.keys() {
            let id = self.edge_id(name).map_err(|_| RuntimeError::Feed {
                edge: name.clone(),
                reason: "no such edge in the graph".into(),
            })?;
            fed[id] = true;
        }
        // Backward reachability from `want`, stopping at fed edges.
        let mut need_edge = vec![false; n];
        let mut need_op = vec![false; self.ops.len()];
        let mut stack: Vec<EdgeId> = want.to_vec();
        while let Some(e) = stack.pop() {
            if need_edge[e] {
                continue;
            }
            need_edge[e] = true;
            if fed[e] {
                continue;
            }
            match self.edges[e].producer {
                Some((o, _)) => {
                    if !need_op[o] {
                        need_op[o] = true;
                        stack.extend(self.ops[o].inputs.iter().copied());
                    }
                }
                None => {
                    return Err(RuntimeError::Feed {
                        edge: self.edges[e].name.clone(),
                        reason: "required by this formula but not fed".into(),
                    })
                }
            }
        }
        // Remaining consumer counts, to free edges early.
        let mut remaining = vec![0usize; n];
        for (oi, op) in self.ops.iter().enumerate() {
            if need_op[oi] {
                for &e in &op.inputs {
                    remaining[e] += 1;
                }
            }
        }
        for &e in want {
            remaining[e] += 1;
        }
        let mut syms: HashMap<String, usize> = HashMap::new();
        let mut values: Vec<Option<Tensor>> = (0..n).map(|_| None).collect();
        for (id, v) in values.iter_mut().enumerate() {
            if fed[id] && need_edge[id] {
                let t = feeds.remove(&self.edges[id].name).unwrap_or_default();
                // A fed edge that an op of the graph computes (the encoder memory fed to a decode
                // formula) is observed where it is computed, not again here; a source edge the
                // graph only ever receives (token ids, positions) is observed as fed.
                bind_shape(&self.edges[id], t.shape(), &mut syms, "feed")?;
                let source = self.edges[id].producer.is_none();
                if let (true, Some(cp), Some(obs)) = (
                    source,
                    &self.edges[id].checkpoint,
                    ctx.observer.as_deref_mut(),
                ) {
                    if obs.wants(cp, ctx.step) {
                        obs.observe(cp, ctx.step, self.edges[id].layout, t.view());
                    }
                }
                // Move a fed tensor in when it is already contiguous (a fed cache is not copied).
                *v = Some(if t.is_standard_layout() {
                    t
                } else {
                    t.as_standard_layout().into_owned()
                });
            }
        }
        for (oi, op) in self.ops.iter().enumerate() {
            if !need_op[oi] {
                continue;
            }
            let patched = ctx.faults.and_then(|f| f.patch_kernel(op));
            let kernel: &dyn Kernel = patched.as_deref().unwrap_or(op.kernel.as_ref());
            let ins: Vec<&Tensor> = op
                .inputs
                .iter()
                .map(|&e| values[e].as_ref())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    RuntimeError::Graph(format!("op '{}' input not computed", op.name))
                })?;
            let (keys, ws) = op_weights(op, ctx.faults, weights)?;
            let f16_roles = kernel.f16_weight_roles();
            let ws_f16: Vec<Option<&[u16]>> = (0..op.weights.len())
                .map(|i| {
                    if f16_roles.contains(&i) {
                        weights.f16(keys[i])
                    } else {
                        None
                    }
                })
                .collect();
            let kctx = KernelCtx {
                op: &op.name,
                step: ctx.step,
                weights_f16: &ws_f16,
            };
            let t0 = ctx.profile.is_some().then(std::time::Instant::now);
            let mut outs = kernel
                .run(&kctx, &ins, &ws)
                .map_err(|reason| RuntimeError::Op {
                    op: op.name.clone(),
                    reason,
                })?;
            if let (Some(p), Some(t0)) = (ctx.profile.as_deref_mut(), t0) {
                p.runs.push(OpRun {
                    op: op.name.clone(),
                    kind: kernel.kind(),
                    inputs: ins.iter().map(|t| t.shape().to_vec()).collect(),
                    weights: ws.iter().map(|t| t.shape().to_vec()).collect(),
                    seconds: t0.elapsed().as_secs_f64(),
                });
            }
            if outs.len() != op.outputs.len() {
                return Err(RuntimeError::Op {
                    op: op.name.clone(),
                    reason: format!(
                        "kernel returned {} outputs, {} declared",
                        outs.len(),
                        op.outputs.len()
                    ),
                });
            }
            for &e in &op.inputs {
                remaining[e] -= 1;
                if remaining[e] == 0 {
                    values[e] = None;
                }
            }
            for (pi, (&e, t)) in op.outputs.iter().zip(outs.iter_mut()).enumerate() {
                let edge = &self.edges[e];
                if let Some(f) = ctx.faults {
                    f.patch_output(op, pi, edge, ctx.step, t);
                }
                bind_shape(
                    edge,
                    t.shape(),
                    &mut syms,
                    &format!("op '{}' output", op.name),
                )?;
                self.observe_points(ctx, e, t);
                if let Some(cp) = &edge.checkpoint {
                    if let Some(obs) = ctx.observer.as_deref_mut() {
                        if obs.wants(cp, ctx.step) {
                            obs.observe(cp, ctx.step, edge.layout, t.view());
                        }
                    }
                    if let Some(sub) = ctx.substitute {
                        if let Some(r) = sub.substitute(cp, ctx.step) {
                            if r.shape() != t.shape() {
                                return Err(RuntimeError::ShapeMismatch {
                                    edge: edge.name.clone(),
                                    declared: format!("{:?}", t.shape()),
                                    context: format!(
                                        "substituted reference for {}",
                                        xray_core::key(cp, ctx.step)
                                    ),
                                    found: format!("{:?}", r.shape()),
                                });
                            }
                            *t = r;
                        }
                    }
                }
            }
            for (&e, t) in op.outputs.iter().zip(outs) {
                if remaining[e] > 0 {
                    values[e] = Some(t);
                }
            }
        }
        want.iter()
            .map(|&e| {
                values[e].take().ok_or_else(|| {
                    RuntimeError::Graph(format!(
                        "wanted edge '{}' not computed",
                        self.edges[e].name
                    ))
                })
            })
            .collect()
    }

    /// Export ops, edges, checkpoints and layouts as JSON (the harness walks divergence on it).
    pub fn to_json(&self) -> serde_json::Value {
        let ops: Vec<serde_json::Value> = self
            .ops
            .iter()
            .map(|o| {
                let ins = o.kernel.inputs();
                let outs = o.kernel.outputs();
                serde_json::json!({
                    "name": o.name,
                    "kind": o.kernel.kind(),
                    "params": o.kernel.params(),
                    "inputs": o.inputs.iter().zip(&ins).map(|(&e, p)| serde_json::json!({"port": p.name, "edge": self.edges[e].name})).collect::<Vec<_>>(),
                    "outputs": o.outputs.iter().zip(&outs).map(|(&e, p)| serde_json::json!({"port": p.name, "edge": self.edges[e].name})).collect::<Vec<_>>(),
                    "weights": o.weights,
                })
            })
            .collect();
        let edges: Vec<serde_json::Value> = self
            .edges
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name,
                    "producer": e.producer.map(|p| {
                        let ports = self.ops[p.0].kernel.outputs();
                        serde_json::json!({"op": self.ops[p.0].name, "port": ports.get(p.1).map(|x| x.name)})
                    }),
                    "consumers": e.consumers.iter().map(|&(o, p)| {
                        let ports = self.ops[o].kernel.inputs();
                        serde_json::json!({"op": self.ops[o].name, "port": ports.get(p).map(|x| x.name)})
                    }).collect::<Vec<_>>(),
                    "shape": e.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
                    "dtype": "f32",
                    "layout": e.layout,
                    "checkpoint": e.checkpoint,
                })
            })
            .collect();
        let checkpoints: BTreeMap<String, String> = self
            .checkpoints()
            .into_iter()
            .map(|(c, e)| (c, self.edges[e].name.clone()))
            .collect();
        serde_json::json!({
            "schema": "xray.graph/v1",
            "family": self.family,
            "ops": ops,
            "edges": edges,
            "outputs": self.outputs.iter().map(|&e| self.edges[e].name.clone()).collect::<Vec<_>>(),
            "checkpoints": checkpoints,
            "points": self.point_edges().into_iter().map(|(p, e)| (p, serde_json::Value::from(self.edges[e].name.clone()))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

/// Symbolic shape agreement: fixed dims equal; a symbol agrees with the same symbol.
fn shapes_agree(declared: &[Dim], inferred: &[Dim]) -> bool {
    declared.len() == inferred.len() && declared.iter().zip(inferred).all(|(a, b)| a == b)
}

/// Check a concrete shape against an edge's declared shape, binding symbols for this run.
pub(crate) fn bind_shape(
    edge: &Edge,
    got: &[usize],
    syms: &mut HashMap<String, usize>,
    ctx: &str,
) -> Result<()> {
    bind_dims(&edge.name, &edge.shape, got, syms, ctx)
}

/// `got` against the declared shape of edge `edge`, binding symbols (`tokens`) once per run; an
/// `a+b` symbol is checked when both parts are bound. A mismatch names the edge and `ctx`.
pub(crate) fn bind_dims(
    edge: &str,
    declared: &[Dim],
    got: &[usize],
    syms: &mut HashMap<String, usize>,
    ctx: &str,
) -> Result<()> {
    let mismatch = || RuntimeError::ShapeMismatch {
        edge: edge.to_string(),
        declared: fmt_shape(declared),
        context: ctx.to_string(),
        found: format!("{got:?}"),
    };
    if got.len() != declared.len() {
        return Err(mismatch());
    }
    for (d, &g) in declared.iter().zip(got) {
        match d {
            Dim::Fixed(n) if *n != g => return Err(mismatch()),
            Dim::Fixed(_) => {}
            Dim::Sym(s) => {
                if let Some((a, b)) = s.split_once('+') {
                    if let (Some(x), Some(y)) = (syms.get(a), syms.get(b)) {
                        if x + y != g {
                            return Err(mismatch());
                        }
                    }
                } else {
                    match syms.get(s) {
                        Some(&v) if v != g => return Err(mismatch()),
                        Some(_) => {}
                        None => {
                            syms.insert(s.clone(), g);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

impl Graph {
    /// Check this graph against a contract: every contract checkpoint labels an edge whose
    /// producer, layout and shape are the contract's, and the graph labels nothing the contract
    /// lacks.
    pub fn verify_contract(&self, contract: &Contract) -> Result<()> {
        let graph = self;
        let err = |reason: String| RuntimeError::Contract {
            family: contract.family.clone(),
            reason,
        };
        for c in &contract.checkpoints {
            let e = graph.checkpoint_edge(&c.name).ok_or_else(|| {
                err(format!(
                    "checkpoint '{}' is not labelled in the graph",
                    c.name
                ))
            })?;
            let edge = &graph.edges()[e];
            let feed = format!("feed:{}", edge.name);
            let prod = graph.producer_name(e).unwrap_or(&feed);
            if prod != c.producer {
                return Err(err(format!(
                    "checkpoint '{}': contract producer '{}', graph producer '{prod}'",
                    c.name, c.producer
                )));
            }
            if edge.layout != c.layout {
                return Err(err(format!(
                    "checkpoint '{}': contract layout {}, graph edge '{}' is {}",
                    c.name, c.layout, edge.name, edge.layout
                )));
            }
            let same = edge.shape.len() == c.shape.len()
                && edge.shape.iter().zip(&c.shape).all(|(g, k)| match (g, k) {
                    (Dim::Fixed(a), Dim::Fixed(b)) => a == b,
                    (Dim::Sym(a), Dim::Sym(b)) => a == b,
                    _ => false,
                });
            if !same {
                return Err(err(format!(
                    "checkpoint '{}': contract shape {:?}, graph edge '{}' is {}",
                    c.name,
                    c.shape,
                    edge.name,
                    fmt_shape(&edge.shape)
                )));
            }
        }
        for (name, _) in graph.checkpoints() {
            if contract.get(&name).is_none() {
                return Err(err(format!(
                    "graph checkpoint '{name}' is not in the contract"
                )));
            }
        }
        Ok(())
    }
}

/// The key each weight role of `op` reads (a wiring fault may name another) and its tensor; a
/// key the weights file lacks is an error naming it, the op and the file. The one lookup of both
/// [`Graph::run`] and [`Graph::run_op`].
pub(crate) fn op_weights<'a, 'w>(
    op: &'a Op,
    faults: Option<&'a FaultPlan>,
    weights: &'w Weights,
) -> Result<(Vec<&'a str>, Vec<&'w Tensor>)> {
    let keys: Vec<&str> = (op.weights.iter().enumerate())
        .map(|(i, r)| faults.and_then(|f| f.weight_key(op, i)).unwrap_or(&r.key))
        .collect();
    let ws: Vec<&Tensor> = keys
        .iter()
        .map(|&key| {
            weights.get(key).ok_or_else(|| RuntimeError::MissingWeight {
                key: key.to_string(),
                op: op.name.clone(),
                file: weights.path().to_path_buf(),
            })
        })
        .collect::<Result<_>>()?;
    Ok((keys, ws))
}
