//! Declared layout transforms (bit-exact copies): the only way an edge changes physical layout;
//! and [`ports!`](crate::kernels::layout::ports), the declaration of a kernel's ports.

use super::{data, dims, fixed, rank, tensor};
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, Shape, Tensor};

/// The declarations of a [`Kernel`] impl, written once: its kind, input and output ports (each
/// `name: Layout`, or `name: Any` for a layout-polymorphic port), when it reads weights, its
/// weight roles in order, and `layout = true` for a layout transform ([`Kernel::is_layout`]).
///
/// ```ignore
/// impl Kernel for LayerNorm {
///     ports!("layer_norm", [x: TokenMajor] -> [y: TokenMajor], weights ["weight", "bias"]);
///     fn infer(..) ..
/// }
/// ```
macro_rules! ports {
    ($kind:literal, [$($i:ident: $il:ident),* $(,)?] -> [$($o:ident: $ol:ident),* $(,)?]
        $(, weights [$($w:literal),* $(,)?])? $(, layout = $layout:literal)? $(,)?) => {
        fn kind(&self) -> &'static str {
            $kind
        }
        fn inputs(&self) -> Vec<$crate::graph::Port> {
            vec![$($crate::kernels::layout::ports!(@port $i $il)),*]
        }
        fn outputs(&self) -> Vec<$crate::graph::Port> {
            vec![$($crate::kernels::layout::ports!(@port $o $ol)),*]
        }
        $(fn weight_roles(&self) -> Vec<&'static str> {
            vec![$($w),*]
        })?
        $(fn is_layout(&self) -> bool {
            $layout
        })?
    };
    (@port $n:ident Any) => {
        $crate::graph::port_any(stringify!($n))
    };
    (@port $n:ident $l:ident) => {
        $crate::graph::port(stringify!($n), $crate::graph::Layout::$l)
    };
}
pub(crate) use ports;

/// channel_major `[C, T]` -> token_major `[T, C]`.
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// `WhisperEncoder.forward` (`inputs_embeds.permute(0, 2, 1)`).
#[derive(Debug, Clone, Default)]
pub struct ChannelToToken;

impl Kernel for ChannelToToken {
    ports!("channel_to_token_major", [x: ChannelMajor] -> [y: TokenMajor], layout = true);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 2, "x")?;
        Ok(vec![vec![inputs[0][1].clone(), inputs[0][0].clone()]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let (c, t) = (s[0], s[1]);
        let x = data(inputs[0], "x")?;
        let mut y = vec![0f32; c * t];
        const B: usize = 32;
        for c0 in (0..c).step_by(B) {
            for t0 in (0..t).step_by(B) {
                for ci in c0..(c0 + B).min(c) {
                    for ti in t0..(t0 + B).min(t) {
                        y[ti * c + ci] = x[ci * t + ti];
                    }
                }
            }
        }
        Ok(vec![tensor(&[t, c], y)?])
    }
}

/// token_major `[T, H * D]` -> head_major `[H, T, D]` (split heads).
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// `WhisperAttention.forward` (`.view(*, -1, head_dim).transpose(1, 2)`).
#[derive(Debug, Clone)]
pub struct SplitHeads {
    /// Number of heads.
    pub heads: usize,
}

impl SplitHeads {
    /// The width of one head of `f` features (`f` must split evenly into the heads).
    fn head_dim(&self, f: usize) -> Result<usize, String> {
        if self.heads == 0 || !f.is_multiple_of(self.heads) {
            return Err(format!(
                "{f} features do not split into {} heads",
                self.heads
            ));
        }
        Ok(f / self.heads)
    }
}

impl Kernel for SplitHeads {
    ports!("token_to_head_major", [x: TokenMajor] -> [y: HeadMajor], layout = true);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 2, "x")?;
        let d = self.head_dim(fixed(&inputs[0][1], "x features")?)?;
        Ok(vec![vec![
            Dim::Fixed(self.heads),
            inputs[0][0].clone(),
            Dim::Fixed(d),
        ]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let (t, f) = (s[0], s[1]);
        let (h, d) = (self.heads, self.head_dim(f)?);
        let x = data(inputs[0], "x")?;
        let mut y = vec![0f32; t * f];
        // One head's `[T, D]` block per output row of `par_rows` (exact copies, any split).
        super::par_rows(&mut y, t * d, t * d, |h0, heads| {
            for (j, yh) in heads.chunks_exact_mut(t * d).enumerate() {
                let hi = h0 + j;
                for (ti, row) in yh.chunks_exact_mut(d).enumerate() {
                    row.copy_from_slice(&x[ti * f + hi * d..ti * f + (hi + 1) * d]);
                }
            }
        });
        Ok(vec![tensor(&[h, t, d], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"heads": self.heads})
    }
}

/// head_major `[H, T, D]` -> token_major `[T, H * D]` (merge heads).
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// `eager_attention_forward` (`attn_output.transpose(1, 2)`) + `WhisperAttention.forward`
/// (`reshape(*input_shape, -1)`).
#[derive(Debug, Clone, Default)]
pub struct MergeHeads;

impl Kernel for MergeHeads {
    ports!("head_to_token_major", [x: HeadMajor] -> [y: TokenMajor], layout = true);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 3, "x")?;
        let h = fixed(&inputs[0][0], "heads")?;
        let d = fixed(&inputs[0][2], "head_dim")?;
        Ok(vec![vec![inputs[0][1].clone(), Dim::Fixed(h * d)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 3, "x")?;
        let (h, t, d) = (s[0], s[1], s[2]);
        let x = data(inputs[0], "x")?;
        let f = h * d;
        let mut y = vec![0f32; t * f];
        // Token rows split across the pool (exact copies, any split).
        super::par_rows(&mut y, f, f, |t0, rows| {
            for (j, row) in rows.chunks_exact_mut(f).enumerate() {
                let ti = t0 + j;
                for (hi, part) in row.chunks_exact_mut(d).enumerate() {
                    part.copy_from_slice(&x[(hi * t + ti) * d..(hi * t + ti + 1) * d]);
                }
            }
        });
        Ok(vec![tensor(&[t, f], y)?])
    }
}

/// A token-major `[rows, features]` shape: its row dim and its fixed feature count.
pub(crate) fn token_rows(s: &Shape, what: &str) -> Result<(Dim, usize), String> {
    rank(s, 2, what)?;
    Ok((s[0].clone(), fixed(&s[1], &format!("{what} features"))?))
}
