//! One op on its own: what a repro case (`xray repro`, `xray replay --runtime`) needs of the
//! runtime graph. [`Graph::op_spec`] describes an op (kernel kind and parameters, the HF module it
//! mirrors, its edges with their layouts, checkpoint labels and op-level points, its weight keys);
//! [`Graph::run_op`] runs that op's kernel alone on given inputs and a given weight table, through
//! the same fault seams as [`Graph::run`] (a patched or replaced kernel, a rewired weight key, a
//! corrupted output), so `--inject` plants a fault on a replayed op exactly as on a full run.

use std::collections::HashMap;
use xray_core::Step;

use serde::Serialize;

use crate::error::{Result, RuntimeError};
use crate::faults::FaultPlan;
use crate::graph::{
    bind_dims, bind_shape, Dim, EdgeId, Graph, Kernel, KernelCtx, Layout, Op, Shape, Tensor,
};
use crate::weights::Weights;
use xray_core::ops::module_of_weight_key;

/// One edge of an op as a repro case records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortSpec {
    /// The kernel's port name (`x`, `y`).
    pub port: String,
    /// The graph edge.
    pub edge: String,
    /// Its declared layout.
    pub layout: Layout,
    /// Its declared shape (symbols by name).
    pub shape: Vec<String>,
    /// Its checkpoint label, if any.
    pub checkpoint: Option<String>,
    /// The op-level points it carries (aliases of one tensor).
    pub points: Vec<String>,
}

/// One weight of an op.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightSpec {
    /// The kernel's role (`weight`, `bias`).
    pub role: String,
    /// The safetensors key.
    pub key: String,
    /// The shape the graph declares.
    pub shape: Vec<usize>,
}

/// What the runtime graph knows about one op.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpSpec {
    /// Op name (`encoder.layer.1.mlp_norm`).
    pub name: String,
    /// Kernel kind (`layer_norm`).
    pub kind: String,
    /// Kernel parameters (as `xray list --json` exports them).
    pub params: serde_json::Value,
    /// The HF module it mirrors: the module its weight keys share (or the one set for a tied
    /// weight); `None` for a weightless op or one reading several modules' weights.
    pub module: Option<String>,
    /// Input edges, one per port.
    pub inputs: Vec<PortSpec>,
    /// Output edges, one per port.
    pub outputs: Vec<PortSpec>,
    /// Weights, one per role.
    pub weights: Vec<WeightSpec>,
}

fn hf_module(op: &Op) -> Option<String> {
    if let Some(m) = &op.module {
        return Some(m.clone());
    }
    let mut mods = op.weights.iter().map(|w| module_of_weight_key(&w.key));
    let first = mods.next().flatten()?;
    mods.all(|m| m == Some(first)).then(|| first.to_string())
}

impl Graph {
    /// Edge `e` as a repro case records it, seen from the port named `port` (an op's kernel port,
    /// or a module case's `input.{i}` / `output`).
    fn port_spec(&self, e: EdgeId, port: String) -> PortSpec {
        let edge = &self.edges()[e];
        PortSpec {
            port,
            edge: edge.name.clone(),
            layout: edge.layout,
            shape: edge.shape.iter().map(|d| d.to_string()).collect(),
            checkpoint: edge.checkpoint.clone(),
            points: edge.points.clone(),
        }
    }

    fn op_index(&self, name: &str) -> Result<usize> {
        self.ops()
            .iter()
            .position(|o| o.name == name)
            .ok_or_else(|| {
                RuntimeError::Graph(format!(
                    "no op named '{name}' in the {} graph",
                    self.family()
                ))
            })
    }

    /// The op producing the edge that carries op-level point `point`, if any.
    pub fn producer_of_point(&self, point: &str) -> Option<&str> {
        let e = self
            .edges()
            .iter()
            .position(|e| e.points.iter().any(|p| p == point))?;
        self.producer_name(e)
    }

