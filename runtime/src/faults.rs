//! Deliberate faults for the self-test: realistic bring-up bugs planted behind one seam. The graph
//! executor asks the [`FaultPlan`] once per op for a patched kernel (parameter faults: epsilon,
//! attention scale, mask, RoPE offset; replacement kernels: an unbiased-variance LayerNorm, a
//! tanh-approximated GELU, a linear whose weight is rounded to an int grid), once per weight for
//! the state-dict key it reads (a projection wired to another layer's weight) and once per
//! produced edge for an output corruption (f16 rounding, a NaN, swapped heads, a layout leak, a
//! wrong clamp floor). Host-level faults (a stale cross-attention cache) are flags the model's
//! decode loop reads. No kernel has a fault `if` of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use xray_core::SignatureKind;
use xray_core::Step;

use crate::graph::{
    Dim, Edge, Graph, Kernel, KernelCtx, KernelOut, Layout, Op, Port, Shape, Tensor,
};

/// A parameter fault: the op runs with a wrong parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamFault {
    /// LayerNorm / RMSNorm epsilon replaced.
    Eps(f32),
    /// Attention softmax scale replaced by this value.
    AttnScale(f32),
    /// Attention with the causal mask forced on (`true`) or off (`false`).
    Causal(bool),
    /// RoPE positions shifted by this many positions.
    RopeOffset(i64),
    /// A residual branch dropped (the op returns its first input unchanged).
    SkipBranch,
}

/// An output fault: the produced tensor is corrupted.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFault {
    /// Round every element to f16 and back.
    RoundF16,
    /// Round every element to bf16 and back.
    RoundBf16,
    /// Write one NaN at this flat index.
    Nan(usize),
    /// Swap two heads of a head-major tensor.
    SwapHeads(usize, usize),
    /// A head-major edge carries the token-major buffer (the layout-leak bug).
    TokenMajorLeak,
    /// Every element multiplied by this factor.
    Scale(f32),
    /// Every element negated.
    Negate,
    /// Shifted by this many positions along the time/token axis (zero fill): the last axis for
    /// channel-major tensors, the first for token-major ones.
    Shift(i64),
    /// Every element raised to at least `max - d` (`max` over the finite elements): a dynamic-range
    /// clamp whose floor sits `d` below the maximum (the log-mel's `max(l, max(l) - 8)`, scaled).
    FloorBelowMax(f32),
}

/// A replacement kernel: the op computes a plausible wrong variant of its function.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelFault {
    /// A LayerNorm dividing the variance by `n - 1` (unbiased, `torch.var`'s default) instead of
    /// `n` (what `nn.LayerNorm` uses).
    LayerNormUnbiasedVar,
    /// An exact-erf GELU computed with the tanh approximation (`gelu_new` / `approximate='tanh'`).
    GeluTanh,
    /// A linear whose weight is rounded to a symmetric uniform grid of this many bits, one scale
    /// per output row (`max|w_row| / (2^(bits-1) - 1)`): a weight-only quantized checkpoint.
    WeightGridPerRow(u32),
}

impl KernelFault {
    /// The kernel kind this fault replaces.
    pub fn kernel_kind(&self) -> &'static str {
        match self {
            KernelFault::LayerNormUnbiasedVar => "layer_norm",
            KernelFault::GeluTanh => "gelu",
            KernelFault::WeightGridPerRow(_) => "linear",
        }
    }
}

/// What a planted fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Patch a kernel parameter of matching ops.
    Param(ParamFault),
    /// Corrupt matching edges.
    Output(OutputFault),
    /// Replace the kernel of matching ops by a wrong variant of it.
    Kernel(KernelFault),
    /// Matching ops read weight role `role` from state-dict key `key` (a wiring bug: another
    /// layer's weight).
    WeightKey {
        /// The kernel's weight role (`weight`, `bias`, ...).
        role: String,
        /// The key read instead.
        key: String,
    },
    /// A host-level behaviour flag read by the model loop (e.g. `stale_cross_cache`).
    Host(String),
}

/// One planted fault: what and where (an op-name glob for params, a checkpoint/edge glob for
/// outputs), optionally only at some steps. `hits` counts how often it actually changed an op or a
/// tensor, so a fault that was planted but never fired is an error, not a silent clean run.
#[derive(Debug, Clone)]
pub struct Planted {
    /// Catalogue name.
    pub name: String,
    /// The fault.
    pub kind: FaultKind,
    /// Op name glob (params) or checkpoint/edge name glob (outputs); empty for host faults.
    pub target: String,
    /// Only at this step, if set.
    pub step: Option<Step>,
    /// How many times the fault was applied (kernels patched, tensors corrupted, flags read).
    pub hits: Arc<AtomicUsize>,
}

impl Planted {
    /// `NAME@TARGET` as the user wrote it (`NAME` alone for host faults, which take no target).
    pub fn spec(&self) -> String {
        if matches!(self.kind, FaultKind::Host(_)) && self.target.is_empty() {
            self.name.clone()
        } else {
            format!("{}@{}", self.name, self.target)
        }
    }

