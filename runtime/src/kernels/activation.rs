//! Activations (as torch.nn's `activation` module groups them) and other elementwise ops. One
//! [`Elementwise`] trait gives every unary op its ports (any layout), shape inference (same
//! shape) and run loop (a contiguous copy mapped in place); an op supplies only its kind and its
//! function: [`Gelu`](super::Gelu), [`Silu`], [`Scale`]. [`SwiGlu`] is the gated binary form
//! (`silu(gate) * up`); [`Softmax`] normalizes token-major rows with [`softmax_in_place`], the
//! row function every attention kernel uses.

use std::fmt;

use super::add::{binary_operands, same_shapes};
use super::dims;
use super::layout::token_rows;
use crate::graph::{port_any, Kernel, KernelCtx, KernelOut, Port, Shape, Tensor};
use crate::kernels::layout::ports;

/// A unary elementwise op: `y[i] = f(x[i])` over any layout. Implementors get [`Kernel`].
pub trait Elementwise: Send + Sync + fmt::Debug {
    /// The op kind (graph JSON `kind`).
    const KIND: &'static str;
    /// Apply the function in place to contiguous values (any split gives the same bits).
    fn apply(&self, y: &mut [f32]);
    /// `f` of every value into a new vector (default: a copy, then [`Elementwise::apply`]); an
    /// op overrides it to write its output in one pass.
    fn map(&self, x: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        self.apply(&mut y);
        y
    }
    /// The op's parameters for the graph JSON (none by default).
    fn parameters(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

impl<T: Elementwise> Kernel for T {
    fn kind(&self) -> &'static str {
        T::KIND
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port_any("x")]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port_any("y")]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        if let Some(x) = inputs[0].as_slice() {
            return Ok(vec![super::tensor(inputs[0].shape(), self.map(x))?]);
        }
        let mut y = inputs[0].as_standard_layout().into_owned();
        let s = y
            .as_slice_mut()
            .ok_or_else(|| format!("{} output not contiguous", T::KIND))?;
        self.apply(s);
        Ok(vec![y])
    }
    fn params(&self) -> serde_json::Value {
        self.parameters()
    }
}

/// `x * sigmoid(x)` as `x / (1 + exp(-x))`.
///
/// Upstream: pytorch v2.11.0 aten/src/ATen/native/cpu/Activation.cpp `silu_kernel`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU, elementwise, any layout (`nn.SiLU`): [`silu`].
#[derive(Debug, Clone, Default)]
pub struct Silu;

impl Elementwise for Silu {
    const KIND: &'static str = "silu";
    fn apply(&self, y: &mut [f32]) {
        for v in y {
            *v = silu(*v);
        }
    }
}

/// `y = x * factor`, any layout (Granite's `inputs_embeds * embedding_multiplier`).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteModel.forward`.
#[derive(Debug, Clone)]
pub struct Scale {
    /// The multiplier.
    pub factor: f32,
}

impl Elementwise for Scale {
    const KIND: &'static str = "scale";
    fn apply(&self, y: &mut [f32]) {
        let f = self.factor;
        for v in y {
            *v *= f;
        }
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"factor": self.factor})
    }
}

/// SwiGLU: `silu(gate) * up`, token-major.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteMLP.forward` (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`); LLaMA-style MLPs.
#[derive(Debug, Clone, Default)]
pub struct SwiGlu;

impl Kernel for SwiGlu {
    ports!("swiglu", [gate: TokenMajor, up: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        token_rows(&inputs[0], "gate")?;
        same_shapes(inputs, ["gate", "up"])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let (gate, up) = binary_operands(inputs, ["gate", "up"])?;
        let mut y = gate.into_owned();
        let ys = y.as_slice_mut().ok_or("output not contiguous")?;
        for (g, &u) in ys.iter_mut().zip(up) {
            *g = silu(*g) * u;
        }
        Ok(vec![y])
    }
}

/// Softmax of a row in place: max, `exp(x - max)`, f64 sum, multiply by `1 / sum`.
pub fn softmax_in_place(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v as f64;
    }
    let inv = (1.0 / s) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Softmax over the channels of token-major rows (float32, as the reference's mid softmax).
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarEncoder.forward`
/// (`torch.softmax(mid_logits, dim=-1)`).
#[derive(Debug, Clone, Default)]
pub struct Softmax;

impl Kernel for Softmax {
    ports!("softmax", [x: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        token_rows(&inputs[0], "x")?;
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let mut y = inputs[0].as_standard_layout().into_owned();
        if s[1] > 0 {
            for row in y
                .as_slice_mut()
                .ok_or("output not contiguous")?
                .chunks_exact_mut(s[1])
            {
                softmax_in_place(row);
            }
        }
        Ok(vec![y])
    }
}
