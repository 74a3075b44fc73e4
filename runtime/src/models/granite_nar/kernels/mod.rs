//! Granite-NAR-specific kernels (the generic ones live in `crate::kernels`): block-local Shaw
//! attention, the conformer conv module pieces (pointwise conv, GLU, depthwise conv, BatchNorm),
//! SiLU, scaled residual adds, the self-conditioning and BPE-CTC pieces, the projector's window
//! ops and windowed cross-attention, and the Granite LM's RMSNorm, RoPE, GQA attention and SwiGLU.
//!
//! Files: `elementwise.rs`, `conformer.rs`, `ctc.rs`, `rows.rs`, `projector.rs`, `lm.rs`.
//!
//! All tensors are f32 in standard layout. Reductions that PyTorch does in f32 are done here in
//! f32 or f64 (never less precise); the tolerance budget of the parity tests covers the
//! difference in summation order.

mod conformer;
mod ctc;
mod elementwise;
mod lm;
mod projector;
mod rows;

pub use conformer::{BatchNorm, DepthwiseConv, Glu, Pointwise, ShawBlockAttention};
pub use ctc::{Column, PosteriorPool, Softmax};
pub use elementwise::{Identity, Scale, Silu};
pub use lm::{apply_rope, GqaAttention, RmsNorm, SwiGlu};
pub use projector::{AddWindowPositions, QueryInit, WindowCrossAttention, WindowPad};
pub use rows::{AudioPrefix, ChannelSlice, ConcatChannels, ConcatRows, TailRows, MAX_CONCAT};

use crate::graph::{Dim, Shape};
use crate::kernels::{fixed, rank};

/// Symbol: mel frames kept by the frontend.
pub const SYM_MEL_FRAMES: &str = "mel_frames";
/// Symbol: encoder frames (contract `enc_frames`).
pub const SYM_ENC_FRAMES: &str = "enc_frames";
/// Symbol: pooled BPE-CTC frames `ceil(enc_frames / bpe_pooling_window)`.
pub const SYM_BPE_FRAMES: &str = "bpe_frames";
/// Symbol: the projector's zero-padded rows `ceil(enc_frames / block_size) * block_size`.
pub const SYM_PROJ_ROWS: &str = "proj_rows";
/// Symbol: projector tokens `ceil(enc_frames / block_size) * n_query`.
pub const SYM_PROJ_TOKENS: &str = "proj_tokens";
/// Symbol: audio rows the LM sees, `floor(enc_frames / downsample_rate)`.
pub const SYM_N_AUDIO: &str = "n_audio";
/// Symbol: template length.
pub const SYM_N_TEXT: &str = "n_text";
/// Symbol: `n_audio + n_text`.
pub const SYM_N_TOTAL: &str = "n_total";

/// `x * sigmoid(x)` as `x / (1 + exp(-x))`.
#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Softmax of a row in place: max, `exp(x - max)`, f64 sum, multiply by `1 / sum`.
fn softmax_in_place(x: &mut [f32]) {
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

fn token_rows(s: &Shape, what: &str) -> Result<(Dim, usize), String> {
    rank(s, 2, what)?;
    Ok((s[0].clone(), fixed(&s[1], &format!("{what} features"))?))
}