    /// The ops whose computation this fault changes in `graph`: those a parameter fault patches,
    /// the producers of the edges an output fault corrupts (none for host faults). The self-test
    /// expects the harness's op-level origin among them.
    pub fn ops(&self, graph: &Graph) -> Vec<String> {
        match &self.kind {
            FaultKind::Host(_) => vec![],
            FaultKind::Param(pf) => graph
                .ops()
                .iter()
                .filter(|op| {
                    glob_match(&self.target, &op.name) && op.kernel.with_param_fault(pf).is_some()
                })
                .map(|op| op.name.clone())
                .collect(),
            FaultKind::Kernel(kf) => graph
                .ops()
                .iter()
                .filter(|op| {
                    glob_match(&self.target, &op.name) && op.kernel.kind() == kf.kernel_kind()
                })
                .map(|op| op.name.clone())
                .collect(),
            FaultKind::WeightKey { role, .. } => graph
                .ops()
                .iter()
                .filter(|op| {
                    glob_match(&self.target, &op.name)
                        && op.weights.iter().any(|w| w.role == role.as_str())
                })
                .map(|op| op.name.clone())
                .collect(),
            FaultKind::Output(_) => graph
                .edges()
                .iter()
                .enumerate()
                .filter(|(_, e)| {
                    glob_match(&self.target, &e.name)
                        || e.checkpoint
                            .as_deref()
                            .is_some_and(|c| glob_match(&self.target, c))
                })
                .filter_map(|(i, _)| graph.producer_name(i).map(str::to_string))
                .collect(),
        }
    }

    fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
}

/// A set of planted faults.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// The faults.
    pub planted: Vec<Planted>,
}

fn glob_match(pattern: &str, s: &str) -> bool {
    globset::Glob::new(pattern)
        .map(|g| g.compile_matcher().is_match(s))
        .unwrap_or(false)
}

