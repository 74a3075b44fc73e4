//! Granite-NAR-specific kernels: block-local Shaw attention, the conformer conv module pieces
//! (pointwise conv, GLU, depthwise conv), the self-conditioning and BPE-CTC pieces,
//! the projector's window ops and windowed cross-attention, and row plumbing. The generic ones
//! the family also uses live in `crate::kernels`: SiLU, scale, SwiGLU and row softmax
//! (`activation`), RMSNorm and BatchNorm (`layer_norm`), GQA attention with RoPE (`gqa`), the scaled
//! residual add (`add`).
//!
//! Files: `conformer.rs`, `ctc.rs`, `rows.rs`, `projector.rs`.
//!
//! All tensors are f32 in standard layout. Reductions that PyTorch does in f32 are done here in
//! f32 or f64 (never less precise); the tolerance budget of the parity tests covers the
//! difference in summation order.

mod conformer;
mod ctc;
mod projector;
mod rows;

pub use conformer::{DepthwiseConv, Glu, Pointwise, ShawBlockAttention};
pub use ctc::{Column, PosteriorPool};
pub use projector::{AddWindowPositions, QueryInit, WindowCrossAttention, WindowPad};
pub use rows::{
    AudioPrefix, ChannelSlice, ConcatChannels, ConcatRows, Identity, TailRows, MAX_CONCAT,
};

use crate::kernels::activation::sigmoid;
use crate::kernels::activation::softmax_in_place;
use crate::kernels::layout::token_rows;

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
