//! Elementwise additions: the residual add and the add of a learned table (positional embedding).

use super::{data, dims, fixed, par_zip_map, rank, simd, tensor};
use crate::faults::ParamFault;
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, LearnedTable, Shape, Tensor};
use crate::kernels::layout::ports;

/// `y = a + scale * b`, same shape and layout (residual connections: `a` = the residual stream,
/// `b` = the branch; `scale` is 1 for a plain add, 0.5 for the conformer's macaron half-step,
/// Granite's `residual_multiplier`).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerBlock.forward` (`0.5 * self.ff1(h) + h`); src/transformers/models/granite/
/// modeling_granite.py `GraniteDecoderLayer.forward` (`residual + h * self.residual_multiplier`).
#[derive(Debug, Clone)]
pub struct Add {
    /// Branch multiplier.
    scale: f32,
    /// Fault only: drop the branch and return `a` (see [`ParamFault::SkipBranch`]).
    skip_branch: bool,
}

impl Default for Add {
    fn default() -> Self {
        Add::new()
    }
}

impl Add {
    /// A plain add.
    pub fn new() -> Self {
        Add::scaled(1.0)
    }

    /// `a + scale * b`.
    pub fn scaled(scale: f32) -> Self {
        Add {
            scale,
            skip_branch: false,
        }
    }
}

impl Kernel for Add {
    ports!("add", [a: Any, b: Any] -> [y: Any]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        same_shapes(inputs, ["a", "b"])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let (a, b) = binary_operands(inputs, ["a", "b"])?;
        if self.skip_branch {
            return Ok(vec![a.into_owned()]);
        }
        let a = a.as_slice().ok_or("add input not contiguous")?;
        let scale = self.scale;
        let y = if scale == 1.0 {
            par_zip_map(a, b, |x, z| x + z)
        } else {
            par_zip_map(a, b, |x, z| x + z * scale)
        };
        Ok(vec![tensor(inputs[0].shape(), y)?])
    }
    fn params(&self) -> serde_json::Value {
        match (self.scale == 1.0, self.skip_branch) {
            (true, false) => serde_json::Value::Null,
            (true, true) => serde_json::json!({"skip_branch": true}),
            (false, s) => serde_json::json!({"scale": self.scale, "skip_branch": s}),
        }
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::SkipBranch => Some(Box::new(Add {
                skip_branch: true,
                ..self.clone()
            })),
            _ => None,
        }
    }
}

/// Shape inference of an elementwise binary op: its two inputs (named `names`) have one shape,
/// the output's.
pub(crate) fn same_shapes(inputs: &[Shape], names: [&str; 2]) -> Result<Vec<Shape>, String> {
    if inputs[0] != inputs[1] {
        return Err(format!(
            "{} {} and {} {} differ",
            names[0],
            crate::graph::fmt_shape(&inputs[0]),
            names[1],
            crate::graph::fmt_shape(&inputs[1])
        ));
    }
    Ok(vec![inputs[0].clone()])
}

/// The operands of an elementwise binary op at run time, checked to have one shape: the output
/// buffer (a contiguous copy of the first, to be updated in place) and the second's values.
pub(crate) fn binary_operands<'a>(
    inputs: &[&'a Tensor],
    names: [&str; 2],
) -> Result<(ndarray::CowArray<'a, f32, ndarray::IxDyn>, &'a [f32]), String> {
    if inputs[0].shape() != inputs[1].shape() {
        return Err(format!(
            "{} {:?} and {} {:?} differ",
            names[0],
            inputs[0].shape(),
            names[1],
            inputs[1].shape()
        ));
    }
    let b = data(inputs[1], names[1])?;
    Ok((inputs[0].as_standard_layout(), b))
}

/// `y = x + table`, token-major `[rows, d]` plus a weight of the same shape (Whisper's encoder
/// adds `embed_positions.weight`, all 1500 rows, to the conv output).
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// `WhisperEncoder.forward` (`inputs_embeds + self.embed_positions(all_positions)`).
#[derive(Debug, Clone, Default)]
pub struct AddTable;

impl Kernel for AddTable {
    ports!("add_table", [x: TokenMajor] -> [y: TokenMajor], weights ["table"]);
    fn table(&self) -> Option<LearnedTable> {
        Some(LearnedTable {
            role: "table",
            positions: true,
            added: true,
        })
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 2, "x")?;
        let r = fixed(&inputs[0][0], "x rows")?;
        let d = fixed(&inputs[0][1], "x features")?;
        if weights[0] != [r, d] {
            return Err(format!("table must be [{r}, {d}], got {:?}", weights[0]));
        }
        Ok(vec![vec![Dim::Fixed(r), Dim::Fixed(d)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        if weights[0].shape() != s.as_slice() {
            return Err(format!(
                "table {:?} does not match x {s:?}",
                weights[0].shape()
            ));
        }
        let mut y = inputs[0].as_standard_layout().into_owned();
        let t = data(weights[0], "table")?;
        simd::add_inplace(y.as_slice_mut().ok_or("add output not contiguous")?, t);
        Ok(vec![y])
    }
}