/// Up to five names nearest to `target` (by edit distance), for an error message.
fn nearest<'a>(target: &str, names: impl Iterator<Item = &'a str>) -> String {
    let mut v: Vec<(usize, &str)> = names.map(|n| (strsim::levenshtein(target, n), n)).collect();
    v.sort();
    v.dedup_by(|a, b| a.1 == b.1);
    if v.is_empty() {
        return "none in this model".into();
    }
    v.iter()
        .take(5)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why an output fault cannot change a tensor on `edge` (None: it can, or only the run can tell).
fn output_fault_misfit(f: &OutputFault, edge: &Edge) -> Option<String> {
    let rank = edge.shape.len();
    let fixed = |i: usize| match edge.shape.get(i) {
        Some(Dim::Fixed(n)) => Some(*n),
        _ => None,
    };
    match f {
        OutputFault::TokenMajorLeak if edge.layout != Layout::HeadMajor || rank != 3 => {
            Some(format!(
                "needs a head_major rank-3 edge; it is {} rank {rank}",
                edge.layout
            ))
        }
        OutputFault::SwapHeads(..) if rank != 3 || edge.layout != Layout::HeadMajor => {
            Some(format!(
                "needs a head_major rank-3 edge; it is {} rank {rank}",
                edge.layout
            ))
        }
        OutputFault::SwapHeads(a, b) if fixed(0).is_some_and(|h| *a.max(b) >= h) || a == b => {
            Some(format!(
                "heads {a} and {b} are not two distinct heads of {}",
                crate::graph::fmt_shape(&edge.shape)
            ))
        }
        OutputFault::Shift(_) if rank == 0 => Some("needs a tensor with a time axis".into()),
        OutputFault::Nan(i)
            if edge
                .shape
                .iter()
                .map(|d| match d {
                    Dim::Fixed(n) => Some(*n),
                    Dim::Sym(_) => None,
                })
                .collect::<Option<Vec<_>>>()
                .is_some_and(|dims| dims.iter().product::<usize>() <= *i) =>
        {
            Some(format!(
                "index {i} is outside {}",
                crate::graph::fmt_shape(&edge.shape)
            ))
        }
        _ => None,
    }
}

/// Why an op-level fault (replacement kernel, weight rewiring) targeting `target` cannot be
/// planted in `graph` (None: some matched op takes it); `takes` says whether an op does, `what`
/// names what such an op has.
fn refuse_op_fault(
    graph: &Graph,
    target: &str,
    takes: &dyn Fn(&Op) -> bool,
    what: &str,
) -> Option<String> {
    let matched: Vec<&Op> = graph
        .ops()
        .iter()
        .filter(|op| glob_match(target, &op.name))
        .collect();
    if matched.iter().any(|op| takes(op)) {
        return None;
    }
    let fit = nearest(
        target,
        graph
            .ops()
            .iter()
            .filter(|op| takes(op))
            .map(|o| o.name.as_str()),
    );
    Some(if matched.is_empty() {
        format!("target matches no op; nearest ops with {what}: {fit}")
    } else {
        format!(
            "target matches {} op(s) ({}) but none has {what}; nearest ops that do: {fit}",
            matched.len(),
            nearest(target, matched.iter().map(|o| o.name.as_str()))
        )
    })
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// Whether a host flag is planted (counted as a hit of that fault).
    pub fn host(&self, flag: &str) -> bool {
        let mut on = false;
        for p in &self.planted {
            if matches!(&p.kind, FaultKind::Host(h) if h == flag) {
                p.hit();
                on = true;
            }
        }
        on
    }

    /// Checks every planted fault against `graph` before anything runs: a parameter fault must
    /// target at least one op whose kernel takes that parameter, an output fault at least one
    /// edge or checkpoint it can change, a host fault takes no target. The error names the
    /// target and the nearest names that would work.
    pub fn validate(&self, graph: &Graph) -> crate::Result<()> {
        let refuse = |p: &Planted, why: String| {
            Err(crate::RuntimeError::Fault(format!(
                "--inject {}: {why}",
                p.spec()
            )))
        };
        for p in &self.planted {
            if !p.target.is_empty() {
                if let Err(e) = globset::Glob::new(&p.target) {
                    return refuse(p, format!("target is not a valid glob: {e}"));
                }
            }
            match &p.kind {
                FaultKind::Host(_) => {
                    if !p.target.is_empty() {
                        return refuse(
                            p,
                            format!(
                                "'{}' is a host behaviour of the model loop and takes no target",
                                p.name
                            ),
                        );
                    }
                }
                FaultKind::Param(pf) => {
                    let takes = |op: &Op| op.kernel.with_param_fault(pf).is_some();
                    let matched: Vec<&Op> = graph
                        .ops()
                        .iter()
                        .filter(|op| glob_match(&p.target, &op.name))
                        .collect();
                    if matched.iter().any(|op| takes(op)) {
                        continue;
                    }
                    let fit = nearest(
                        &p.target,
                        graph
                            .ops()
                            .iter()
                            .filter(|op| takes(op))
                            .map(|o| o.name.as_str()),
                    );
                    return refuse(
                        p,
                        if matched.is_empty() {
                            format!("target matches no op; nearest ops that take this fault: {fit}")
                        } else {
                            format!(
                                "target matches {} op(s) ({}) but none takes this fault (wrong op kind); nearest ops that do: {fit}",
                                matched.len(),
                                nearest(&p.target, matched.iter().map(|o| o.name.as_str()))
                            )
                        },
                    );
                }
                FaultKind::Kernel(kf) => {
                    let kind = kf.kernel_kind();
                    let takes = |op: &Op| op.kernel.kind() == kind;
                    let what = format!("a '{kind}' kernel");
                    if let Some(why) = refuse_op_fault(graph, &p.target, &takes, &what) {
                        return refuse(p, why);
                    }
                }
                FaultKind::WeightKey { role, .. } => {
                    let takes = |op: &Op| op.weights.iter().any(|w| w.role == role.as_str());
                    let what = format!("a weight role '{role}'");
                    if let Some(why) = refuse_op_fault(graph, &p.target, &takes, &what) {
                        return refuse(p, why);
                    }
                }
                FaultKind::Output(of) => {
                    let names = |e: &'_ Edge| -> Vec<String> {
                        e.checkpoint
                            .iter()
                            .cloned()
                            .chain(std::iter::once(e.name.clone()))
                            .collect()
                    };
                    let matched: Vec<&Edge> = graph
                        .edges()
                        .iter()
                        .filter(|e| names(e).iter().any(|n| glob_match(&p.target, n)))
                        .collect();
                    if matched.is_empty() {
                        let all: Vec<String> = graph.edges().iter().flat_map(names).collect();
                        return refuse(
                            p,
                            format!(
                                "target matches no edge or checkpoint; nearest: {}",
                                nearest(&p.target, all.iter().map(String::as_str))
                            ),
                        );
                    }
                    let misfits: Vec<String> = matched
                        .iter()
                        .filter_map(|e| output_fault_misfit(of, e).map(|w| (e, w)))
                        .map(|(e, w)| format!("{}: {w}", e.checkpoint.as_ref().unwrap_or(&e.name)))
                        .collect();
                    if misfits.len() == matched.len() {
                        let fit: Vec<String> = graph
                            .edges()
                            .iter()
                            .filter(|e| output_fault_misfit(of, e).is_none())
                            .flat_map(names)
                            .collect();
                        return refuse(
                            p,
                            format!(
                                "this fault cannot change what the target names ({}); nearest that it can: {}",
                                misfits.join("; "),
                                nearest(&p.target, fit.iter().map(String::as_str))
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Sets every fault's hit count to zero (before a run whose firing is to be confirmed).
    pub fn reset_hits(&self) {
        for p in &self.planted {
            p.hits.store(0, Ordering::Relaxed);
        }
    }

    /// Fails when a planted fault changed nothing since the last [`FaultPlan::reset_hits`] (its
    /// step was never reached, its index was out of range, ...): the run is not the faulty run
    /// the user asked for, and calling it one would be a silent pass.
    pub fn confirm_fired(&self) -> crate::Result<()> {
        let idle: Vec<String> = self
            .planted
            .iter()
            .filter(|p| p.hits.load(Ordering::Relaxed) == 0)
            .map(|p| match p.step {
                Some(s) => format!("{} (at step {s})", p.spec()),
                None => p.spec(),
            })
            .collect();
        if idle.is_empty() {
            Ok(())
        } else {
            Err(crate::RuntimeError::Fault(format!(
                "planted fault(s) never fired during the run, so nothing was planted: {}",
                idle.join(", ")
            )))
        }
    }

    /// A patched kernel for this op, if a parameter or kernel fault targets it. A fault planted at
    /// one step only is wrapped so that the op runs its own kernel at every other step (and is
    /// counted as fired only when that step runs).
    pub fn patch_kernel<'a>(&'a self, op: &'a Op) -> Option<Box<dyn Kernel + 'a>> {
        let own: &'a dyn Kernel = op.kernel.as_ref();
        let mut out: Option<Box<dyn Kernel + 'a>> = None;
        for p in &self.planted {
            if !glob_match(&p.target, &op.name) {
                continue;
            }
            let k: Box<dyn Kernel + 'a> = match &p.kind {
                FaultKind::Param(pf) => match out.as_deref().unwrap_or(own).with_param_fault(pf) {
                    Some(k) => k,
                    None => continue,
                },
                // A replacement kernel wraps the op's own kernel.
                FaultKind::Kernel(kf) if own.kind() == kf.kernel_kind() => Box::new(Replaced {
                    inner: own,
                    fault: kf.clone(),
                }),
                _ => continue,
            };
            out = Some(match p.step {
                Some(step) => Box::new(AtStep {
                    base: out.take().unwrap_or_else(|| Box::new(Borrowed(own))),
                    faulted: k,
                    step,
                    hits: p.hits.clone(),
                }),
                None => {
                    p.hit();
                    k
                }
            });
        }
        out
    }

    /// The state-dict key weight role `i` of `op` reads instead of its own, if a wiring fault
    /// targets it (counted as fired).
    pub fn weight_key(&self, op: &Op, i: usize) -> Option<&str> {
        let role = op.weights.get(i)?.role;
        self.planted.iter().find_map(|p| match &p.kind {
            FaultKind::WeightKey { role: r, key }
                if r.as_str() == role && glob_match(&p.target, &op.name) =>
            {
                p.hit();
                Some(key.as_str())
            }
            _ => None,
        })
    }

    /// Corrupt an op output if an output fault targets its edge (by checkpoint label or name).
    pub fn patch_output(&self, _op: &Op, _port: usize, edge: &Edge, step: Step, t: &mut Tensor) {
        for p in &self.planted {
            let FaultKind::Output(of) = &p.kind else {
                continue;
            };
            if p.step.is_some_and(|s| s != step) {
                continue;
            }
            let hit = edge
                .checkpoint
                .as_deref()
                .is_some_and(|c| glob_match(&p.target, c))
                || glob_match(&p.target, &edge.name);
            if hit && apply_output_fault(of, edge.layout, t) {
                p.hit();
            }
        }
    }
}

/// A wrapper kernel's interface (points, kind, ports, weight roles, shape rules, params): the
/// wrapped kernel's, read through `self.$inner`.
macro_rules! wrapped_interface {
    ($($inner:tt)+) => {
        fn points(&self) -> &'static [xray_core::ops::Side] {
            self.$($inner)+.points()
        }
        fn kind(&self) -> &'static str {
            self.$($inner)+.kind()
        }
        fn inputs(&self) -> Vec<Port> {
            self.$($inner)+.inputs()
        }
        fn outputs(&self) -> Vec<Port> {
            self.$($inner)+.outputs()
        }
        fn weight_roles(&self) -> Vec<&'static str> {
            self.$($inner)+.weight_roles()
        }
        fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
            self.$($inner)+.infer(inputs, weights)
        }
        fn params(&self) -> serde_json::Value {
            self.$($inner)+.params()
        }
    };
}

/// The op's own kernel, borrowed (the base of a step-gated fault).
#[derive(Debug)]
struct Borrowed<'a>(&'a dyn Kernel);

impl Kernel for Borrowed<'_> {
    wrapped_interface!(0);
    fn run(&self, ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        self.0.run(ctx, inputs, weights)
    }
    fn f16_weight_roles(&self) -> Vec<usize> {
        self.0.f16_weight_roles()
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        self.0.with_param_fault(fault)
    }
}