    /// What the graph knows about op `name` (an error names an unknown op).
    pub fn op_spec(&self, name: &str) -> Result<OpSpec> {
        let op = &self.ops()[self.op_index(name)?];
        let ins = op.kernel.inputs();
        let outs = op.kernel.outputs();
        Ok(OpSpec {
            name: op.name.clone(),
            kind: op.kernel.kind().to_string(),
            params: op.kernel.params(),
            module: hf_module(op),
            inputs: op
                .inputs
                .iter()
                .zip(&ins)
                .map(|(&e, p)| self.port_spec(e, p.name.to_string()))
                .collect(),
            outputs: op
                .outputs
                .iter()
                .zip(&outs)
                .map(|(&e, p)| self.port_spec(e, p.name.to_string()))
                .collect(),
            weights: op
                .weights
                .iter()
                .map(|w| WeightSpec {
                    role: w.role.to_string(),
                    key: w.key.clone(),
                    shape: w.shape.clone(),
                })
                .collect(),
        })
    }

    /// Runs op `name`'s kernel alone at `step` on `inputs` (one per input port, in the edges'
    /// declared layouts) and the weights of `weights` (looked up by the op's keys), with `faults`
    /// planted through the seams [`Graph::run`] uses. Every shape is checked before the kernel
    /// runs (inputs against the edges' declared shapes, weights against the op's declared
    /// shapes, both through the kernel's own shape rule), so a mismatched input is an error naming
    /// it, never a kernel panic. Returns the outputs, one per output port.
    pub fn run_op(
        &self,
        name: &str,
        inputs: &[Tensor],
        weights: &Weights,
        step: Step,
        faults: Option<&FaultPlan>,
    ) -> Result<Vec<Tensor>> {
        let op = &self.ops()[self.op_index(name)?];
        let err = |reason: String| RuntimeError::Op {
            op: op.name.clone(),
            reason,
        };
        if inputs.len() != op.inputs.len() {
            return Err(err(format!(
                "takes {} input(s), {} given",
                op.inputs.len(),
                inputs.len()
            )));
        }
        let mut syms: HashMap<String, usize> = HashMap::new();
        for (&e, t) in op.inputs.iter().zip(inputs) {
            bind_shape(&self.edges()[e], t.shape(), &mut syms, "the replayed input")?;
        }
        let patched = faults.and_then(|f| f.patch_kernel(op));
        let kernel: &dyn Kernel = patched.as_deref().unwrap_or(op.kernel.as_ref());
        let (keys, ws) = crate::graph::op_weights(op, faults, weights)?;
        for ((r, &key), w) in op.weights.iter().zip(&keys).zip(&ws) {
            if w.shape() != r.shape.as_slice() {
                return Err(RuntimeError::WeightShape {
                    key: key.to_string(),
                    op: op.name.clone(),
                    file: weights.path().to_path_buf(),
                    expected: r.shape.clone(),
                    found: w.shape().to_vec(),
                });
            }
        }
        let in_shapes: Vec<Shape> = inputs
            .iter()
            .map(|t| t.shape().iter().map(|&n| Dim::Fixed(n)).collect())
            .collect();
        let w_shapes: Vec<Vec<usize>> = ws.iter().map(|w| w.shape().to_vec()).collect();
        let inferred = kernel
            .infer(&in_shapes, &w_shapes)
            .map_err(|r| err(format!("inputs do not fit: {r}")))?;
        let ins: Vec<&Tensor> = inputs.iter().collect();
        let kctx = KernelCtx {
            op: &op.name,
            step,
            weights_f16: &[],
        };
        let mut outs = crate::kernels::in_pool(|| kernel.run(&kctx, &ins, &ws)).map_err(err)?;
        if outs.len() != op.outputs.len() {
            return Err(err(format!(
                "kernel returned {} outputs, {} declared",
                outs.len(),
                op.outputs.len()
            )));
        }
        for (pi, ((&e, t), want)) in op
            .outputs
            .iter()
            .zip(outs.iter_mut())
            .zip(&inferred)
            .enumerate()
        {
            let edge = &self.edges()[e];
            if let Some(f) = faults {
                f.patch_output(op, pi, edge, step, t);
            }
            let what = "the replayed output";
            bind_dims(&edge.name, want, t.shape(), &mut HashMap::new(), what)?;
            bind_shape(edge, t.shape(), &mut syms, what)?;
        }
        Ok(outs)
    }
}

/// The kernel kind of a module case ([`Graph::module_spec`]): several ops, one HF module.
pub const MODULE_KIND: &str = "module";

