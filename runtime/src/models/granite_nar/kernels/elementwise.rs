//! Elementwise kernels: SiLU (the scaled residual add is `crate::kernels::add::Add::scaled`),
//! a scalar multiply, and an identity marker.

use crate::graph::{port, port_any, Kernel, KernelCtx, Layout, Port, Shape, Tensor};

use super::silu;

/// SiLU, elementwise, any layout (`nn.SiLU`).
///
/// Upstream: pytorch v2.11.0 aten/src/ATen/native/cpu/Activation.cpp `silu_kernel`
/// (`x / (1 + exp(-x))`).
#[derive(Debug, Clone, Default)]
pub struct Silu;

impl Kernel for Silu {
    fn kind(&self) -> &'static str {
        "silu"
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
    fn run(
        &self,
        _ctx: &KernelCtx,
        inputs: &[&Tensor],
        _weights: &[&Tensor],
    ) -> Result<Vec<Tensor>, String> {
        Ok(vec![inputs[0].mapv(silu)])
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

impl Kernel for Scale {
    fn kind(&self) -> &'static str {
        "scale"
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
    fn run(
        &self,
        _ctx: &KernelCtx,
        inputs: &[&Tensor],
        _weights: &[&Tensor],
    ) -> Result<Vec<Tensor>, String> {
        let f = self.factor;
        Ok(vec![inputs[0].mapv(|v| v * f)])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"factor": self.factor})
    }
}

/// Identity copy of a token-major edge: marks the end of a stack whose output the reference
/// captures as one module (the projector's Q-Former).
#[derive(Debug, Clone, Default)]
pub struct Identity;

impl Kernel for Identity {
    fn kind(&self) -> &'static str {
        "identity"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        Ok(vec![inputs[0].clone()])
    }
    fn run(
        &self,
        _ctx: &KernelCtx,
        inputs: &[&Tensor],
        _weights: &[&Tensor],
    ) -> Result<Vec<Tensor>, String> {
        Ok(vec![inputs[0].to_owned()])
    }
}
