//! KV-cache append: scatter the new rows after the past rows, per head.

use super::{data, dims, rank, same_dim, tensor};
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, Shape, Tensor};
use crate::kernels::layout::ports;
use xray_core::ops::Side;

/// head_major past `[H, P, D]` + new `[H, T, D]` -> `[H, P + T, D]`. The cache is a feed and
/// this op's output is the updated cache (a formula output), never a hidden buffer.
///
/// Its output is the attention module's `:keys` or `:values` op-level point (the module set with
/// [`GraphBuilder::hf_module`](crate::graph::GraphBuilder::hf_module)): [`KvAppend::keys`],
/// [`KvAppend::values`]; the default names none.
///
/// Upstream: transformers v5.24.0 src/transformers/cache_utils.py `DynamicLayer.update`
/// (`torch.cat([self.keys, key_states], dim=-2)`).
#[derive(Debug, Clone, Default)]
pub struct KvAppend {
    points: &'static [Side],
}

impl KvAppend {
    /// The append of the keys: its output is the module's `:keys` point.
    pub fn keys() -> Self {
        KvAppend {
            points: &[Side::Keys],
        }
    }
    /// The append of the values: its output is the module's `:values` point.
    pub fn values() -> Self {
        KvAppend {
            points: &[Side::Values],
        }
    }
}

fn sum_dim(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => Dim::Fixed(x + y),
        _ => Dim::Sym(format!("{a}+{b}")),
    }
}

impl Kernel for KvAppend {
    ports!("kv_append", [past: HeadMajor, new: HeadMajor] -> [y: HeadMajor]);
    fn points(&self) -> &'static [Side] {
        self.points
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 3, "past")?;
        rank(&inputs[1], 3, "new")?;
        same_dim(&inputs[0][0], &inputs[1][0], "heads of past and new")?;
        same_dim(&inputs[0][2], &inputs[1][2], "head_dim of past and new")?;
        Ok(vec![vec![
            inputs[0][0].clone(),
            sum_dim(&inputs[0][1], &inputs[1][1]),
            inputs[0][2].clone(),
        ]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let ps = dims(inputs[0], 3, "past")?;
        let ns = dims(inputs[1], 3, "new")?;
        if ps[0] != ns[0] || ps[2] != ns[2] {
            return Err(format!(
                "past {ps:?} and new {ns:?} disagree on heads/head_dim"
            ));
        }
        let (h, p, t, d) = (ps[0], ps[1], ns[1], ps[2]);
        let past = data(inputs[0], "past")?;
        let new = data(inputs[1], "new")?;
        let s = p + t;
        let mut y = vec![0f32; h * s * d];
        for hi in 0..h {
            y[hi * s * d..(hi * s + p) * d].copy_from_slice(&past[hi * p * d..(hi + 1) * p * d]);
            y[(hi * s + p) * d..(hi + 1) * s * d]
                .copy_from_slice(&new[hi * t * d..(hi + 1) * t * d]);
        }
        Ok(vec![tensor(&[h, s, d], y)?])
    }
}
