//! Reference replay at the op-level origin (`xray check`, `xray compare --model DIR`): the HF
//! module the drill-down names is re-run by the oracle on the engine's own input
//! ([`xray_oracle::Oracle::replay`]), which clears or convicts the op and tests the mechanisms of
//! its kind (`xray_compare::mechanism`). This module adapts the oracle to the comparison
//! library's [`Replayer`] and the runtime graph to its engine-op lookup (the graph helpers, and
//! the note of an `xray` without the oracle, are in every build).
//!
//! [`Replayer`]: xray_compare::mechanism::Replayer

use std::collections::HashMap;
#[cfg(feature = "oracle")]
use std::path::{Path, PathBuf};
#[cfg(feature = "oracle")]
use std::sync::Arc;

use ndarray::ArrayD;
use xray_compare::mechanism::{
    apply, EngineOp, KernelReplayer, KernelRequest, KernelRun, LocalErrors, ReplayContext,
    ReplayVerdict, Replayer, SweptError,
};
#[cfg(feature = "oracle")]
use xray_compare::mechanism::{ReplayBatch, ReplayInput};
use xray_compare::ops::OpDivergence;
use xray_compare::tolerance::{Policy, Precision};
#[cfg(feature = "oracle")]
use xray_core::contract::Contract;
use xray_core::contract::{core_of, AttentionRule};
use xray_core::dump::Dump;
use xray_core::ops::PointNode;
use xray_core::ops::{parse_point, Side};
use xray_core::replay::{Counterfactual, RoundFormat};
use xray_core::Step;
#[cfg(feature = "oracle")]
use xray_oracle::{Oracle, ReplayRequest};
use xray_runtime::graph::{Graph, LearnedTable};
use xray_runtime::models::SpeechModel;
use xray_runtime::weights::Weights;

/// Why an `xray` built without the oracle re-runs no HF module.
pub const NOT_BUILT: &str = "this xray is built without the oracle feature: no HF module is re-run (weightless steps and regions the reference computes inline are replayed in Rust); with it the module would be re-run on the engine's own input, clearing or convicting the op and naming the counterfactual (transposed weight, missing bias, wrong epsilon, ...) that reproduces its output";

/// The oracle as a [`Replayer`] of one model.
#[cfg(feature = "oracle")]
pub struct OracleReplayer<'a> {
    /// The interpreter.
    pub oracle: &'a Oracle,
    /// The family (its loader builds the reference).
    pub family: String,
    /// Its contract resolved against the model's config (`Contract::resolved_json`): the point
    /// rules that declare the form and layout of every tensor the oracle is handed and returns.
    pub contract: Arc<String>,
    /// The reference model directory.
    pub model_dir: PathBuf,
}

#[cfg(feature = "oracle")]
impl<'a> OracleReplayer<'a> {
    /// The oracle as the replayer of the model in `model_dir`, its family's contract `contract`.
    pub fn new(oracle: &'a Oracle, contract: &Contract, model_dir: &Path) -> Self {
        OracleReplayer {
            oracle,
            family: contract.family.clone(),
            contract: Arc::new(contract.resolved_json().to_string()),
            model_dir: model_dir.to_path_buf(),
        }
    }
}

#[cfg(feature = "oracle")]
impl Replayer for OracleReplayer<'_> {
    fn replay(
        &self,
        module: &str,
        input: &ReplayInput<'_>,
        cfs: &[Counterfactual],
    ) -> Result<ReplayBatch, String> {
        let Some((first, rest)) = cfs.split_first() else {
            return Err("no counterfactual to replay".into());
        };
        let mut req = ReplayRequest::new(
            &self.family,
            self.contract.clone(),
            &self.model_dir,
            module,
            input.array.clone(),
            input.layout,
        );
        req.ids_from_rows = input.ids_from_rows;
        req.extra = input.extra.clone();
        req.counterfactual = first.clone();
        req.also = rest.to_vec();
        let r = self.oracle.replay(&req).map_err(|e| e.to_string())?;
        let layout = r.layout;
        let mut outs: Vec<Result<(ArrayD<f32>, _), String>> = vec![Ok((r.output, layout))];
        outs.extend(r.also.into_iter().map(|o| o.map(|a| (a, layout))));
        Ok((r.info, outs))
    }
}

