//! Exact-erf GELU, elementwise, any layout.

use super::{simd, PAR_MIN_WORK};
use crate::graph::{port_any, Kernel, KernelCtx, Port, Shape, Tensor};

/// `torch.nn.functional.gelu(x)` (approximate='none'), HF activation `"gelu"`.
///
/// Upstream: transformers v5.24.0 src/transformers/activations.py `GELUActivation`
/// (`nn.functional.gelu`); numerics of pytorch v2.11.0 aten/src/ATen/native/cpu/Activation.cpp.
#[derive(Debug, Clone, Default)]
pub struct Gelu;

impl Kernel for Gelu {
    fn kind(&self) -> &'static str {
        "gelu"
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
        let mut y = inputs[0].as_standard_layout().into_owned();
        let s = y.as_slice_mut().ok_or("gelu output not contiguous")?;
        // Elementwise: any split gives the same bits.
        let chunk = 1 << 14;
        if s.len() >= PAR_MIN_WORK / 8 {
            super::par_rows(s, chunk.min(s.len()).max(1), chunk * 8, |_, part| {
                simd::gelu_inplace(part)
            });
        } else {
            simd::gelu_inplace(s);
        }
        Ok(vec![y])
    }
}
