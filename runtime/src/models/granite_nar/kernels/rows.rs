//! Row / channel plumbing: channel concat and slice (capture fan-out, per-slice LayerNorm), the
//! LM input rows (audio prefix, row concat) and output rows (text tail), and an identity marker.

use crate::graph::{port, Dim, Kernel, KernelCtx, KernelOut, Layout, Port, Shape, Tensor};
use crate::kernels::layout::ports;
use crate::kernels::{data, dims, rank, same_dim, tensor};

use super::{token_rows, SYM_N_AUDIO, SYM_N_TOTAL};

const PORT_NAMES: [&str; 16] = [
    "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13", "x14",
    "x15",
];

/// Most inputs a [`ConcatChannels`] takes.
pub const MAX_CONCAT: usize = PORT_NAMES.len();

/// Concatenate token-major rows along channels: `[T, d_0], ..., [T, d_{n-1}] -> [T, sum d_i]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.capture_features`
/// (`torch.cat(..., dim=-1)`), `GraniteNarProjector.forward` (per-slice LayerNorm concat).
#[derive(Debug, Clone)]
pub struct ConcatChannels {
    /// Number of inputs (at most [`MAX_CONCAT`]).
    pub n: usize,
}

impl Kernel for ConcatChannels {
    fn kind(&self) -> &'static str {
        "concat_channels"
    }
    fn inputs(&self) -> Vec<Port> {
        PORT_NAMES
            .iter()
            .take(self.n)
            .map(|&p| port(p, Layout::TokenMajor))
            .collect()
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        if self.n == 0 || self.n > MAX_CONCAT {
            return Err(format!("{} inputs; 1..={MAX_CONCAT} supported", self.n));
        }
        let (rows, _) = token_rows(&inputs[0], "x0")?;
        let mut total = 0;
        for (i, s) in inputs.iter().enumerate() {
            let (r, c) = token_rows(s, PORT_NAMES[i])?;
            same_dim(&rows, &r, "rows of the concatenated inputs")?;
            total += c;
        }
        Ok(vec![vec![rows, Dim::Fixed(total)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let shapes: Vec<Vec<usize>> = inputs
            .iter()
            .map(|t| dims(t, 2, "x"))
            .collect::<Result<_, _>>()?;
        let t = shapes.first().map(|s| s[0]).unwrap_or(0);
        if shapes.iter().any(|s| s[0] != t) {
            return Err(format!("row counts differ: {shapes:?}"));
        }
        let total: usize = shapes.iter().map(|s| s[1]).sum();
        let mut y = vec![0f32; t * total];
        let mut off = 0;
        for (x, s) in inputs.iter().zip(&shapes) {
            let xd = data(x, "x")?;
            let c = s[1];
            for r in 0..t {
                y[r * total + off..r * total + off + c].copy_from_slice(&xd[r * c..(r + 1) * c]);
            }
            off += c;
        }
        Ok(vec![tensor(&[t, total], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"inputs": self.n})
    }
}

/// Channels `start .. start + len` of token-major rows.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarProjector.forward` (`x[:, :, i]` of the
/// `[B, T, L, E]` view).
#[derive(Debug, Clone)]
pub struct ChannelSlice {
    /// First channel.
    pub start: usize,
    /// Channels.
    pub len: usize,
}

impl Kernel for ChannelSlice {
    ports!("channel_slice", [x: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, c) = token_rows(&inputs[0], "x")?;
        if self.start + self.len > c {
            return Err(format!(
                "channels {}..{} of {c}",
                self.start,
                self.start + self.len
            ));
        }
        Ok(vec![vec![rows, Dim::Fixed(self.len)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        if self.start + self.len > s[1] {
            return Err(format!(
                "channels {}..{} of {}",
                self.start,
                self.start + self.len,
                s[1]
            ));
        }
        let x = data(inputs[0], "x")?;
        let y: Vec<f32> = x
            .chunks_exact(s[1])
            .flat_map(|r| r[self.start..self.start + self.len].iter().copied())
            .collect();
        Ok(vec![tensor(&[s[0], self.len], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"start": self.start, "len": self.len})
    }
}

/// The audio rows the LM sees: the first `floor(enc_frames / downsample)` projector tokens,
/// divided by `divisor` (`embedding_multiplier` when `scale_projected_embeddings`). Inputs: the
/// projector output `[proj_tokens, D]` and any `[enc_frames, *]` edge (its row count is
/// `enc_frames`). Output `[n_audio, D]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.forward`
/// (`audio_embeds / embedding_multiplier`, `n_audio = T // downsample_rate`) and `decode_text`
/// (`audio_embeds[:, :n_audio]`).
#[derive(Debug, Clone)]
pub struct AudioPrefix {
    /// Encoder frames per audio row.
    pub downsample: usize,
    /// Divides every element (None: no scaling).
    pub divisor: Option<f32>,
}

impl Kernel for AudioPrefix {
    ports!("audio_prefix", [x: TokenMajor, frames: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        rank(&inputs[1], 2, "frames")?;
        if self.downsample == 0 {
            return Err("downsample must be positive".into());
        }
        Ok(vec![vec![Dim::sym(SYM_N_AUDIO), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let frames = dims(inputs[1], 2, "frames")?[0];
        if self.downsample == 0 {
            return Err("downsample must be positive".into());
        }
        let n = frames / self.downsample;
        if n > s[0] {
            return Err(format!(
                "{frames} frames give {n} audio rows, only {} projector tokens",
                s[0]
            ));
        }
        let x = data(inputs[0], "x")?;
        let y: Vec<f32> = match self.divisor {
            Some(dv) => x[..n * s[1]].iter().map(|&v| v / dv).collect(),
            None => x[..n * s[1]].to_vec(),
        };
        Ok(vec![tensor(&[n, s[1]], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"downsample": self.downsample, "divisor": self.divisor})
    }
}

/// Concatenate token-major rows: `[A, D] + [B, D] -> [n_total, D]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.decode_text`
/// (`torch.cat([audio_embeds[:, :n_audio], text_emb], dim=1)`).
#[derive(Debug, Clone, Default)]
pub struct ConcatRows;

impl Kernel for ConcatRows {
    ports!("concat_rows", [a: TokenMajor, b: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, a) = token_rows(&inputs[0], "a")?;
        let (_, b) = token_rows(&inputs[1], "b")?;
        if a != b {
            return Err(format!("widths {a} and {b} differ"));
        }
        Ok(vec![vec![Dim::sym(SYM_N_TOTAL), Dim::Fixed(a)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let a = dims(inputs[0], 2, "a")?;
        let b = dims(inputs[1], 2, "b")?;
        if a[1] != b[1] {
            return Err(format!("widths {} and {} differ", a[1], b[1]));
        }
        let mut y = data(inputs[0], "a")?.to_vec();
        y.extend_from_slice(data(inputs[1], "b")?);
        Ok(vec![tensor(&[a[0] + b[0], a[1]], y)?])
    }
}

/// The last `len(ids)` rows of token-major `x` (the text rows after the audio prefix): x
/// `[n_total, D]`, ids `[n_text]` -> `[n_text, D]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.decode_text`
/// (`hidden[:, n_audio:]`).
#[derive(Debug, Clone, Default)]
pub struct TailRows;

impl Kernel for TailRows {
    ports!("tail_rows", [x: TokenMajor, ids: Plain] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        rank(&inputs[1], 1, "ids")?;
        Ok(vec![vec![inputs[1][0].clone(), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let n = dims(inputs[1], 1, "ids")?[0];
        if n > s[0] {
            return Err(format!("{n} text rows of {} rows", s[0]));
        }
        let x = data(inputs[0], "x")?;
        tensor(&[n, s[1]], x[(s[0] - n) * s[1]..].to_vec()).map(|t| vec![t])
    }
}

/// Identity copy of a token-major edge: marks the end of a stack whose output the reference
/// captures as one module (the projector's Q-Former).
#[derive(Debug, Clone, Default)]
pub struct Identity;

impl Kernel for Identity {
    ports!("identity", [x: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        Ok(vec![inputs[0].to_owned()])
    }
}
