//! 1-D convolution over channel-major `[channels, time]` input: on AVX-512 the packed GEMM of
//! `gemm512` with the input's windows packed into its panels, elsewhere im2col + sgemm.

use super::{
    bias, bias_shape, data, dims, fixed, par_init_rows, par_rows, rank, sgemm, tensor, RowInit,
};
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, Shape, Tensor};
use crate::kernels::layout::ports;

/// `torch.nn.Conv1d(c_in, c_out, kernel_size, stride, padding)` with bias, zero padding.
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// `WhisperEncoder.__init__` (conv1: k=3, padding=1; conv2: k=3, stride=2, padding=1).
#[derive(Debug, Clone)]
pub struct Conv1d {
    /// Kernel width.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
}

impl Conv1d {
    fn out_len(&self, l: usize) -> Result<usize, String> {
        if self.stride == 0 || l + 2 * self.padding < self.kernel {
            return Err(format!(
                "input length {l} too short for kernel {} (padding {})",
                self.kernel, self.padding
            ));
        }
        Ok((l + 2 * self.padding - self.kernel) / self.stride + 1)
    }
}

impl Kernel for Conv1d {
    ports!("conv1d", [x: ChannelMajor] -> [y: ChannelMajor], weights ["weight", "bias"]);
    fn points(&self) -> &'static [xray_core::ops::Side] {
        use xray_core::ops::Side;
        &[Side::In, Side::Out]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 2, "x")?;
        let c = fixed(&inputs[0][0], "x channels")?;
        let l = fixed(&inputs[0][1], "x length")?;
        let w = &weights[0];
        if w.len() != 3 || w[1] != c || w[2] != self.kernel {
            return Err(format!(
                "weight must be [out, {c}, {}], got {w:?}",
                self.kernel
            ));
        }
        bias_shape(weights, w[0])?;
        Ok(vec![vec![Dim::Fixed(w[0]), Dim::Fixed(self.out_len(l)?)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let (c, l) = (s[0], s[1]);
        let ws = dims(weights[0], 3, "weight")?;
        let (co, kw) = (ws[0], ws[2]);
        if ws[1] != c || kw != self.kernel {
            return Err(format!(
                "weight {ws:?} does not fit input channels {c} / kernel {}",
                self.kernel
            ));
        }
        let lo = self.out_len(l)?;
        let x = data(inputs[0], "x")?;
        let w = data(weights[0], "weight")?;
        let b = bias(weights, co)?;
        let kk = c * kw;
        if super::gemm512::available() && x.len() == c * l && w.len() == co * kk {
            // y[co, t] = W[co, (ci, j)] . x[ci, t * stride + j - padding]: the packed GEMM with
            // W as its rows and the input's windows packed straight into its panels (no im2col
            // matrix), the bias per output row.
            let (stride, pad) = (self.stride, self.padding);
            let pack = |p: usize, dst: &mut [f32]| {
                let nr = super::gemm512::NR;
                let cols = nr.min(lo - p * nr);
                for ci in 0..c {
                    let xr = &x[ci * l..(ci + 1) * l];
                    for j in 0..kw {
                        let row = &mut dst[(ci * kw + j) * nr..(ci * kw + j) * nr + cols];
                        for (jt, v) in row.iter_mut().enumerate() {
                            let q = ((p * nr + jt) * stride + j) as isize - pad as isize;
                            if q >= 0 && (q as usize) < l {
                                *v = xr[q as usize];
                            }
                        }
                    }
                }
            };
            let y = super::gemm512::gemm(co, kk, lo, w, pack, super::gemm512::Bias::Rows(b))?;
            return Ok(vec![tensor(&[co, lo], y)?]);
        }
        // im2col: cols[(ci * k + j), t] = x[ci, t * stride + j - padding] (0 outside).
        let mut cols = vec![0f32; kk * lo];
        par_rows(&mut cols, lo, lo, |r0, part| {
            for (i, row) in part.chunks_exact_mut(lo).enumerate() {
                let (ci, j) = ((r0 + i) / kw, (r0 + i) % kw);
                let xr = &x[ci * l..(ci + 1) * l];
                for (t, v) in row.iter_mut().enumerate() {
                    let p = (t * self.stride + j) as isize - self.padding as isize;
                    if p >= 0 && (p as usize) < l {
                        *v = xr[p as usize];
                    }
                }
            }
        });
        let mut y = par_init_rows(co, lo, RowInit::Splat(b));
        sgemm(co, kk, lo, w, (kk, 1), &cols, (lo, 1), 1.0, &mut y, (lo, 1))?;
        Ok(vec![tensor(&[co, lo], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"kernel": self.kernel, "stride": self.stride, "padding": self.padding})
    }
}
