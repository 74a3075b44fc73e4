//! Exact-erf GELU, elementwise, any layout (an [`Elementwise`] op).

use super::activation::Elementwise;
use super::{simd, PAR_MIN_WORK};

/// `torch.nn.functional.gelu(x)` (approximate='none'), HF activation `"gelu"`.
///
/// Upstream: transformers v5.24.0 src/transformers/activations.py `GELUActivation`
/// (`nn.functional.gelu`); numerics of pytorch v2.11.0 aten/src/ATen/native/cpu/Activation.cpp.
#[derive(Debug, Clone, Default)]
pub struct Gelu;

impl Elementwise for Gelu {
    const KIND: &'static str = "gelu";
    fn apply(&self, s: &mut [f32]) {
        // Elementwise: any split gives the same bits.
        let chunk = 1 << 14;
        if s.len() >= PAR_MIN_WORK / 8 {
            super::par_rows(s, chunk.min(s.len()).max(1), chunk * 8, |_, part| {
                simd::gelu_inplace(part)
            });
        } else {
            simd::gelu_inplace(s);
        }
    }
    fn map(&self, x: &[f32]) -> Vec<f32> {
        simd::gelu_to_vec(x)
    }
}
