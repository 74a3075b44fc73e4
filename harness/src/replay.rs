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

#[cfg(feature = "oracle")]
use ndarray::ArrayD;
use xray_compare::mechanism::EngineOp;
#[cfg(feature = "oracle")]
use xray_compare::mechanism::{apply, ReplayBatch, ReplayContext, ReplayInput, Replayer};
#[cfg(feature = "oracle")]
use xray_compare::ops::OpDivergence;
#[cfg(feature = "oracle")]
use xray_compare::tolerance::{Policy, Precision};
#[cfg(feature = "oracle")]
use xray_core::contract::Contract;
#[cfg(feature = "oracle")]
use xray_core::dump::Dump;
#[cfg(feature = "oracle")]
use xray_core::ops::PointNode;
use xray_core::ops::{parse_point, Side};
#[cfg(feature = "oracle")]
use xray_core::replay::Counterfactual;
#[cfg(feature = "oracle")]
use xray_oracle::{Oracle, ReplayRequest};
use xray_runtime::graph::Graph;

/// What an `xray` built without the oracle says in place of replaying `module`.
pub fn not_built(module: &str) -> String {
    format!(
        "replay: this xray is built without the oracle feature; with it {module} would be re-run through the HF reference on the engine's own input, clearing or convicting the op and naming the counterfactual (transposed weight, missing bias, wrong epsilon, ...) that reproduces its output"
    )
}

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
/// (the output projection's input) and of that edge's observed inputs (the q / k / v
/// projections' outputs). A drill-down capturing them lets replay test an attention origin the
/// contract exposes as a checkpoint of its own (its probabilities or context).
pub fn attention_points(g: &Graph, op: &str) -> Option<Vec<String>> {
    let kernel = g.ops().iter().find(|o| o.name == op)?.kernel.kind();
    if !kernel.contains("attention") {
        return None;
    }
    let nodes = g.point_nodes();
    let (i, n) = nodes.iter().enumerate().find(|(_, n)| {
        n.ops.iter().any(|o| o == op)
            && n.names.iter().any(|p| {
                parse_point(p).is_some_and(|(m, s)| {
                    s == Side::In && (m.ends_with(".out_proj") || m.ends_with(".o_proj"))
                })
            })
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
#[allow(clippy::too_many_arguments)]
#[cfg(feature = "oracle")]
pub fn replay_origin(
    op: &mut OpDivergence,
    nodes: &[PointNode],
    reference: &Dump,
    candidate: &Dump,
    policy: &Policy,
    oracle: &Oracle,
    contract: &Contract,
    model_dir: &Path,
    graph: Option<&Graph>,
) -> Vec<String> {
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
    let step = op.step;
    let tolerance = |p: &str| {
        policy
            .resolve_kind(p, step, Precision::F32, None, false)
            .tolerance
    };
    let replayer = OracleReplayer {
        oracle,
        family: contract.family.clone(),
        contract: Arc::new(contract.resolved_json().to_string()),
        model_dir: model_dir.to_path_buf(),
    };
    let cx = ReplayContext {
        nodes,
        reference,
        candidate,
        replayer: &replayer,
        engine_op: &engine_op,
        tolerance: &tolerance,
        max_neighbours: 12,
        op_kernel: &op_kernel,
    };
    let ev = match op.side {
        Side::Out => cx.origin(op),
        Side::In => cx.weightless(op),
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
            let cleared = ev.local_error.verdict == xray_compare::mechanism::ReplayVerdict::Cleared;
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
#[cfg(feature = "oracle")]
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
        Attention | Elementwise => return None,
        Other => return None,
    })
}