impl Graph {
    /// A whole HF module as one case op: the ops that compute `output_point` from the edges
    /// carrying `input_points` (the module's boundaries, e.g. `model.encoder.conv1:in` and
    /// `model.encoder.layer_norm:out` for `model.encoder`), in graph order, with every weight they
    /// read (each under `module`: role = the key after `module.`). Kind [`MODULE_KIND`], params
    /// `{"ops": [...]}`. An error names what does not fit: a point no edge carries, an op of the
    /// region reading a feed or an edge outside it, a weight of another module, an input the
    /// region never reads.
    pub fn module_spec(
        &self,
        module: &str,
        input_points: &[String],
        output_point: &str,
    ) -> Result<OpSpec> {
        let edge_of = |p: &str| {
            self.edges()
                .iter()
                .position(|e| e.points.iter().any(|x| x == p))
                .ok_or_else(|| {
                    RuntimeError::Graph(format!(
                        "module {module}: no edge of the {} graph carries op-level point {p}",
                        self.family()
                    ))
                })
        };
        let ins: Vec<usize> = input_points
            .iter()
            .map(|p| edge_of(p))
            .collect::<Result<_>>()?;
        let out = edge_of(output_point)?;
        let mut picked = vec![false; self.ops().len()];
        let mut used = vec![false; ins.len()];
        let mut stack: Vec<usize> = vec![out];
        let mut seen = std::collections::HashSet::new();
        while let Some(e) = stack.pop() {
            if !seen.insert(e) {
                continue;
            }
            if let Some(i) = ins.iter().position(|&x| x == e) {
                used[i] = true;
                continue;
            }
            let Some((o, _)) = self.edges()[e].producer else {
                return Err(RuntimeError::Graph(format!(
                    "module {module}: edge '{}' is a feed the ops from {} to {output_point} read: not one module's closed computation",
                    self.edges()[e].name,
                    input_points.join(", ")
                )));
            };
            if !picked[o] {
                picked[o] = true;
                stack.extend(self.ops()[o].inputs.iter().copied());
            }
        }
        if let Some(i) = used.iter().position(|u| !u) {
            return Err(RuntimeError::Graph(format!(
                "module {module}: {output_point} does not depend on {}",
                input_points[i]
            )));
        }
        let ops: Vec<&Op> = self
            .ops()
            .iter()
            .enumerate()
            .filter(|(i, _)| picked[*i])
            .map(|(_, o)| o)
            .collect();
        let mut weights: Vec<WeightSpec> = Vec::new();
        for o in &ops {
            for w in &o.weights {
                let Some(role) = w.key.strip_prefix(&format!("{module}.")) else {
                    return Err(RuntimeError::Graph(format!(
                        "module {module}: op {} reads weight {}, which is not {module}'s",
                        o.name, w.key
                    )));
                };
                if !weights.iter().any(|x| x.key == w.key) {
                    weights.push(WeightSpec {
                        role: role.to_string(),
                        key: w.key.clone(),
                        shape: w.shape.clone(),
                    });
                }
            }
        }
        Ok(OpSpec {
            name: module.to_string(),
            kind: MODULE_KIND.to_string(),
            params: serde_json::json!({"ops": ops.iter().map(|o| o.name.as_str()).collect::<Vec<_>>()}),
            module: Some(module.to_string()),
            inputs: ins
                .iter()
                .enumerate()
                .map(|(i, &e)| self.port_spec(e, format!("input.{i}")))
                .collect(),
            outputs: vec![self.port_spec(out, "output".to_string())],
            weights,
        })
    }

