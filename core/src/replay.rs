//! Reference replay: the vocabulary shared by the oracle (which re-runs one HF module of the
//! reference model on tensors it is handed, `xray_oracle/replay.py`) and the comparison library
//! (which asks what that module would have produced had it been wrong in a specific way,
//! `xray_compare::mechanism`).
//!
//! A [`Counterfactual`] is one specific way a bring-up can get a module wrong: a weight read
//! transposed, a bias dropped, another key of the weight table, a norm's epsilon, a conv's padding.
//! It travels to Python as JSON (`{"kind": "eps", "value": 1e-5}`); `none` replays the module with
//! its own parameters. [`ModuleInfo`] is what the replay reports about the module it ran: its
//! class, its kind (from the class, never from a fault's name), the parameters it read and the
//! other keys of the weight table that have the same shape.

use serde::{Deserialize, Serialize};

/// A number format a tensor is rounded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundFormat {
    /// IEEE half precision.
    F16,
    /// bfloat16 (to nearest, ties to even: torch's `.to(torch.bfloat16)`).
    Bf16,
    /// bfloat16 by dropping the low 16 bits of the f32 (toward zero): a converter's shortcut.
    Bf16Truncated,
    /// bfloat16 to nearest with ties away from zero (`(bits + 0x8000) >> 16`): another
    /// converter's; it differs from `bf16` on exact ties only, which f16-valued weights hold often.
    Bf16TiesAway,
}

impl RoundFormat {
    /// `f16` / `bf16` / `bf16_truncated` / `bf16_ties_away`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoundFormat::F16 => "f16",
            RoundFormat::Bf16 => "bf16",
            RoundFormat::Bf16Truncated => "bf16_truncated",
            RoundFormat::Bf16TiesAway => "bf16_ties_away",
        }
    }

    /// `v` rounded to the format and back to f32 (NaN and infinities kept).
    pub fn round(self, v: f32) -> f32 {
        match self {
            RoundFormat::F16 => half::f16::from_f32(v).to_f32(),
            RoundFormat::Bf16 => half::bf16::from_f32(v).to_f32(),
            _ if !v.is_finite() => v,
            RoundFormat::Bf16Truncated => f32::from_bits(v.to_bits() & 0xFFFF_0000),
            RoundFormat::Bf16TiesAway => {
                f32::from_bits(v.to_bits().wrapping_add(0x8000) & 0xFFFF_0000)
            }
        }
    }
}

/// Elementwise activations a weightless step can compute (a GELU variant, SiLU, ReLU): the
/// `elementwise` signature names them, and the elementwise replay tries each as a counterfactual.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Exact GELU `x·Φ(x)` (erf).
    ErfGelu,
    /// GELU's tanh approximation `0.5x(1 + tanh(sqrt(2/π)(x + 0.044715x³)))`.
    TanhGelu,
    /// Quick GELU `x·σ(1.702x)`.
    QuickGelu,
    /// SiLU / swish `x·σ(x)`.
    Silu,
    /// ReLU `max(x, 0)`.
    Relu,
}

impl Activation {
    /// Every known variant.
    pub const ALL: [Activation; 5] = [
        Activation::ErfGelu,
        Activation::TanhGelu,
        Activation::QuickGelu,
        Activation::Silu,
        Activation::Relu,
    ];

    /// Name as in the evidence (`tanh_gelu`).
    pub fn name(self) -> &'static str {
        match self {
            Activation::ErfGelu => "erf_gelu",
            Activation::TanhGelu => "tanh_gelu",
            Activation::QuickGelu => "quick_gelu",
            Activation::Silu => "silu",
            Activation::Relu => "relu",
        }
    }

    /// The function at `v`.
    pub fn apply(self, v: f64) -> f64 {
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        match self {
            Activation::ErfGelu => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
            Activation::TanhGelu => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * v * (1.0 + (k * (v + 0.044_715 * v * v * v)).tanh())
            }
            Activation::QuickGelu => v * sigmoid(1.702 * v),
            Activation::Silu => v * sigmoid(v),
            Activation::Relu => v.max(0.0),
        }
    }
}

/// Granularity of a symmetric integer grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GridGranularity {
    /// One step for the whole weight.
    PerTensor,
    /// One step per output row (output channel).
    PerRow,
}

