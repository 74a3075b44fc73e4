//! Embedding gather: integer ids (carried as f32, exact below 2^24) -> rows of a table.

use super::{data, dims, rank, tensor};
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, Shape, Tensor};
use crate::kernels::layout::ports;

/// `table[ids]` -> token-major `[len(ids), d]` (token embeddings; decoder positions, whose ids are
/// `past .. past + tokens`).
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// `WhisperDecoder.forward` (`embed_tokens(input_ids)`, `WhisperPositionalEmbedding.forward`
/// with `position_ids`).
#[derive(Debug, Clone, Default)]
pub struct Embedding;

impl Kernel for Embedding {
    ports!("embedding", [ids: Plain] -> [y: TokenMajor], weights ["table"]);
    fn points(&self) -> &'static [xray_core::ops::Side] {
        use xray_core::ops::Side;
        &[Side::Out]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 1, "ids")?;
        if weights[0].len() != 2 {
            return Err(format!("table must be [rows, d], got {:?}", weights[0]));
        }
        Ok(vec![vec![inputs[0][0].clone(), Dim::Fixed(weights[0][1])]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let n = dims(inputs[0], 1, "ids")?[0];
        let ts = dims(weights[0], 2, "table")?;
        let (rows, d) = (ts[0], ts[1]);
        let ids = data(inputs[0], "ids")?;
        let t = data(weights[0], "table")?;
        let mut y = vec![0f32; n * d];
        for (i, &id) in ids.iter().enumerate() {
            if !(id >= 0.0 && id.fract() == 0.0 && (id as usize) < rows) {
                return Err(format!(
                    "id {id} at position {i} is not an integer in 0..{rows}"
                ));
            }
            let r = id as usize;
            y[i * d..(i + 1) * d].copy_from_slice(&t[r * d..(r + 1) * d]);
        }
        Ok(vec![tensor(&[n, d], y)?])
    }
}