/// The family's runtime graph and the reference model's weights as a [`KernelReplayer`]: the
/// ops of a region the reference computes inline, run through X-Ray's kernels
/// ([`Graph::module_spec`], [`Graph::run_module`]). A table-adding op's counterfactuals are
/// applied to a copy of its table.
pub struct GraphKernels<'a> {
    /// The family's graph.
    pub graph: &'a Graph,
    /// The reference model's weights (the ones its dump was computed with).
    pub weights: &'a Weights,
}

impl GraphKernels<'_> {
    /// The learned table op `op`'s kernel reads ([`Kernel::table`]) and its weight key.
    ///
    /// [`Kernel::table`]: xray_runtime::graph::Kernel::table
    fn table(&self, op: &str) -> Option<(LearnedTable, String)> {
        let o = self.graph.ops().iter().find(|o| o.name == op)?;
        let t = o.kernel.table()?;
        let key = o.weights.iter().find(|w| w.role == t.role)?.key.clone();
        Some((t, key))
    }

    /// The weight key of the kernel op `op` convolves along time ([`Kernel::time_kernel`]).
    ///
    /// [`Kernel::time_kernel`]: xray_runtime::graph::Kernel::time_kernel
    fn time_kernel(&self, op: &str) -> Option<String> {
        let o = self.graph.ops().iter().find(|o| o.name == op)?;
        let role = o.kernel.time_kernel()?;
        Some(o.weights.iter().find(|w| w.role == role)?.key.clone())
    }
}