/// One way the module could have been computed wrong, replayed through the reference module
/// (`{"kind": ...}` in JSON). Which apply depends on the module's kind ([`ModuleKind`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Counterfactual {
    /// The module with its own parameters: the clean replay.
    None,
    /// The output multiplied by `factor` (a missing or extra scale: an embedding's
    /// `sqrt(d_model)`, a residual multiplier). Solved by least squares on the clean replay.
    OutputScale {
        /// The multiplier.
        factor: f64,
    },
    /// The output rounded to this format (a half-precision activation buffer). Computed on the
    /// clean replay.
    OutputRounded {
        /// The format.
        format: RoundFormat,
    },
    /// Any module whose input has its output's shape: skipped, its input passed through
    /// unchanged (a final norm or projection forgotten).
    Skipped,
    /// Linear: the square weight read transposed (`W^T`).
    TransposeWeight,
    /// Linear (non-square) / conv: the stored weight bytes read in another layout. Linear:
    /// the `[out, in]` buffer taken as `[in, out]` and transposed; conv: the `[out, in, k]`
    /// buffer taken as `[out, k, in]` (a channels-last kernel).
    WeightReinterpreted,
    /// Conv: the kernel flipped along its time axis (a convolution where the module computes a
    /// cross-correlation).
    KernelFlipped,
    /// Linear / conv: the bias left out.
    BiasMissing,
    /// Linear / conv: the bias added twice.
    BiasDoubled,
    /// Linear / conv / norm: the weight times `factor`, the bias kept (a dequantization scale
    /// off, a multiplier folded into the weight alone). Solved by least squares on two replays
    /// (linear / conv: with and without the bias; norm: with and without the affine).
    WeightScaled {
        /// The factor.
        factor: f64,
    },
    /// Linear / conv: the weight left out (zeros: a key that was never loaded).
    WeightMissing,
    /// Linear / conv: the two halves of the output rows swapped (a fused projection, K|V or
    /// gate|up, split in the wrong order).
    HalvesSwapped,
    /// Any module: parameter `role` (`weight`, `bias`) read from another key of the weight table
    /// of the same shape (another layer's same-role module, a sibling projection).
    OtherKey {
        /// The module's parameter name.
        role: String,
        /// The state-dict key read instead.
        key: String,
    },
    /// Linear / conv / norm / embedding: every parameter read from another module of the same
    /// structure, one whose path differs only in its layer indices (layers loaded in the wrong
    /// order, a layer index off by one): `OtherKey` for all of its parameters at once.
    OtherModule {
        /// The module whose parameters were read.
        module: String,
    },
    /// Linear / conv: the weight rounded to this format.
    WeightRounded {
        /// The format.
        format: RoundFormat,
    },
    /// Linear / conv: the weight rounded to a symmetric uniform grid of `bits` bits
    /// (`max|w| / (2^(bits-1) - 1)` per row or per tensor).
    WeightGrid {
        /// Bits, 2..=8.
        bits: u32,
        /// Per tensor or per output row.
        granularity: GridGranularity,
    },
    /// Norm: this epsilon instead of the module's.
    Eps {
        /// The epsilon.
        value: f64,
    },
    /// LayerNorm: the variance divided by `n - 1` (unbiased) instead of `n`.
    UnbiasedVariance,
    /// LayerNorm: the mean not subtracted (RMS statistics, `x / sqrt(mean(x^2) + eps)`, then
    /// the affine): an RMSNorm kernel where the model has a LayerNorm.
    NotCentered,
    /// Norm: weight and bias swapped.
    AffineSwapped,
    /// Norm: no affine transform (weight 1, bias 0).
    AffineMissing,
    /// Norm: the weight left out (ones), the bias kept.
    NormWeightMissing,
    /// Norm: the bias left out (zeros), the weight kept.
    NormBiasMissing,
    /// RMSNorm: `x * (1 + weight)` (a checkpoint storing the offset from one) where the module
    /// scales by `weight`.
    WeightPlusOne,
    /// Norm: `value` added to the weight, `(w + value) * x_hat (+ b)`: a `(1 + w)` convention
    /// applied to a checkpoint that stores `w` itself (`+1`), or a converter that stored `w - 1`
    /// for an engine that does not add the one back (`-1`). Solved by least squares on the
    /// normalized input (the replay without the affine).
    WeightOffset {
        /// The offset.
        value: f64,
    },
    /// BatchNorm: normalized with the batch's own statistics (training mode) instead of the
    /// running mean and variance.
    BatchStatistics,
    /// BatchNorm: the running variance raised to `value`: `0.5`, its square root (a standard
    /// deviation stored where the variance belongs, or the variance read as one); `2`, squared
    /// (a variance read where a standard deviation was expected).
    RunningVarPower {
        /// The power.
        value: f64,
    },
    /// BatchNorm: the running mean left out (zeros).
    RunningMeanMissing,
    /// Conv: the input padded by `left` / `right` frames instead of the module's padding.
    Padding {
        /// Frames of zeros before.
        left: usize,
        /// Frames of zeros after.
        right: usize,
    },
    /// Conv: this stride instead of the module's.
    Stride {
        /// The stride.
        value: usize,
    },
    /// Linear / conv: the module computed in this format as a half-precision matmul computes it:
    /// its weight and its input rounded to the format, the products accumulated in f32 (ggml's
    /// f16 weights with its f16 conversion of the activations; the bias kept in f32). What an
    /// engine's declared precision for an op says; `--local-errors` replays it.
    ComputedIn {
        /// The format.
        format: RoundFormat,
    },
    /// Conv / any: the module's input rounded to this format first.
    InputRounded {
        /// The format.
        format: RoundFormat,
    },
    /// Embedding: every id shifted by `by` (clamped to the table).
    IdOffset {
        /// The shift.
        by: i64,
    },
    /// Attention core: this softmax scale instead of the module's (unscaled scores: 1; the
    /// scale applied twice; another head dimension's). Solved by a search when no simple value
    /// reproduces it.
    AttentionScale {
        /// The scale the scores are multiplied by.
        value: f64,
    },
    /// Attention core: the causal mask on (`true`) or off where the module has the other.
    CausalMask {
        /// Whether the mask is applied.
        on: bool,
    },
    /// Attention core: keys and values swapped.
    KvSwapped,
    /// Attention core with relative positions (Shaw's): the query-key distance taken with its
    /// sign flipped (`j - i` where the module looks up `i - j`: the distance table transposed).
    DistanceMirrored,
    /// Attention core with relative positions (Shaw's): the positional term left out of the
    /// scores (content attention only).
    RelativePositionsDropped,
    /// Attention core with relative positions (Shaw's): the positional scores multiplied by
    /// `value` where the module multiplies them by its softmax scale (1: left unscaled; the
    /// scale squared: scaled twice), the content scores as the module scales them.
    RelativeScale {
        /// The multiplier of the positional scores.
        value: f64,
    },
    /// Attention core: the keys and values of another layer's same attention (a K/V cache
    /// indexed by the wrong layer), from the engine's own projections of that layer. Computed by
    /// replaying the module on those inputs, not by the oracle.
    KvOtherLayer {
        /// The layer whose keys and values the engine attended to.
        layer: usize,
    },
    /// Attention core (not causal): `rows` zero keys and values appended and attended, no mask
    /// hiding them (a K/V buffer padded to a block size and read whole).
    KeysPadded {
        /// The zero rows appended.
        rows: usize,
    },
    /// Attention core: the heads of its output in another order (a head split or merge that
    /// reads the wrong head). Output slot `i` holds the reference's head `slots[i]`. Solved on
    /// the clean replay: each slot matched to the head it is nearest.
    HeadsPermuted {
        /// The head each output slot holds.
        slots: Vec<usize>,
    },
    /// The output's features (its last axis; a channel-major output's channels) in another
    /// order: feature `i` holds the reference's feature `slots[i]` (a weight whose output rows a
    /// converter permuted, or failed to: a rotary interleave, a head order). Solved on the clean
    /// replay, each feature matched to the one it is nearest.
    FeaturesPermuted {
        /// The reference feature each output feature holds.
        slots: Vec<usize>,
    },
    /// The output shifted by `by` frames along its time axis (positive: late; an off-by-one in
    /// a frame index or padding put on the wrong side). Computed on the clean replay; the `|by|`
    /// frames shifted in, which the reference does not hold, are not judged.
    OutputShifted {
        /// Frames; positive means the engine's frame `t` holds the reference's frame `t - by`.
        by: i64,
    },
    /// Attention core with rotary positions: the queries' positions shifted by `by` against the
    /// keys' (a position counter off by one on one side; shifting both changes nothing).
    RopeOffset {
        /// The shift.
        by: i64,
    },
    /// A table added row by row (positional embeddings added to a sequence) read `by` rows off:
    /// row `t` of the output gets row `t + by` of the table (a position counter starting at one,
    /// an offset applied twice). The `|by|` rows the table does not hold are not judged.
    RowOffset {
        /// The offset.
        by: i64,
    },
    /// A weightless combination of observed points (a residual add): input point `input` left
    /// out (the residual stream or the branch missing).
    InputDropped {
        /// The point left out.
        input: String,
    },
    /// A weightless combination of observed points: input point `input` multiplied by `factor`
    /// on top of the reference's coefficient (a residual multiplier missing or applied twice:
    /// the conformer's 0.5 half-step, Granite's `residual_multiplier`). Solved by least squares.
    InputScaled {
        /// The point scaled.
        input: String,
        /// The extra factor.
        factor: f64,
    },
    /// A weightless elementwise step (an activation between two observed points) computing
    /// `function` where the reference computes another (GELU's tanh approximation for the exact
    /// one, SiLU for GELU).
    Activation {
        /// The function the step computes.
        function: Activation,
        /// Through a lookup table in this format: the input rounded to it, the table's value
        /// rounded to it (ggml's f16 GELU table); null for the function computed in f32.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        table: Option<RoundFormat>,
    },
}