/// A fault planted at one step: `faulted` runs at `step`, `base` at every other.
#[derive(Debug)]
struct AtStep<'a> {
    base: Box<dyn Kernel + 'a>,
    faulted: Box<dyn Kernel + 'a>,
    step: Step,
    hits: Arc<AtomicUsize>,
}

impl Kernel for AtStep<'_> {
    wrapped_interface!(base);
    fn run(&self, ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        if ctx.step == self.step {
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.faulted.run(ctx, inputs, weights)
        } else {
            self.base.run(ctx, inputs, weights)
        }
    }
    /// Only the roles both kernels read from an f16 mirror with the same bits (the executor asks
    /// before it knows which one runs).
    fn f16_weight_roles(&self) -> Vec<usize> {
        let f = self.faulted.f16_weight_roles();
        self.base
            .f16_weight_roles()
            .into_iter()
            .filter(|i| f.contains(i))
            .collect()
    }
}

/// A replacement kernel ([`KernelFault`]): the op's own kernel's interface, a wrong computation.
#[derive(Debug)]
struct Replaced<'a> {
    inner: &'a dyn Kernel,
    fault: KernelFault,
}

impl Kernel for Replaced<'_> {
    wrapped_interface!(inner);
    fn run(&self, ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        match &self.fault {
            KernelFault::LayerNormUnbiasedVar => {
                let eps = self.inner.params()["eps"].as_f64().ok_or_else(|| {
                    format!(
                        "unbiased-variance fault: the layer norm's params {} hold no eps",
                        self.inner.params()
                    )
                })?;
                layer_norm_unbiased(inputs[0], weights, eps)
            }
            KernelFault::GeluTanh => {
                let c = (2.0f32 / std::f32::consts::PI).sqrt();
                let y =
                    inputs[0].mapv(|x| 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh()));
                Ok(vec![y])
            }
            KernelFault::WeightGridPerRow(bits) => {
                let w = weights
                    .first()
                    .ok_or("grid fault: the linear has no weight")?;
                let q = grid_per_row(w, *bits)?;
                let mut ws: Vec<&Tensor> = weights.to_vec();
                ws[0] = &q;
                // The inner kernel sees no f16 mirror (this kernel declares none), so it reads `q`.
                self.inner.run(ctx, inputs, &ws)
            }
        }
    }
    // No f16 mirrors: the mirror is of the original weight.
}