impl KernelReplayer for GraphKernels<'_> {
    fn run(&self, req: &KernelRequest<'_>) -> Result<KernelRun, String> {
        let (g, ops, inputs, output) = (self.graph, req.ops, req.inputs, req.output);
        let mut keys: Vec<String> = Vec::new();
        for o in ops {
            let spec = g.op_spec(o).map_err(|e| e.to_string())?;
            keys.extend(spec.weights.into_iter().map(|w| w.key));
        }
        // The region's weights all sit under one module (their longest common prefix).
        let module = keys
            .iter()
            .map(|k| k.rsplit_once('.').map_or("", |x| x.0))
            .reduce(|a, b| {
                let n = a
                    .split('.')
                    .zip(b.split('.'))
                    .take_while(|(x, y)| x == y)
                    .map(|(x, _)| x.len() + 1)
                    .sum::<usize>();
                &a[..n.saturating_sub(1).min(a.len())]
            })
            .filter(|m| !m.is_empty())
            .unwrap_or("inline");
        let points: Vec<String> = inputs.iter().map(|(p, _, _)| p.to_string()).collect();
        let spec = g
            .module_spec(module, &points, output)
            .map_err(|e| e.to_string())?;
        let picked: Vec<&str> = spec.params["ops"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        if picked.len() != ops.len() || ops.iter().any(|o| !picked.contains(&o.as_str())) {
            return Err(format!(
                "the graph's ops from {} to {output} are {}, not the region's {}",
                points.join(", "),
                picked.join(", "),
                ops.join(", ")
            ));
        }
        let tensors: Vec<ArrayD<f32>> = inputs
            .iter()
            .zip(&spec.inputs)
            .map(|((p, t, l), port)| {
                xray_compare::align::to_canonical(t, *l, port.layout, None)
                    .map_err(|e| format!("{p}: {e}"))
            })
            .collect::<Result<_, String>>()?;
        let mut unjudged = None;
        let patched;
        let weights = match req.cf {
            None => self.weights,
            Some((op, cf)) => {
                // A kernel flipped in time, else a counterfactual on the op's table.
                let (key, t) = if matches!(cf, Counterfactual::KernelFlipped) {
                    let key = self
                        .time_kernel(op)
                        .ok_or_else(|| format!("{op} convolves no kernel along time"))?;
                    let mut t = self
                        .weights
                        .get(&key)
                        .ok_or_else(|| format!("the weights hold no {key}"))?
                        .view();
                    t.invert_axis(ndarray::Axis(t.ndim().saturating_sub(1)));
                    // A standard-layout copy: the kernels read weights as contiguous rows.
                    let t = t.as_standard_layout().into_owned();
                    (key, t)
                } else {
                    let (kind, key) = self
                        .table(op)
                        .ok_or_else(|| format!("{op} reads no table"))?;
                    let table = self
                        .weights
                        .get(&key)
                        .ok_or_else(|| format!("the weights hold no {key}"))?;
                    let rows = table.shape().first().copied().unwrap_or(0);
                    let mut t = table.clone();
                    match *cf {
                        Counterfactual::WeightMissing => t.fill(0.0),
                        Counterfactual::WeightScaled { factor } => {
                            t.mapv_inplace(|v| v * factor as f32)
                        }
                        Counterfactual::RowOffset { by } => {
                            let k = by.unsigned_abs() as usize;
                            if k == 0 || k >= rows {
                                return Err(format!("a table of {rows} rows read {by:+} rows off"));
                            }
                            use ndarray::{Axis, Slice};
                            let (dst, src, undefined) = if by > 0 {
                                (0..rows - k, k..rows, rows - k..rows)
                            } else {
                                (k..rows, 0..rows - k, 0..k)
                            };
                            t.slice_axis_mut(Axis(0), Slice::from(dst))
                                .assign(&table.slice_axis(Axis(0), Slice::from(src)));
                            // Rows past the table's end: not judged where they are the output's.
                            let op_out = g
                                .op_spec(op)
                                .ok()
                                .and_then(|s| s.outputs.into_iter().next());
                            if kind.added && op_out.is_some_and(|p| p.edge == spec.outputs[0].edge)
                            {
                                unjudged = Some((0, undefined.start, undefined.end));
                            }
                        }
                        _ => return Err(format!("{op}: {} is not applied here", cf.phrase())),
                    }
                    (key, t)
                };
                let mut m = std::collections::HashMap::new();
                for k in &keys {
                    if let Some(w) = self.weights.get(k) {
                        m.insert(k.clone(), w.clone());
                    }
                }
                m.insert(key, t);
                patched = Weights::from_map(&self.weights.path().to_string_lossy(), m);
                &patched
            }
        };
        let out = g
            .run_module(&spec, &tensors, weights, req.step, None)
            .map_err(|e| e.to_string())?;
        Ok(KernelRun {
            array: out,
            layout: spec.outputs[0].layout,
            unjudged,
        })
    }

    fn counterfactuals(&self, op: &str) -> Vec<Counterfactual> {
        // A kernel convolved along time flipped.
        let flipped = self.time_kernel(op).map(|_| Counterfactual::KernelFlipped);
        // Positions read rows off; a table added never added (its scale is solved from that
        // run: `ReplayContext::inline`).
        let Some((t, _)) = self.table(op) else {
            return flipped.into_iter().collect();
        };
        let mut v: Vec<Counterfactual> = [1i64, -1, 2, -2]
            .into_iter()
            .filter(|_| t.positions)
            .map(|by| Counterfactual::RowOffset { by })
            .collect();
        if t.added {
            v.push(Counterfactual::WeightMissing);
        }
        v.extend(flipped);
        v
    }
}

/// The runtime op (and its kernel kind) producing each module's `:out` point.
pub fn engine_ops(g: &Graph) -> HashMap<String, EngineOp> {
    let mut m = HashMap::new();
    for e in g.edges() {
        let Some((o, _)) = e.producer else { continue };
        for p in &e.points {
            if let Some((module, Side::Out)) = parse_point(p) {
                let op = &g.ops()[o];
                m.insert(
                    module.to_string(),
                    EngineOp {
                        op: Some(op.name.clone()),
                        kernel: Some(op.kernel.kind().to_string()),
                    },
                );
            }
        }
    }
    m
}