/// A solved value for people: the integer it is within `1e-4` of, else six decimals.
fn num(v: f64) -> String {
    if (v - v.round()).abs() <= 1e-4 * v.abs().max(1.0) {
        format!("{}", v.round())
    } else {
        format!("{v:.6}")
    }
}

impl Counterfactual {
    /// A short human phrase: `without its bias`, `with eps 0.1`.
    pub fn phrase(&self) -> String {
        use Counterfactual::*;
        match self {
            None => "with its own parameters".into(),
            OutputScale { factor } if (factor + 1.0).abs() < 1e-4 => {
                "with its output negated".into()
            }
            OutputScale { factor } => format!("with its output scaled by {factor:.6}"),
            OutputRounded { format } => format!("with its output rounded to {}", format.as_str()),
            Skipped => "skipped (its input passed through unchanged)".into(),
            TransposeWeight => "with its weight transposed".into(),
            WeightReinterpreted => "with its weight buffer read in the other layout".into(),
            KernelFlipped => "with its kernel flipped in time".into(),
            BiasMissing => "without its bias".into(),
            BiasDoubled => "with its bias added twice".into(),
            WeightScaled { factor } => format!("with its weight scaled by {factor:.6}"),
            WeightMissing => "with a zero weight (never loaded)".into(),
            HalvesSwapped => "with the two halves of its output rows swapped".into(),
            OtherKey { role, key } => format!("reading its {role} from {key}"),
            OtherModule { module } => format!("reading every parameter from {module} (the same module of another layer)"),
            WeightRounded { format } => format!("with its weight rounded to {}", format.as_str()),
            WeightGrid { bits, granularity } => format!(
                "with its weight on a {bits}-bit symmetric grid ({})",
                match granularity {
                    GridGranularity::PerRow => "per row",
                    GridGranularity::PerTensor => "per tensor",
                }
            ),
            Eps { value } => format!("with eps {value:e}"),
            UnbiasedVariance => "with the unbiased (n-1) variance".into(),
            NotCentered => "without its mean subtracted (RMS statistics)".into(),
            AffineSwapped => "with weight and bias swapped".into(),
            AffineMissing => "without its affine weight and bias".into(),
            NormWeightMissing => "without its weight (ones)".into(),
            NormBiasMissing => "without its bias".into(),
            WeightPlusOne => "scaling by (1 + weight)".into(),
            WeightOffset { value } if *value < 0.0 => {
                format!("with {} subtracted from its weight", num(-value))
            }
            WeightOffset { value } => format!("with {} added to its weight", num(*value)),
            BatchStatistics => "with batch statistics instead of the running ones".into(),
            RunningVarPower { value } if (value - 0.5).abs() < 1e-9 => {
                "with the square root of its running variance (a standard deviation read as the variance)".into()
            }
            RunningVarPower { value } if (value - 2.0).abs() < 1e-9 => {
                "with its running variance squared (the variance read as a standard deviation)".into()
            }
            RunningVarPower { value } => format!("with its running variance to the power {value}"),
            RunningMeanMissing => "without its running mean".into(),
            Padding { left, right } => format!("with padding ({left}, {right})"),
            Stride { value } => format!("with stride {value}"),
            InputRounded { format } => format!("with its input rounded to {}", format.as_str()),
            ComputedIn { format } => format!(
                "computed in {0} (its weight and input rounded to {0}, accumulated in f32)",
                format.as_str()
            ),
            IdOffset { by } => format!("with every id shifted by {by:+}"),
            AttentionScale { value } => format!("with softmax scale {value:.6}"),
            CausalMask { on: true } => "with a causal mask".into(),
            CausalMask { on: false } => "without its causal mask".into(),
            KvSwapped => "with keys and values swapped".into(),
            DistanceMirrored => {
                "with its relative distances mirrored (j - i for i - j: the distance table transposed)"
                    .into()
            }
            RelativePositionsDropped => "without its relative-position scores".into(),
            RelativeScale { value } => {
                format!("with its relative-position scores multiplied by {value:.6}")
            }
            KvOtherLayer { layer } => {
                format!(
                    "attending to layer {layer}'s keys and values (a K/V cache of another layer)"
                )
            }
            KeysPadded { rows } => {
                format!("attending to {rows} zero key/value rows appended without a mask")
            }
            HeadsPermuted { slots } => {
                let moved: Vec<String> = slots
                    .iter()
                    .enumerate()
                    .filter(|(i, h)| i != *h)
                    .map(|(i, h)| format!("slot {i} holds head {h}"))
                    .collect();
                format!("with its heads permuted ({})", moved.join(", "))
            }
            FeaturesPermuted { slots } => {
                let moved: Vec<(usize, usize)> = slots
                    .iter()
                    .copied()
                    .enumerate()
                    .filter(|(i, h)| i != h)
                    .collect();
                let shown: Vec<String> = moved
                    .iter()
                    .take(4)
                    .map(|(i, h)| format!("{i} holds {h}"))
                    .collect();
                format!(
                    "with its output features permuted ({} of {} moved: {}{})",
                    moved.len(),
                    slots.len(),
                    shown.join(", "),
                    if moved.len() > 4 { ", ..." } else { "" }
                )
            }
            OutputShifted { by } => format!("with its output shifted by {by:+} frame(s) in time"),
            RopeOffset { by } => format!("with the queries' rotary positions shifted by {by:+}"),
            RowOffset { by } => format!("with row t of its table read from row t{by:+}"),
            InputDropped { input } => format!("without its input {input}"),
            InputScaled { input, factor } => {
                format!("with its input {input} multiplied by {factor:.6}")
            }
            Activation {
                function,
                table: Option::None,
            } => format!("computing {}", function.name()),
            Activation {
                function,
                table: Some(t),
            } => format!(
                "computing {} through a {} table (input and value rounded to {})",
                function.name(),
                t.as_str(),
                t.as_str()
            ),
        }
    }
}