/// `nn.LayerNorm` over the last axis of `[rows, d]` with the variance divided by `d - 1`.
fn layer_norm_unbiased(x: &Tensor, weights: &[&Tensor], eps: f64) -> Result<Vec<Tensor>, String> {
    let &[rows, d] = x.shape() else {
        return Err(format!(
            "layer norm input must be [rows, d], got {:?}",
            x.shape()
        ));
    };
    let [g, b] = weights else {
        return Err("layer norm takes weight and bias".into());
    };
    if g.len() != d || b.len() != d || d < 2 {
        return Err(format!(
            "layer norm over {d} features with weight {:?} and bias {:?}",
            g.shape(),
            b.shape()
        ));
    }
    let x = x.as_standard_layout();
    let xs = x.as_slice().ok_or("layer norm input not contiguous")?;
    let (g, b) = (g.as_standard_layout(), b.as_standard_layout());
    let (g, b) = (
        g.as_slice().ok_or("layer norm weight not contiguous")?,
        b.as_slice().ok_or("layer norm bias not contiguous")?,
    );
    let mut y = vec![0f32; rows * d];
    for (xr, yr) in xs.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (d - 1) as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..d {
            yr[j] = ((xr[j] as f64 - mean) * rstd) as f32 * g[j] + b[j];
        }
    }
    Tensor::from_shape_vec(vec![rows, d], y)
        .map_err(|e| e.to_string())
        .map(|t| vec![t])
}

/// `w` (`[out, in]`) rounded to a symmetric `bits`-bit grid, one step per output row.
fn grid_per_row(w: &Tensor, bits: u32) -> Result<Tensor, String> {
    if w.ndim() != 2 || !(2..=16).contains(&bits) {
        return Err(format!(
            "grid fault: weight must be [out, in] and bits in 2..=16, got {:?} and {bits}",
            w.shape()
        ));
    }
    let levels = ((1u32 << (bits - 1)) - 1) as f32;
    let mut q = w.as_standard_layout().into_owned();
    for mut row in q.rows_mut() {
        let m = row.iter().fold(0f32, |a, &v| a.max(v.abs()));
        if m > 0.0 {
            let step = m / levels;
            row.mapv_inplace(|v| (v / step).round().clamp(-levels, levels) * step);
        }
    }
    Ok(q)
}

/// Apply an output fault in place; `false` when it could not apply to this tensor (wrong rank or
/// layout, index out of range), so the caller does not count it as planted.
pub fn apply_output_fault(f: &OutputFault, layout: Layout, t: &mut Tensor) -> bool {
    match f {
        OutputFault::RoundF16 => t.mapv_inplace(|v| half::f16::from_f32(v).to_f32()),
        OutputFault::RoundBf16 => t.mapv_inplace(|v| half::bf16::from_f32(v).to_f32()),
        OutputFault::Nan(i) => match t.iter_mut().nth(*i) {
            Some(v) => *v = f32::NAN,
            None => return false,
        },
        OutputFault::SwapHeads(a, b) => {
            if t.ndim() == 3 && *a < t.shape()[0] && *b < t.shape()[0] && a != b {
                let ta = t.index_axis(ndarray::Axis(0), *a).to_owned();
                let tb = t.index_axis(ndarray::Axis(0), *b).to_owned();
                t.index_axis_mut(ndarray::Axis(0), *a).assign(&tb);
                t.index_axis_mut(ndarray::Axis(0), *b).assign(&ta);
            } else {
                return false;
            }
        }
        OutputFault::Scale(f) => t.mapv_inplace(|v| v * f),
        OutputFault::Negate => t.mapv_inplace(|v| -v),
        OutputFault::FloorBelowMax(d) => {
            let m = t
                .iter()
                .filter(|v| v.is_finite())
                .fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            if !m.is_finite() {
                return false;
            }
            let floor = m - d;
            t.mapv_inplace(|v| v.max(floor));
        }
        OutputFault::Shift(k) => {
            let axis = if layout == Layout::ChannelMajor {
                t.ndim().saturating_sub(1)
            } else {
                0
            };
            if t.ndim() == 0 || *k == 0 {
                return false;
            }
            let n = t.shape()[axis] as i64;
            let src = t.clone();
            t.fill(0.0);
            for i in 0..n {
                let j = i - k;
                if (0..n).contains(&j) {
                    t.index_axis_mut(ndarray::Axis(axis), i as usize)
                        .assign(&src.index_axis(ndarray::Axis(axis), j as usize));
                }
            }
        }
        OutputFault::TokenMajorLeak => {
            if layout == Layout::HeadMajor && t.ndim() == 3 {
                // The consumer reads head-major [H, T, D], but the buffer holds [T, H*D] rows.
                let (h, tt, d) = (t.shape()[0], t.shape()[1], t.shape()[2]);
                let token_major = t
                    .view()
                    .permuted_axes(ndarray::IxDyn(&[1, 0, 2]))
                    .as_standard_layout()
                    .into_owned();
                match token_major.into_shape_with_order(ndarray::IxDyn(&[h, tt, d])) {
                    Ok(flat) => *t = flat,
                    Err(_) => return false,
                }
            } else {
                return false;
            }
        }
    }
    true
}