/// Whether runtime op `op` mirrors an HF module (its input and output are that module's
/// op-level points): replay can re-run it.
pub fn mirrors_module(g: &Graph, op: &str) -> bool {
    g.ops().iter().any(|o| {
        o.name == op
            && o.outputs.first().is_some_and(|&e| {
                g.edges()[e]
                    .points
                    .iter()
                    .any(|p| parse_point(p).is_some_and(|(_, s)| s == Side::Out))
            })
            && o.inputs.first().is_some_and(|&e| {
                g.edges()[e]
                    .points
                    .iter()
                    .any(|p| parse_point(p).is_some_and(|(_, s)| s == Side::In))
            })
    })
}

/// When runtime op `op` is an attention core (its kernel kind names attention), the op-level
/// points around it: the first name of the point-carrying edge it feeds through weightless ops
/// (the core's output point, as the contract's attention `rules` declare it: the output
/// projection's input) and of that edge's observed inputs (the q / k / v projections' outputs).
/// A drill-down capturing them lets replay test an attention origin the contract exposes as a
/// checkpoint of its own (its probabilities or context).
pub fn attention_points(g: &Graph, op: &str, rules: &[AttentionRule]) -> Option<Vec<String>> {
    let kernel = g.ops().iter().find(|o| o.name == op)?.kernel.kind();
    if !kernel.contains("attention") {
        return None;
    }
    let nodes = g.point_nodes();
    let (i, n) = nodes.iter().enumerate().find(|(_, n)| {
        n.ops.iter().any(|o| o == op) && n.names.iter().any(|p| core_of(rules, p).is_some())
    })?;
    let mut names: Vec<String> = n
        .inputs
        .iter()
        .map(|&u| nodes[u].names[0].clone())
        .collect();
    names.push(nodes[i].names[0].clone());
    Some(names)
}

/// Replays the op-level origin `op` (when it is a module's output: the module's own computation)
/// and records the evidence on it; a cleared op is no longer named. Returns the notes (the
/// console line first). Replay failures become a note, never an error of the check.
pub fn replay_origin(op: &mut OpDivergence, sides: &Sides<'_>) -> Vec<String> {
    sides.with_context(op.step, |cx| origin_notes(op, cx))
}

/// What a [`ReplayContext`] is built from: the points' graph, the two dumps, the policy (its f32
/// bounds judge a replay), the replayer and the model whose graph names the engine's ops.
pub struct Sides<'a> {
    /// The points' graph.
    pub nodes: &'a [PointNode],
    /// The reference dump.
    pub reference: &'a Dump,
    /// The engine's dump.
    pub candidate: &'a Dump,
    /// The tolerance policy.
    pub policy: &'a Policy,
    /// The replayer, or why there is none.
    pub replayer: Result<&'a dyn Replayer, &'a str>,
    /// X-Ray's model of the family (its graph's ops and kernels).
    pub model: Option<&'a dyn SpeechModel>,
    /// The contract's attention rules ([`ReplayContext::attention`]).
    pub attention: &'a [AttentionRule],
}