/// What kind of computation a module is, from its class (`nn.Linear` and subclasses, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleKind {
    /// `nn.Linear`.
    Linear,
    /// `nn.Conv1d`.
    Conv1d,
    /// `nn.LayerNorm`.
    LayerNorm,
    /// An RMSNorm (`nn.RMSNorm`, or a class named `*RMSNorm` with a weight and an epsilon).
    RmsNorm,
    /// `nn.BatchNorm1d`.
    BatchNorm,
    /// `nn.Embedding` (and subclasses: positional tables).
    Embedding,
    /// An attention module's weightless core (scores, mask, softmax, values) from its q / k / v
    /// projections' outputs to its output projection's input, through transformers' own
    /// attention function.
    Attention,
    /// A weightless sum of observed points (a residual add), replayed in Rust: the reference's
    /// coefficients are fitted on its own tensors.
    ResidualAdd,
    /// A weightless elementwise step between two observed points (an activation), replayed in
    /// Rust: the reference's function is identified on its own tensors.
    Elementwise,
    /// Ops the reference computes inline, with no HF module around them (Whisper's encoder adds
    /// its positional table after the convolutions' GELU), replayed through X-Ray's own kernels
    /// for the family's declared ops once those reproduce the reference's own tensors.
    Inline,
    /// Anything else (replayed with its own parameters only).
    Other,
}