/// A catalogue entry: a realistic bring-up bug with where it is planted by default and where the
/// harness must localize it (the self-test checks exactly that name and step).
#[derive(Debug, Clone)]
pub struct CatalogueEntry {
    /// Fault name (`--inject NAME`).
    pub name: &'static str,
    /// Family it applies to.
    pub family: &'static str,
    /// What bug it imitates.
    pub description: &'static str,
    /// Default target: an op-name glob (parameter faults) or an edge/checkpoint glob (outputs).
    pub default_target: &'static str,
    /// Only at this step (None: every step).
    pub step: Option<Step>,
    /// The checkpoint (contract template syntax, expanded with the model's dims: `{sc_layer}`)
    /// and step where the harness must put the origin for the default target.
    pub expected_origin: (&'static str, usize),
    /// The signature the harness must name for it (empty: any; the self-test checks it).
    pub expected_signature: Option<SignatureKind>,
    /// The signature the harness must name for the op-level origin its drill-down finds (empty:
    /// any).
    pub expected_op_signature: Option<SignatureKind>,
    /// Needs a previous input through the same model (stale-state bugs).
    pub needs_second_input: bool,
    /// The fault for a model config (an error names a config key the config lacks).
    pub(crate) build: BuildFault,
}

/// How a catalogue entry builds its fault from a model config (an error names a config key the
/// config lacks).
pub(crate) type BuildFault = fn(&serde_json::Value) -> Result<FaultKind, String>;

/// One family's catalogue under construction: [`FamilyFaults::fault`] makes each entry one row,
/// the family named once.
pub(crate) struct FamilyFaults(pub &'static str);

impl FamilyFaults {
    /// The fault `name` imitating `description`, planted at `default_target` and built by
    /// `build`, whose origin the harness must put at `expected_origin` with `expected_signature`
    /// (None: any): at every step, on one input, any op-level signature, until
    /// [`CatalogueEntry::at_step`], [`CatalogueEntry::op_signature`] or
    /// [`CatalogueEntry::second_input`] say otherwise.
    pub(crate) fn fault(
        &self,
        name: &'static str,
        description: &'static str,
        default_target: &'static str,
        expected_origin: (&'static str, usize),
        expected_signature: Option<SignatureKind>,
        build: BuildFault,
    ) -> CatalogueEntry {
        CatalogueEntry {
            name,
            family: self.0,
            description,
            default_target,
            step: None,
            expected_origin,
            expected_signature,
            expected_op_signature: None,
            needs_second_input: false,
            build,
        }
    }
}

impl CatalogueEntry {
    /// Planted only at `step`.
    pub(crate) fn at_step(mut self, step: Step) -> CatalogueEntry {
        self.step = Some(step);
        self
    }

    /// The harness must name `kind` for the op-level origin its drill-down finds.
    pub(crate) fn op_signature(mut self, kind: SignatureKind) -> CatalogueEntry {
        self.expected_op_signature = Some(kind);
        self
    }

    /// Needs a previous input through the same model (stale-state bugs).
    pub(crate) fn second_input(mut self) -> CatalogueEntry {
        self.needs_second_input = true;
        self
    }

    /// The fault for a model config; a config key the fault needs and the config lacks is an
    /// error naming it.
    pub fn kind(&self, config: &serde_json::Value) -> crate::Result<FaultKind> {
        (self.build)(config)
            .map_err(|e| crate::RuntimeError::Fault(format!("fault '{}': {e}", self.name)))
    }
}

/// A number from config.json by dotted key, or an error naming the key.
pub(crate) fn num(c: &serde_json::Value, key: &str) -> Result<f64, String> {
    key.split('.')
        .try_fold(c, |v, k| v.get(k))
        .and_then(|v| v.as_f64())
        .ok_or_else(|| format!("config.json has no number at '{key}'"))
}

/// The fault catalogue: every registered family's entries ([`crate::models::families`]).
pub fn catalogue() -> Vec<CatalogueEntry> {
    crate::models::families()
        .iter()
        .flat_map(|f| f.catalogue())
        .collect()
}

/// Resolve `NAME` or `NAME@TARGET` for a family into a planted fault.
pub fn plant(spec: &str, family: &str, config: &serde_json::Value) -> crate::Result<Planted> {
    let (name, target) = match spec.split_once('@') {
        Some((n, t)) => (n, Some(t)),
        None => (spec, None),
    };
    let e = catalogue()
        .into_iter()
        .find(|e| e.name == name && e.family == family)
        .ok_or_else(|| {
            let names: Vec<&str> = catalogue()
                .iter()
                .filter(|e| e.family == family)
                .map(|e| e.name)
                .collect();
            crate::RuntimeError::Fault(format!(
                "no fault '{name}' for family {family}; known: {}",
                names.join(", ")
            ))
        })?;
    Ok(Planted {
        name: name.to_string(),
        kind: e.kind(config)?,
        target: target.unwrap_or(e.default_target).to_string(),
        step: e.step,
        hits: Arc::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::WeightRef;
    use crate::kernels::{Attention, Gelu, LayerNorm, Linear, MatmulStrategy};

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_shape_vec(shape.to_vec(), v).expect("shape")
    }

    fn op(name: &str, kernel: Box<dyn Kernel>, weights: &[(&'static str, &str)]) -> Op {
        Op {
            name: name.into(),
            kernel,
            inputs: vec![],
            outputs: vec![],
            weights: weights
                .iter()
                .map(|(role, key)| WeightRef {
                    role,
                    key: key.to_string(),
                    shape: vec![],
                })
                .collect(),
            module: None,
        }
    }

    fn planted(kind: FaultKind, target: &str, step: Option<Step>) -> FaultPlan {
        FaultPlan {
            planted: vec![Planted {
                name: "f".into(),
                kind,
                target: target.into(),
                step,
                hits: Arc::default(),
            }],
        }
    }

    fn run_at(k: &dyn Kernel, step: Step, ins: &[&Tensor], ws: &[&Tensor]) -> Vec<f32> {
        let ctx = KernelCtx {
            op: "t",
            step,
            weights_f16: &[],
        };
        k.run(&ctx, ins, ws).expect("run")[0]
            .iter()
            .copied()
            .collect()
    }

    fn hits(plan: &FaultPlan) -> usize {
        plan.planted[0].hits.load(Ordering::Relaxed)
    }

    /// The unbiased-variance LayerNorm is the reference's per row with `(y - b)` scaled by
    /// `sqrt((var + eps) / (var * n/(n-1) + eps))`; only layer norms take it.
    #[test]
    fn unbiased_layer_norm_rescales_each_row_by_its_variance_ratio() {
        let x = t(&[2, 4], vec![1.0, 2.0, 4.0, 8.0, -3.0, 0.5, 0.25, 2.0]);
        let (g, b) = (
            t(&[4], vec![1.0, 0.5, 2.0, -1.0]),
            t(&[4], vec![0.1, 0.0, -0.2, 0.3]),
        );
        let ln = op("enc.norm", Box::new(LayerNorm::new(1e-5)), &[]);
        let plan = planted(
            FaultKind::Kernel(KernelFault::LayerNormUnbiasedVar),
            "enc.norm",
            None,
        );
        let k = plan.patch_kernel(&ln).expect("patched");
        assert_eq!(hits(&plan), 1);
        let clean = run_at(ln.kernel.as_ref(), 0, &[&x], &[&g, &b]);
        let bad = run_at(k.as_ref(), 0, &[&x], &[&g, &b]);
        for r in 0..2 {
            let row: Vec<f64> = (0..4).map(|j| x[[r, j]] as f64).collect();
            let mean = row.iter().sum::<f64>() / 4.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
            let a = ((var + 1e-5) / (var * 4.0 / 3.0 + 1e-5)).sqrt();
            for j in 0..4 {
                let (yc, yb, bj) = (clean[r * 4 + j] as f64, bad[r * 4 + j] as f64, b[j] as f64);
                assert!(((yb - bj) - a * (yc - bj)).abs() < 1e-5, "row {r} col {j}");
                assert!(
                    (yb - yc).abs() > 1e-3,
                    "the fault changed nothing at {r},{j}"
                );
            }
        }
        let gelu = op("enc.norm", Box::new(Gelu), &[]);
        assert!(
            plan.patch_kernel(&gelu).is_none(),
            "a gelu is no layer norm"
        );
    }

    /// tanh-GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which differs from the exact
    /// erf GELU by ~1e-4 near |x| = 1 and agrees at 0.
    #[test]
    fn tanh_gelu_is_the_tanh_approximation() {
        let x = t(&[4], vec![0.0, 1.0, -1.0, 2.0]);
        let g = op("l.gelu", Box::new(Gelu), &[]);
        let plan = planted(FaultKind::Kernel(KernelFault::GeluTanh), "l.gelu", None);
        let k = plan.patch_kernel(&g).expect("patched");
        let bad = run_at(k.as_ref(), 0, &[&x], &[]);
        let clean = run_at(&Gelu, 0, &[&x], &[]);
        for (got, want) in bad.iter().zip([0.0f32, 0.841192, -0.158808, 1.954597]) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
        assert_eq!(bad[0], clean[0]);
        assert!(
            (bad[1] - clean[1]).abs() > 1e-4,
            "{} vs {}",
            bad[1],
            clean[1]
        );
    }

    /// The int8 linear runs the op's own linear on a weight rounded per output row to
    /// `max|row| / 127` steps; the f16 mirror of the original weight is not offered to it.
    #[test]
    fn grid_linear_rounds_each_row_to_its_own_step() {
        let w = t(&[2, 3], vec![1.0, 0.3, -0.5, 0.01, 0.02, -0.0333]);
        let bias = t(&[2], vec![0.5, -0.5]);
        let x = t(&[1, 3], vec![1.0, 1.0, 1.0]);
        let lin = op(
            "p",
            Box::new(Linear::new(true, MatmulStrategy::RowStable)),
            &[],
        );
        let plan = planted(
            FaultKind::Kernel(KernelFault::WeightGridPerRow(8)),
            "p",
            None,
        );
        let k = plan.patch_kernel(&lin).expect("patched");
        assert!(k.f16_weight_roles().is_empty());
        let got = run_at(k.as_ref(), 0, &[&x], &[&w, &bias]);
        let q = |row: &[f32]| -> f32 {
            let step = row.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            row.iter().map(|v| (v / step).round() * step).sum()
        };
        let want = [q(&[1.0, 0.3, -0.5]) + 0.5, q(&[0.01, 0.02, -0.0333]) - 0.5];
        let clean = [0.8f32 + 0.5, -0.0033 - 0.5];
        for i in 0..2 {
            assert!((got[i] - want[i]).abs() < 1e-6, "{} vs {}", got[i], want[i]);
            assert!((got[i] - clean[i]).abs() > 1e-5, "row {i} not rounded");
        }
        assert!(grid_per_row(&w, 1).is_err(), "a 1-bit grid has no levels");
    }

    /// A kernel fault planted at one step runs the op's own kernel at every other step and counts
    /// as fired only when that step runs.
    #[test]
    fn a_step_fault_runs_only_at_its_step() {
        let att = op(
            "dec.self_attn",
            Box::new(Attention::new(0.5, false, MatmulStrategy::RowStable)),
            &[],
        );
        let plan = planted(
            FaultKind::Param(ParamFault::AttnScale(0.625)),
            "dec.self_attn",
            Some(1),
        );
        let q = t(&[1, 1, 2], vec![1.0, -2.0]);
        let kk = t(&[1, 3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let v = t(&[1, 3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let k = plan.patch_kernel(&att).expect("patched");
        assert_eq!(hits(&plan), 0, "patched is not fired");
        let clean = run_at(att.kernel.as_ref(), 0, &[&q, &kk, &v], &[]);
        assert_eq!(run_at(k.as_ref(), 0, &[&q, &kk, &v], &[]), clean);
        assert_eq!(run_at(k.as_ref(), 2, &[&q, &kk, &v], &[]), clean);
        assert_eq!(hits(&plan), 0);
        let at1 = run_at(k.as_ref(), 1, &[&q, &kk, &v], &[]);
        assert_ne!(at1, clean);
        assert_eq!(hits(&plan), 1);
        let scaled = Attention::new(0.625, false, MatmulStrategy::RowStable);
        assert_eq!(at1, run_at(&scaled, 1, &[&q, &kk, &v], &[]));
    }

    /// A wiring fault names another key for its role on matching ops only.
    #[test]
    fn weight_key_redirects_one_role_of_matching_ops() {
        let kind = FaultKind::WeightKey {
            role: "weight".into(),
            key: "layers.0.k.weight".into(),
        };
        let plan = planted(kind, "layer.1.k_proj", None);
        let w = [("weight", "layers.1.k.weight"), ("bias", "layers.1.k.bias")];
        let lin = || Box::new(Linear::new(true, MatmulStrategy::Gemm));
        let hit = op("layer.1.k_proj", lin(), &w);
        let other = op("layer.1.v_proj", lin(), &w);
        assert_eq!(plan.weight_key(&hit, 0), Some("layers.0.k.weight"));
        assert_eq!(plan.weight_key(&hit, 1), None, "the bias keeps its key");
        assert_eq!(plan.weight_key(&other, 0), None);
        assert_eq!(hits(&plan), 1);
    }

    /// The dynamic-range floor raises everything below `max - d` to it, and nothing else.
    #[test]
    fn floor_below_max_clamps_only_below_the_floor() {
        let mut x = t(&[2, 3], vec![1.5, -1.0, 0.0, -0.25, 0.2, -0.3]);
        assert!(apply_output_fault(
            &OutputFault::FloorBelowMax(1.75),
            Layout::ChannelMajor,
            &mut x
        ));
        assert_eq!(
            x.iter().copied().collect::<Vec<_>>(),
            vec![1.5, -0.25, 0.0, -0.25, 0.2, -0.25]
        );
        let mut nan = t(&[1], vec![f32::NAN]);
        assert!(!apply_output_fault(
            &OutputFault::FloorBelowMax(1.0),
            Layout::Plain,
            &mut nan
        ));
    }

    /// A fault that needs a config number the config lacks is refused, naming the key.
    #[test]
    fn missing_config_key_fails_closed() {
        let e = plant(
            "attn_scale_dropped",
            "whisper",
            &serde_json::json!({"d_model": 384}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("decoder_attention_heads"), "{e}");
        let ok = plant(
            "attn_scale_dropped",
            "whisper",
            &serde_json::json!({"d_model": 384, "decoder_attention_heads": 6}),
        )
        .unwrap();
        assert!(matches!(ok.kind, FaultKind::Param(ParamFault::AttnScale(s)) if s == 8.0));
        let e = plant(
            "logits_scaling_applied",
            "granite_nar",
            &serde_json::json!({}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("text_config.logits_scaling"), "{e}");
    }
}