impl Sides<'_> {
    /// `f` on the replay context of `step` (points judged at the policy's f32 bounds there).
    pub fn with_context<R>(&self, step: Step, f: impl FnOnce(&ReplayContext<'_>) -> R) -> R {
        let graph = self.model.map(|m| m.graph());
        let ops = graph.map(engine_ops).unwrap_or_default();
        let kernels: HashMap<String, String> = graph
            .map(|g| {
                g.ops()
                    .iter()
                    .map(|o| (o.name.clone(), o.kernel.kind().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let op_kernel = |o: &str| kernels.get(o).cloned();
        let engine_op = |m: &str| ops.get(m).cloned().unwrap_or_default();
        let tolerance = |p: &str| {
            self.policy
                .resolve_kind(p, step, Precision::F32, None, false)
                .tolerance
        };
        let kernels = self.model.map(|m| GraphKernels {
            graph: m.graph(),
            weights: m.weights(),
        });
        let cx = ReplayContext {
            nodes: self.nodes,
            reference: self.reference,
            candidate: self.candidate,
            replayer: self.replayer,
            engine_op: &engine_op,
            tolerance: &tolerance,
            max_neighbours: 12,
            op_kernel: &op_kernel,
            kernels: kernels.as_ref().map(|k| k as &dyn KernelReplayer),
            attention: self.attention,
        };
        f(&cx)
    }

    /// Every module the engine's dump holds the `:out` of, at every step, re-run on the engine's
    /// own input and judged at f32 bounds ([`ReplayContext::sweep`]); `declared` maps an engine
    /// op to the precision its dump declares for it, which is replayed too. The convicted ones,
    /// and the counts.
    pub fn sweep(&self, declared: &dyn Fn(&str) -> Option<RoundFormat>) -> LocalErrors {
        let mut steps: Vec<Step> = self
            .candidate
            .manifest
            .checkpoints
            .iter()
            .filter(|e| parse_point(&e.name).is_some_and(|(_, s)| s == Side::Out))
            .map(|e| e.step)
            .collect();
        steps.sort_unstable();
        steps.dedup();
        let mut all = LocalErrors::default();
        for step in steps {
            let (les, skipped) = self.with_context(step, |cx| cx.sweep(step, declared));
            all.skipped += skipped;
            all.replayed += les.len() as u64;
            for (le, precision) in les {
                if le.verdict == ReplayVerdict::Convicted {
                    let declared = le
                        .op
                        .as_deref()
                        .and_then(declared)
                        .map(|f| f.as_str().to_string());
                    all.convicted.push(SweptError {
                        step,
                        declared,
                        local_error: le,
                        precision,
                        mechanism: None,
                    });
                }
            }
        }
        // Each module's worst step no declaration accounts for: what reproduces the engine's
        // output there.
        let mut worst: Vec<usize> = Vec::new();
        for (i, e) in all.convicted.iter().enumerate() {
            if !e.unaccounted() {
                continue;
            }
            let r = |k: usize| all.convicted[k].local_error.rel_l2.unwrap_or(f64::INFINITY);
            match worst
                .iter_mut()
                .find(|k| all.convicted[**k].local_error.module == e.local_error.module)
            {
                Some(k) if r(i) > r(*k) => *k = i,
                Some(_) => {}
                None => worst.push(i),
            }
        }
        for k in worst.into_iter().take(LocalErrors::EXPLAINED) {
            let (module, step) = (
                all.convicted[k].local_error.module.clone(),
                all.convicted[k].step,
            );
            let found = self.with_context(step, |cx| cx.module_evidence(&module, step));
            all.convicted[k].mechanism = found.ok().and_then(|ev| ev.mechanism);
        }
        all
    }
}

/// The replay at the op-level origin `op`, recorded on it: the notes (the console line first).
fn origin_notes(op: &mut OpDivergence, cx: &ReplayContext<'_>) -> Vec<String> {
    let ev = match op.side {
        Side::Out => cx.origin(op),
        // A weightless op's output (observed as a module's input, or a cache append's).
        Side::In | Side::Keys | Side::Values => cx.weightless(op),
    };
    match ev {
        Ok(ev) => {
            let mut notes = Vec::new();
            if let (Some(k), Some(expected)) = (ev.kernel.as_deref(), kernel_kind(ev.kind)) {
                if k != expected {
                    notes.push(format!(
                        "replay: the engine op is a {k} kernel, the reference module a {} ({expected})",
                        ev.class
                    ));
                }
            }
            let cleared = ev.local_error.verdict == ReplayVerdict::Cleared;
            let module = ev.module.clone();
            let line = apply(op, ev);
            notes.insert(0, line);
            if cleared {
                notes.push(format!(
                    "replay: {module} replayed on the engine's own input reproduces the engine's output: the op computes correctly and is not named; the difference arrives with its input (within tolerance there, amplified here)"
                ));
            }
            notes
        }
        Err(why) => vec![format!("replay: {} not replayed: {why}", op.module)],
    }
}

/// The runtime kernel kind that computes a module of this kind.
fn kernel_kind(k: xray_core::replay::ModuleKind) -> Option<&'static str> {
    use xray_core::replay::ModuleKind::*;
    Some(match k {
        Linear => "linear",
        Conv1d => "conv1d",
        LayerNorm => "layer_norm",
        RmsNorm => "rms_norm",
        BatchNorm => "batch_norm",
        Embedding => "embedding",
        ResidualAdd => "add",
        Attention | Elementwise | Inline => return None,
        Other => return None,
    })
}
