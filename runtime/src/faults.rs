//! Deliberate faults for the self-test: realistic bring-up bugs planted behind one seam. The graph
//! executor asks the [`FaultPlan`] once per op for a patched kernel (parameter faults: epsilon,
//! attention scale, mask, RoPE offset) and once per produced edge for an output corruption (f16
//! rounding, a NaN, swapped heads, a layout leak). Host-level faults (a stale cross-attention cache)
//! are flags the model's decode loop reads. No kernel has a fault `if` of its own.

use crate::graph::{Edge, Kernel, Layout, Op, Tensor};

/// A parameter fault: the op runs with a wrong parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamFault {
    /// LayerNorm / RMSNorm epsilon replaced.
    Eps(f32),
    /// Attention softmax scale replaced by this factor.
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
}

/// What a planted fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Patch a kernel parameter of matching ops.
    Param(ParamFault),
    /// Corrupt matching edges.
    Output(OutputFault),
    /// A host-level behaviour flag read by the model loop (e.g. `stale_cross_cache`).
    Host(String),
}

/// One planted fault: what and where (an op-name glob for params, a checkpoint/edge glob for
/// outputs), optionally only at some steps.
#[derive(Debug, Clone)]
pub struct Planted {
    /// Catalogue name.
    pub name: String,
    /// The fault.
    pub kind: FaultKind,
    /// Op name glob (params) or checkpoint/edge name glob (outputs).
    pub target: String,
    /// Only at this step, if set.
    pub step: Option<usize>,
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

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// Whether a host flag is planted.
    pub fn host(&self, flag: &str) -> bool {
        self.planted.iter().any(|p| matches!(&p.kind, FaultKind::Host(h) if h == flag))
    }

    /// A patched kernel for this op, if a parameter fault targets it.
    pub fn patch_kernel(&self, op: &Op) -> Option<Box<dyn Kernel>> {
        let mut out: Option<Box<dyn Kernel>> = None;
        for p in &self.planted {
            if let FaultKind::Param(pf) = &p.kind {
                if glob_match(&p.target, &op.name) {
                    let base: &dyn Kernel = out.as_deref().unwrap_or(op.kernel.as_ref());
                    if let Some(k) = base.with_param_fault(pf) {
                        out = Some(k);
                    }
                }
            }
        }
        out
    }

    /// Corrupt an op output if an output fault targets its edge (by checkpoint label or name).
    pub fn patch_output(&self, _op: &Op, _port: usize, edge: &Edge, step: usize, t: &mut Tensor) {
        for p in &self.planted {
            let FaultKind::Output(of) = &p.kind else { continue };
            if p.step.is_some_and(|s| s != step) {
                continue;
            }
            let hit = edge.checkpoint.as_deref().is_some_and(|c| glob_match(&p.target, c)) || glob_match(&p.target, &edge.name);
            if hit {
                apply_output_fault(of, edge.layout, t);
            }
        }
    }
}

/// Apply an output fault in place.
pub fn apply_output_fault(f: &OutputFault, layout: Layout, t: &mut Tensor) {
    match f {
        OutputFault::RoundF16 => t.mapv_inplace(|v| half::f16::from_f32(v).to_f32()),
        OutputFault::RoundBf16 => t.mapv_inplace(|v| half::bf16::from_f32(v).to_f32()),
        OutputFault::Nan(i) => {
            if let Some(v) = t.iter_mut().nth(*i) {
                *v = f32::NAN;
            }
        }
        OutputFault::SwapHeads(a, b) => {
            if t.ndim() == 3 && *a < t.shape()[0] && *b < t.shape()[0] && a != b {
                let ta = t.index_axis(ndarray::Axis(0), *a).to_owned();
                let tb = t.index_axis(ndarray::Axis(0), *b).to_owned();
                t.index_axis_mut(ndarray::Axis(0), *a).assign(&tb);
                t.index_axis_mut(ndarray::Axis(0), *b).assign(&ta);
            }
        }
        OutputFault::TokenMajorLeak => {
            if layout == Layout::HeadMajor && t.ndim() == 3 {
                // The consumer reads head-major [H, T, D], but the buffer holds [T, H*D] rows.
                let (h, tt, d) = (t.shape()[0], t.shape()[1], t.shape()[2]);
                let token_major = t.view().permuted_axes(ndarray::IxDyn(&[1, 0, 2])).as_standard_layout().into_owned();
                if let Ok(flat) = token_major.into_shape_with_order(ndarray::IxDyn(&[h, tt, d])) {
                    *t = flat;
                }
            }
        }
    }
}