impl ModuleKind {
    /// Whether it is a normalization.
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            ModuleKind::LayerNorm | ModuleKind::RmsNorm | ModuleKind::BatchNorm
        )
    }
}

/// One parameter (or buffer) a replayed module read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamInfo {
    /// The module's name for it (`weight`, `bias`, `running_var`).
    pub role: String,
    /// Its state-dict key.
    pub key: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Other keys of the weight table with the same shape, most plausible first (the same role
    /// in other layers, then siblings in the same layer, then the rest); at most a handful.
    #[serde(default)]
    pub same_shape: Vec<String>,
}

/// What a replay reports about the module it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleInfo {
    /// Dotted path from the model's root.
    pub module: String,
    /// The Python class (`Linear`, `WhisperPositionalEmbedding`, `GraniteRMSNorm`).
    pub class: String,
    /// Its kind.
    pub kind: ModuleKind,
    /// The parameters and buffers it read.
    pub params: Vec<ParamInfo>,
    /// Scalar settings: `eps`, `stride`, `padding`, `kernel_size`, `groups`, `has_bias`.
    #[serde(default)]
    pub settings: serde_json::Map<String, serde_json::Value>,
}

impl ModuleInfo {
    /// A setting as an integer list (`padding`, `stride`, `kernel_size`).
    pub fn ints(&self, key: &str) -> Vec<usize> {
        match self.settings.get(key) {
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_u64().map(|x| x as usize))
                .collect(),
            Some(v) => v.as_u64().map(|x| vec![x as usize]).unwrap_or_default(),
            None => vec![],
        }
    }

    /// A float setting (`eps`).
    pub fn float(&self, key: &str) -> Option<f64> {
        self.settings.get(key).and_then(|v| v.as_f64())
    }

    /// A boolean setting (`has_bias`).
    pub fn flag(&self, key: &str) -> bool {
        self.settings
            .get(key)
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    }

    /// The parameter of this role.
    pub fn param(&self, role: &str) -> Option<&ParamInfo> {
        self.params.iter().find(|p| p.role == role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two converter shortcuts against bfloat16 proper: truncation drops the low bits (toward
    /// zero, either sign); ties away differs from ties to even on an exact tie only.
    #[test]
    fn bf16_shortcuts() {
        let up = f32::from_bits(0x3F80_C000); // 1 + 0.75 ULP of bf16
        assert_eq!(RoundFormat::Bf16Truncated.round(up).to_bits(), 0x3F80_0000);
        assert_eq!(RoundFormat::Bf16.round(up).to_bits(), 0x3F81_0000);
        assert_eq!(RoundFormat::Bf16Truncated.round(-up).to_bits(), 0xBF80_0000);
        let tie = f32::from_bits(0x3F80_8000); // exactly half an ULP above 1, even below
        assert_eq!(RoundFormat::Bf16.round(tie).to_bits(), 0x3F80_0000);
        assert_eq!(RoundFormat::Bf16TiesAway.round(tie).to_bits(), 0x3F81_0000);
        assert_eq!(RoundFormat::Bf16TiesAway.round(-tie).to_bits(), 0xBF81_0000);
        assert!(RoundFormat::Bf16TiesAway.round(f32::NAN).is_nan());
        assert_eq!(
            RoundFormat::Bf16Truncated.round(f32::INFINITY),
            f32::INFINITY
        );
    }

    #[test]
    fn counterfactuals_are_kind_tagged() {
        let c = Counterfactual::Eps { value: 1e-5 };
        let j = serde_json::to_value(&c).unwrap();
        assert_eq!(j, serde_json::json!({"kind": "eps", "value": 1e-5}));
        let o: Counterfactual = serde_json::from_value(serde_json::json!({
            "kind": "weight_grid", "bits": 8, "granularity": "per_row"
        }))
        .unwrap();
        assert_eq!(
            o,
            Counterfactual::WeightGrid {
                bits: 8,
                granularity: GridGranularity::PerRow
            }
        );
        assert_eq!(
            serde_json::to_value(Counterfactual::None).unwrap(),
            serde_json::json!({"kind": "none"})
        );
    }
}
