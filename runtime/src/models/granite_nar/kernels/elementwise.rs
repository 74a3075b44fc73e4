//! Elementwise kernels: SiLU, the scaled residual add (the seam for `ParamFault::SkipBranch`),
//! a scalar multiply, and an identity marker.

use crate::faults::ParamFault;
use crate::graph::{port, port_any, Kernel, KernelCtx, Layout, Port, Shape, Tensor};
use crate::kernels::data;

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

/// `y = a + scale * b` (a residual add whose branch is scaled: the conformer's macaron
/// half-step `0.5`, Granite's `residual_multiplier`; `scale = 1` is a plain add, the
/// self-conditioning bypass). Same shape and layout. Fault seam: [`ParamFault::SkipBranch`]
/// returns `a`.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerBlock.forward` (`0.5 * self.ff1(h) + h`); src/transformers/models/granite/
/// modeling_granite.py `GraniteDecoderLayer.forward` (`residual + h * self.residual_multiplier`).
#[derive(Debug, Clone)]
pub struct ScaledAdd {
    /// Branch multiplier.
    pub scale: f32,
    /// Fault only: drop the branch.
    skip_branch: bool,
}

impl ScaledAdd {
    /// `a + scale * b`.
    pub fn new(scale: f32) -> Self {
        ScaledAdd {
            scale,
            skip_branch: false,
        }
    }
}

impl Kernel for ScaledAdd {
    fn kind(&self) -> &'static str {
        "scaled_add"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port_any("a"), port_any("b")]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port_any("y")]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        if inputs[0] != inputs[1] {
            return Err(format!(
                "a {} and b {} differ",
                crate::graph::fmt_shape(&inputs[0]),
                crate::graph::fmt_shape(&inputs[1])
            ));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(
        &self,
        _ctx: &KernelCtx,
        inputs: &[&Tensor],
        _weights: &[&Tensor],
    ) -> Result<Vec<Tensor>, String> {
        if inputs[0].shape() != inputs[1].shape() {
            return Err(format!(
                "a {:?} and b {:?} differ",
                inputs[0].shape(),
                inputs[1].shape()
            ));
        }
        let mut y = inputs[0].as_standard_layout().into_owned();
        if !self.skip_branch {
            let b = data(inputs[1], "b")?;
            let ys = y.as_slice_mut().ok_or("output not contiguous")?;
            if self.scale == 1.0 {
                for (o, &v) in ys.iter_mut().zip(b) {
                    *o += v;
                }
            } else {
                for (o, &v) in ys.iter_mut().zip(b) {
                    *o += v * self.scale;
                }
            }
        }
        Ok(vec![y])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"scale": self.scale, "skip_branch": self.skip_branch})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::SkipBranch => Some(Box::new(ScaledAdd {
                skip_branch: true,
                ..self.clone()
            })),
            _ => None,
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