    /// Runs a module case's ops ([`Graph::module_spec`]) in graph order, each alone through
    /// [`Graph::run_op`] (so `faults` plant exactly as on a full run), from `inputs` (one per
    /// input edge of `spec`) to its output edge.
    pub fn run_module(
        &self,
        spec: &OpSpec,
        inputs: &[Tensor],
        weights: &Weights,
        step: Step,
        faults: Option<&FaultPlan>,
    ) -> Result<Tensor> {
        let names: Vec<String> = spec.params["ops"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if spec.kind != MODULE_KIND || names.is_empty() {
            return Err(RuntimeError::Graph(format!(
                "{}: not a module spec (kind {}, {} ops)",
                spec.name,
                spec.kind,
                names.len()
            )));
        }
        if inputs.len() != spec.inputs.len() {
            return Err(RuntimeError::Graph(format!(
                "module {}: takes {} input(s), {} given",
                spec.name,
                spec.inputs.len(),
                inputs.len()
            )));
        }
        let mut have: HashMap<usize, Tensor> = HashMap::new();
        for (p, t) in spec.inputs.iter().zip(inputs) {
            have.insert(self.edge_id(&p.edge)?, t.clone());
        }
        // How many ops still read each edge: a tensor is dropped after its last reader.
        let mut readers: HashMap<usize, usize> = HashMap::new();
        let idx: Vec<usize> = names
            .iter()
            .map(|n| self.op_index(n))
            .collect::<Result<_>>()?;
        for &o in &idx {
            for &e in &self.ops()[o].inputs {
                *readers.entry(e).or_default() += 1;
            }
        }
        let out = self.edge_id(&spec.outputs[0].edge)?;
        for &o in &idx {
            let op = &self.ops()[o];
            let ins: Vec<Tensor> = op
                .inputs
                .iter()
                .map(|e| {
                    have.get(e).cloned().ok_or_else(|| RuntimeError::Op {
                        op: op.name.clone(),
                        reason: format!(
                            "reads edge '{}', which module {} neither takes nor computes before it",
                            self.edges()[*e].name,
                            spec.name
                        ),
                    })
                })
                .collect::<Result<_>>()?;
            let outs = self.run_op(&op.name, &ins, weights, step, faults)?;
            for e in &op.inputs {
                if let Some(n) = readers.get_mut(e) {
                    *n -= 1;
                    if *n == 0 && *e != out {
                        have.remove(e);
                    }
                }
            }
            for (&e, t) in op.outputs.iter().zip(outs) {
                have.insert(e, t);
            }
        }
        have.remove(&out).ok_or_else(|| {
            RuntimeError::Graph(format!(
                "module {}: its ops never computed '{}'",
                spec.name, spec.outputs[0].edge
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{FaultKind, KernelFault, ParamFault, Planted};
    use crate::graph::GraphBuilder;
    use crate::kernels::{LayerNorm, Linear, MatmulStrategy};
    use crate::shape;

    fn graph() -> Graph {
        let mut b = GraphBuilder::new("test");
        let x = b.feed("x", shape!["rows", 4], Layout::TokenMajor).unwrap();
        let n = b
            .op1(
                "l.norm",
                Box::new(LayerNorm::new(1e-5)),
                &[x],
                &[("m.norm.weight", vec![4]), ("m.norm.bias", vec![4])],
                shape!["rows", 4],
                Layout::TokenMajor,
            )
            .unwrap();
        let y = b
            .op1(
                "l.fc",
                Box::new(Linear::new(true, MatmulStrategy::RowStable)),
                &[n],
                &[("m.fc.weight", vec![2, 4]), ("m.fc.bias", vec![2])],
                shape!["rows", 2],
                Layout::TokenMajor,
            )
            .unwrap();
        b.checkpoint(y, "out").unwrap();
        b.output(y);
        b.build().unwrap()
    }

    fn weights() -> Weights {
        let t = |s: &[usize], v: Vec<f32>| Tensor::from_shape_vec(s.to_vec(), v).unwrap();
        let mut m = HashMap::new();
        m.insert("m.norm.weight".into(), t(&[4], vec![1.0, 0.5, 2.0, -1.0]));
        m.insert("m.norm.bias".into(), t(&[4], vec![0.1, 0.0, -0.2, 0.3]));
        m.insert(
            "m.fc.weight".into(),
            t(&[2, 4], vec![1.0, 0.0, -1.0, 0.5, 0.2, 0.3, 0.4, 0.5]),
        );
        m.insert("m.fc.bias".into(), t(&[2], vec![0.5, -0.5]));
        Weights::from_map("<test>", m)
    }

    fn x() -> Tensor {
        Tensor::from_shape_vec(vec![2, 4], vec![1.0, 2.0, 4.0, 8.0, -3.0, 0.5, 0.25, 2.0]).unwrap()
    }

    /// One op alone gives what the whole graph gives on the same input, bit for bit; the spec
    /// names the module, the edges and the points.
    #[test]
    fn one_op_equals_the_graph_run() {
        let g = graph();
        let w = weights();
        let n = g.run_op("l.norm", &[x()], &w, 0, None).unwrap();
        let y = g.run_op("l.fc", &n, &w, 0, None).unwrap();
        let mut feeds = HashMap::new();
        feeds.insert("x".to_string(), x());
        let want = g
            .run(
                &w,
                feeds,
                &[g.checkpoint_edge("out").unwrap()],
                &mut Default::default(),
            )
            .unwrap();
        assert_eq!(y[0], want[0]);
        let s = g.op_spec("l.fc").unwrap();
        assert_eq!(s.kind, "linear");
        assert_eq!(s.module.as_deref(), Some("m.fc"));
        assert_eq!(s.inputs[0].points, vec!["m.norm:out", "m.fc:in"]);
        assert_eq!(s.outputs[0].checkpoint.as_deref(), Some("out"));
        assert_eq!(g.producer_of_point("m.fc:in"), Some("l.norm"));
        assert!(g.op_spec("nope").is_err());
    }

    /// A module of two ops equals the graph run; a region that reads a feed it is not given, or
    /// a point no edge carries, is refused naming it.
    #[test]
    fn a_module_runs_its_ops_and_must_be_closed() {
        let g = graph();
        let w = weights();
        let spec = g
            .module_spec("m", &["m.norm:in".to_string()], "m.fc:out")
            .unwrap();
        assert_eq!(spec.kind, MODULE_KIND);
        assert_eq!(spec.params["ops"], serde_json::json!(["l.norm", "l.fc"]));
        let roles: Vec<&str> = spec.weights.iter().map(|w| w.role.as_str()).collect();
        assert_eq!(roles, ["norm.weight", "norm.bias", "fc.weight", "fc.bias"]);
        let y = g.run_module(&spec, &[x()], &w, 0, None).unwrap();
        let one = g.run_op("l.norm", &[x()], &w, 0, None).unwrap();
        assert_eq!(y, g.run_op("l.fc", &one, &w, 0, None).unwrap()[0]);
        let e = g
            .module_spec("m", &["m.fc:in".to_string()], "m.nope:out")
            .unwrap_err();
        assert!(e.to_string().contains("m.nope:out"), "{e}");
        let e = g.module_spec("m", &[], "m.fc:out").unwrap_err();
        assert!(e.to_string().contains("feed"), "{e}");
        let e = g
            .module_spec("m.fc", &["m.fc:in".to_string()], "m.fc:out")
            .map(|s| s.weights.len());
        assert_eq!(e.unwrap(), 2);
        let e = g
            .module_spec("m.fc", &["m.norm:in".to_string()], "m.fc:out")
            .unwrap_err();
        assert!(e.to_string().contains("m.norm.weight"), "{e}");
    }

    /// A planted fault changes the replayed op (and fires); a wrong shape is an error, not a panic.
    #[test]
    fn faults_apply_and_shapes_are_checked() {
        let g = graph();
        let w = weights();
        let clean = g.run_op("l.norm", &[x()], &w, 0, None).unwrap();
        for kind in [
            FaultKind::Param(ParamFault::Eps(1e-1)),
            FaultKind::Kernel(KernelFault::LayerNormUnbiasedVar),
        ] {
            let plan = FaultPlan {
                planted: vec![Planted {
                    name: "f".into(),
                    kind,
                    target: "l.norm".into(),
                    step: None,
                    hits: Default::default(),
                }],
            };
            plan.validate(&g).unwrap();
            let bad = g.run_op("l.norm", &[x()], &w, 0, Some(&plan)).unwrap();
            assert_ne!(bad[0], clean[0]);
            plan.confirm_fired().unwrap();
        }
        let wrong = Tensor::zeros(vec![2, 3]);
        let e = g.run_op("l.norm", &[wrong], &w, 0, None).unwrap_err();
        assert!(e.to_string().contains("shape mismatch"), "{e}");
        let e = g.run_op("l.norm", &[], &w, 0, None).unwrap_err();
        assert!(e.to_string().contains("takes 1 input"), "{e}");
        let empty = Weights::from_map("<none>", HashMap::new());
        let e = g.run_op("l.fc", &[x()], &empty, 0, None).unwrap_err();
        assert!(e.to_string().contains("m.fc.weight"), "{e}");
    }
}
