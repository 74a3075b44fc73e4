//! Divergence signatures: *how* the runtime tensor differs from the reference at the origin.
//!
//! [`diagnose`] tests the difference between a reference `R` and a runtime tensor `X` against
//! candidate explanations and returns every one that holds, most specific first; [`explain`] turns
//! the best into an [`Explanation`] for the evidence. The candidates, in precedence order:
//!
//! | signature | holds when |
//! |---|---|
//! | `non_finite` | `X` is NaN/Inf where `R` is finite (first index reported) |
//! | `permutation` | `X`'s data equals `R` with axes permuted, optionally after splitting one axis in two, read back in `X`'s shape (checks data, not shape) |
//! | `shift` | `X[t] = R[t±1]` along one axis on the overlap |
//! | `reversed` | `X[t] = R[n-1-t]` along one axis (a kernel flipped in time) |
//! | `sign_flip` | `X = -R` |
//! | `scale` | `X = αR` for a least-squares `α ≠ 1` |
//! | `mask` | on the last two axes (`[.., rows, cols]`) the differences sit in the strict upper or lower triangle only, or one side is masked (zero or ≤ -1e4) above the causal diagonal and the other is not |
//! | `rounding` | `X = round_bf16(R)` or `round_f16(R)`, or `X` is representable in bf16/f16 while `R` is not and the error is format-level, or every relative error is within half an f16/bf16 ULP with most of them at that scale |
//! | `subset` | only some slices along one axis differ (which ones, as ranges named by the contract's concatenated inputs where the caller gives them; whether they are swapped among themselves, or read from another reference tensor) |
//!
//! The signatures for hand-made bugs, in this precedence between `mask` and `rounding` unless
//! noted; those marked (ctx) need what the caller knows beyond the two tensors ([`OpContext`],
//! used by [`diagnose_with`] / [`explain_with`]), the others use it when given:
//!
//! | signature | holds when |
//! |---|---|
//! | `wiring` (ctx) | `X` equals another reference tensor of the same shape (another layer, step, head or cache slot: a candidate the caller supplies) |
//! | `temperature` | probabilities (rows sum to one), or logits after a log-softmax: `log X = a·log R + c_row` with one slope `a ≠ 1` for every row (scores or logits scaled by `a`) |
//! | `row_affine` | `X = a_r·R + b_r` per row of the last axis, optionally about a per-feature centre `β` (`X - β = a_r (R - β) + b_r`, a LayerNorm's bias): normalization statistics |
//! | `elementwise` (named) | `X = g(U)` and `R = f(U)` for two known activations `f ≠ g` (erf/tanh/quick GELU, SiLU, ReLU) of the op's input `U`; without `U`, `X = g(f⁻¹(R))` |
//! | `grid_quantization` (ctx) | `X - R` of a linear op `y = x·Wᵀ + b` is `x·(W_q - W)ᵀ` for `W_q` on a symmetric uniform grid (per tensor or per row, 2..=8 bits); needs the op's input `x` and either `W` or more rows than input features (then `W` is recovered by least squares) |
//! | `affine` | `X = a·R + b` over the elements above both sides' floors (a clamp's), the floored elements apart |
//! | `channel_offset` | `X = R + o_c`: one offset per slice along one axis (above both floors when there are floors): a per-channel bias, or a per-channel gain before a log |
//! | `clamp` (after `rounding`) | the differing elements are exactly those whose reference is below (or above) a threshold: a wrong clamp floor or ceiling |
//! | `elementwise` (unnamed, after `clamp`) | `X - R` is a smooth function of the op's input (or of `R`): the nearest known variant is named |
//!
//! "Equals" means a residual `||X - C(R)|| <= explain_rel * ||X||` (default `1e-3`, or the
//! tensor's tolerance `max_rel_l2` when looser: [`ExplainOptions::judged_by`]) and at most a
//! tenth of the unexplained difference `||X - R||`, so a plain noisy tensor never qualifies.

mod context;
mod fits;
mod linear;
mod relations;

pub use context::origin_context;
pub use fits::Activation;
pub use linear::linear_grid;
pub use relations::{compress_ranges, AxisSegment};

use ndarray::{ArrayD, ArrayView2, ArrayViewD, Axis, IxDyn, Slice};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use xray_core::SignatureKind;
use xray_core::Step;

use crate::tolerance::Tolerance;

/// Options for [`diagnose`] / [`explain`].
#[derive(Debug, Clone)]
pub struct ExplainOptions {
    /// Axis names of the canonical layout (e.g. `["heads", "tokens", "head_dim"]`); empty for
    /// generic `axis i` wording.
    pub axis_names: Vec<String>,
    /// The checkpoint's tolerance: decides which elements and slices differ.
    pub tolerance: Tolerance,
    /// Relative residual below which a candidate explains the difference.
    pub explain_rel: f64,
}

impl ExplainOptions {
    /// The options for a tensor judged by `tolerance`: a candidate may leave as much unexplained
    /// as the tolerance accepts (its `max_rel_l2`, when looser than the default `explain_rel`).
    /// An engine accepted at f16 precision carries that much error into every op from upstream,
    /// so its scaled output is `X = a·R` to within 3e-3, not 1e-3; the candidate must still
    /// explain all but a hundredth of the squared difference.
    pub fn judged_by(axis_names: Vec<String>, tolerance: Tolerance) -> ExplainOptions {
        let base = ExplainOptions::default().explain_rel;
        ExplainOptions {
            axis_names,
            explain_rel: tolerance.max_rel_l2.map_or(base, |b| b.max(base)),
            tolerance,
        }
    }
}

impl Default for ExplainOptions {
    fn default() -> Self {
        ExplainOptions {
            axis_names: Vec::new(),
            tolerance: Tolerance::default_f32(),
            explain_rel: 1e-3,
        }
    }
}

/// What the caller knows about the origin beyond its two tensors: each field is optional, and a
/// signature that needs a missing one is simply not tested.
#[derive(Debug, Clone, Default)]
pub struct OpContext<'a> {
    /// The producing op's input in the reference (aligned with the output for an elementwise op,
    /// `[rows, in_features]` for a linear op whose output is `[rows, out_features]`).
    pub op_input: Option<ArrayViewD<'a, f32>>,
    /// The reference weight `[out_features, in_features]` of a linear producer, when known.
    pub weight: Option<ArrayView2<'a, f32>>,
    /// Other reference tensors, named (`name@stepK`), that the runtime tensor might equal by a
    /// wiring mistake; only those of the same shape are tested.
    pub candidates: Vec<(String, ArrayViewD<'a, f32>)>,
    /// Named index ranges along axes (for example the concatenated inputs of a concat op), used
    /// to name the slices of a `subset`.
    pub segments: Vec<AxisSegment>,
    /// The tensor holds logits (the temperature test then compares log-softmaxes).
    pub logits: bool,
}

/// Which side of the threshold the clamp signature's differences sit on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClampSide {
    /// Differences where the reference is at or below the threshold (a floor).
    Below,
    /// Differences where the reference is at or above the threshold (a ceiling).
    Above,
}

/// Granularity of a quantization grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    /// One step for the whole weight.
    PerTensor,
    /// One step per output row (per output channel).
    PerRow,
}

/// Triangle of the last two axes, relative to the causal diagonal `col = row + (cols - rows)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Triangle {
    /// `col > row + offset` (the future under a causal mask).
    Upper,
    /// `col < row + offset`.
    Lower,
}

/// What happened in the masked triangle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// All differences lie in the triangle.
    Confined,
    /// The reference is masked there and the runtime is not (mask dropped).
    Dropped,
    /// The runtime is masked there and the reference is not (mask added).
    Added,
}

/// A floating-point storage format for the rounding signature: the one core declares (replay's
/// rounding counterfactuals name the same formats).
pub use xray_core::replay::RoundFormat;

/// What the rounding signature needs of a format.
trait Rounding {
    /// Half an ULP relative to the value (2^-11 for f16, 2^-8 for bf16).
    fn half_ulp(self) -> f64;
    /// Smallest normal value.
    fn min_normal(self) -> f64;
}

impl Rounding for RoundFormat {
    fn half_ulp(self) -> f64 {
        match self {
            RoundFormat::F16 => 2f64.powi(-11),
            RoundFormat::Bf16 | RoundFormat::Bf16TiesAway => 2f64.powi(-8),
            // Truncation errs by up to a whole ULP.
            RoundFormat::Bf16Truncated => 2f64.powi(-7),
        }
    }
    fn min_normal(self) -> f64 {
        match self {
            RoundFormat::F16 => 6.103_515_625e-5,
            _ => f32::MIN_POSITIVE as f64,
        }
    }
}

/// How the rounding signature was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundingEvidence {
    /// `X == round(R)` bit for bit.
    Exact,
    /// `X` is representable in the format, `R` is not, and errors are at format scale.
    Representable,
    /// Relative errors are bounded by half an ULP of the format, most at that scale.
    Distribution,
}

/// One divergence signature with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "signature", rename_all = "snake_case")]
pub enum Signature {
    /// Non-finite runtime values where the reference is finite.
    NonFinite {
        /// Index of the first one (C order).
        first_index: Vec<usize>,
        /// Runtime value there (`"NaN"`, `"inf"`, `"-inf"`).
        first_value: String,
        /// How many.
        count: u64,
    },
    /// Axis permutation / transpose (possibly after splitting one axis), read in `X`'s shape.
    Permutation {
        /// Shape `R` was viewed as before permuting (equals `R`'s shape without a split).
        view_shape: Vec<usize>,
        /// Axis order applied to the view (`X = view.permuted_axes(axes)`).
        axes: Vec<usize>,
        /// `(axis of R, [outer, inner])` when one axis was split first.
        split: Option<(usize, [usize; 2])>,
        /// Whether the permuted data was reinterpreted in a different shape (flat data equal).
        reinterpreted: bool,
        /// Relative residual.
        residual: f64,
    },
    /// Off-by-one shift along an axis: `X[t] = R[t + offset]`.
    Shift {
        /// Axis.
        axis: usize,
        /// `+1` or `-1`.
        offset: i32,
        /// Relative residual on the overlap.
        residual: f64,
    },
    /// `X` is `R` read backwards along one axis: `X[t] = R[n-1-t]` (a kernel flipped in time, a
    /// table or sequence reversed).
    Reversed {
        /// Axis.
        axis: usize,
        /// Relative residual.
        residual: f64,
    },
    /// Integer values (ids, positions, lengths) off by a constant: `X = R + by` everywhere (a
    /// position fed one ahead, a token id from the wrong table offset). Named `shift` too.
    Offset {
        /// `X - R`, the same for every element.
        by: i64,
        /// Elements.
        count: usize,
    },
    /// `X = -R`.
    SignFlip {
        /// Relative residual.
        residual: f64,
    },
    /// `X = factor * R`.
    Scale {
        /// Least-squares factor.
        factor: f64,
        /// Relative residual.
        residual: f64,
        /// A simple closed form close to the factor (`1/sqrt(64)`), if any.
        hint: Option<String>,
    },
    /// Difference pattern on the triangle of the last two axes.
    Mask {
        /// Triangle.
        region: Triangle,
        /// What happened there.
        kind: MaskKind,
        /// Rows and columns of the last two axes.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Diagonal offset `cols - rows`.
        diagonal_offset: i64,
        /// Differing elements inside the triangle.
        differing_inside: u64,
        /// Elements inside the triangle.
        inside: u64,
        /// Differing elements outside it.
        differing_outside: u64,
    },
    /// Rounding-level noise of a narrower float format.
    Rounding {
        /// The format.
        format: RoundFormat,
        /// How it was established.
        evidence: RoundingEvidence,
        /// Fraction of nonzero runtime values representable in the format.
        runtime_representable: f64,
        /// Largest relative error in units of the format's half ULP.
        max_rel_half_ulps: f64,
    },
    /// Only some slices along one axis differ.
    Subset {
        /// Axis (`None` for steps, see [`steps_subset`]).
        axis: Option<usize>,
        /// Axis name (`heads`, `tokens`, `step`, or `axis i`).
        axis_name: String,
        /// Differing slice indices.
        indices: Vec<usize>,
        /// Axis length.
        of: usize,
        /// `(i, j)` pairs with `X[i] = R[j]` when the differing slices are a permutation of each
        /// other (e.g. two heads swapped); empty otherwise.
        swapped: Vec<(usize, usize)>,
        /// The indices as inclusive ranges `[first, last]`.
        #[serde(default)]
        ranges: Vec<[usize; 2]>,
        /// Names of the caller's segments the ranges fall in (`64..127 = part 1 of 4:
        /// enc.block.2.out`), empty when the caller gave none for this axis.
        #[serde(default)]
        segments: Vec<String>,
        /// `(i, source)` when differing slice `i` equals slice `i` of another reference tensor
        /// (`name@stepK`, a wiring candidate): one head or slot read from the wrong tensor.
        #[serde(default)]
        sources: Vec<(usize, String)>,
    },
    /// The runtime tensor equals another reference tensor of the same shape.
    Wiring {
        /// The reference tensor it equals (`name@stepK`).
        source: String,
        /// Relative residual.
        residual: f64,
    },
    /// Log-probabilities linear in the reference's with one slope for every row: the scores or
    /// logits were scaled by a constant.
    Temperature {
        /// Pooled least-squares slope: the factor the scores or logits were multiplied by.
        factor: f64,
        /// Smallest and largest per-row slope.
        row_factors: [f64; 2],
        /// Rows fitted.
        rows: u64,
        /// `probabilities` (rows sum to one) or `logits` (compared after a log-softmax).
        domain: String,
        /// Relative residual in the log domain.
        residual: f64,
        /// A simple closed form near the factor (`8 = sqrt(64)`), if any.
        hint: Option<String>,
    },
    /// `X = a_r·R + b_r` per row of the last axis, optionally about a per-feature centre.
    RowAffine {
        /// Smallest and largest row slope `a_r`.
        a_range: [f64; 2],
        /// Smallest and largest row offset `b_r`.
        b_range: [f64; 2],
        /// Median row slope.
        a_median: f64,
        /// Rows fitted.
        rows: u64,
        /// Row length (the normalized axis).
        row_len: usize,
        /// Whether a per-feature centre `β` was fitted (`X - β = a_r (R - β) + b_r`: a norm's
        /// bias, which the statistics do not scale).
        centred: bool,
        /// Relative residual.
        residual: f64,
        /// A known cause matching the slopes (the unbiased variance: `sqrt((n-1)/n)`), if any.
        hint: Option<String>,
    },
    /// `X = a·R + b` with one `a` and `b` over every element above both sides' floors (each
    /// side's minimum, which many elements sit at: a clamp), the floors apart: a log of another
    /// base, or another scale and offset, before the clamp (a log-mel's).
    Affine {
        /// Slope.
        a: f64,
        /// Offset.
        b: f64,
        /// Elements fitted (above both floors).
        fitted: u64,
        /// All elements.
        of: u64,
        /// Relative residual over the fitted elements.
        residual: f64,
        /// A known cause matching the slope (`ln(10)`: a natural log where the reference takes
        /// log10), if any.
        hint: Option<String>,
    },
    /// `X = R + o_c`: one offset per slice along one axis (over the elements above both sides'
    /// floors when there are floors): a per-channel bias, or a per-channel gain before a log.
    ChannelOffset {
        /// The axis.
        axis: usize,
        /// Its name (`channels`, `features`, or `axis i`).
        axis_name: String,
        /// Slices with fitted elements (one offset each).
        slices: u64,
        /// Smallest and largest offset.
        range: [f64; 2],
        /// Elements fitted.
        fitted: u64,
        /// All elements.
        of: u64,
        /// Whether elements at either side's floor were left out.
        floors: bool,
        /// Relative residual over the fitted elements.
        residual: f64,
    },
    /// Differences only where the reference is beyond a threshold: a wrong clamp.
    Clamp {
        /// Below (a floor) or above (a ceiling).
        side: ClampSide,
        /// The differing reference value nearest the matching ones.
        threshold: f64,
        /// The matching reference value nearest the differing ones.
        matching_from: f64,
        /// Differing elements.
        differing: u64,
        /// Elements.
        of: u64,
        /// Reference values over the differing elements `[min, max]`.
        reference_range: [f64; 2],
        /// Runtime values over the differing elements `[min, max]`.
        runtime_range: [f64; 2],
    },
    /// The difference is a smooth function of the op's input (or of the reference's value).
    Elementwise {
        /// The runtime's activation when one known variant fits exactly.
        runtime: Option<Activation>,
        /// The reference's activation when identified.
        reference: Option<Activation>,
        /// The known runtime variant nearest the data.
        nearest: Activation,
        /// Relative residual of the nearest variant.
        nearest_residual: f64,
        /// Whether the op's input was available (else the map `R -> X` was fitted).
        from_input: bool,
    },
    /// A linear op's weight rounded to a uniform symmetric grid.
    GridQuantization {
        /// Per tensor or per output row.
        granularity: Granularity,
        /// Bit width (the grid holds `-(2^(b-1)-1)..=2^(b-1)-1` steps).
        bits: u32,
        /// Smallest and largest step.
        step: [f64; 2],
        /// Whether the weight was recovered from the reference's input and output (else given).
        weight_recovered: bool,
        /// Relative residual of the quantized prediction.
        residual: f64,
    },
}

impl Signature {
    /// Its kind (the evidence's `signature`). `Offset` is a `shift` too (integer values off by
    /// a constant: ids or positions one ahead).
    pub fn kind(&self) -> SignatureKind {
        match self {
            Signature::NonFinite { .. } => SignatureKind::NonFinite,
            Signature::Permutation { .. } => SignatureKind::Permutation,
            Signature::Shift { .. } | Signature::Offset { .. } => SignatureKind::Shift,
            Signature::Reversed { .. } => SignatureKind::Reversed,
            Signature::SignFlip { .. } => SignatureKind::SignFlip,
            Signature::Scale { .. } => SignatureKind::Scale,
            Signature::Mask { .. } => SignatureKind::Mask,
            Signature::Rounding { .. } => SignatureKind::Rounding,
            Signature::Subset { .. } => SignatureKind::Subset,
            Signature::Wiring { .. } => SignatureKind::Wiring,
            Signature::Temperature { .. } => SignatureKind::Temperature,
            Signature::RowAffine { .. } => SignatureKind::RowAffine,
            Signature::Affine { .. } => SignatureKind::Affine,
            Signature::ChannelOffset { .. } => SignatureKind::ChannelOffset,
            Signature::Clamp { .. } => SignatureKind::Clamp,
            Signature::Elementwise { .. } => SignatureKind::Elementwise,
            Signature::GridQuantization { .. } => SignatureKind::GridQuantization,
        }
    }

    /// Short name as in the evidence.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// One-sentence human description.
    pub fn detail(&self, axis_names: &[String]) -> String {
        let ax = |a: usize| axis_label(axis_names, a);
        match self {
            Signature::NonFinite {
                first_index,
                first_value,
                count,
            } => format!(
                "{count} non-finite runtime value(s) where the reference is finite; the first is {first_value} at {first_index:?}"
            ),
            Signature::Permutation {
                view_shape,
                axes,
                split,
                reinterpreted,
                residual,
            } => {
                let names: Vec<String> = if split.is_none() {
                    axes.iter().map(|&a| ax(a)).collect()
                } else {
                    axes.iter().map(|a| format!("v{a}")).collect()
                };
                let mut s = String::from("runtime holds the reference ");
                if let Some((a, [o, i])) = split {
                    s += &format!("with {} split into ({o}, {i}) (view {view_shape:?}) and ", ax(*a));
                }
                s += &format!("with axes permuted to {axes:?} [{}]", names.join(", "));
                if *reinterpreted {
                    s += ", its flat data read back in the canonical shape (a layout mix-up such as token-major data read as head-major)";
                }
                s + &format!("; {}", resid_text(*residual))
            }
            Signature::Reversed { axis, residual } => format!(
                "runtime is the reference reversed along {}: X[t] = R[n-1-t] ({})",
                ax(*axis),
                resid_text(*residual)
            ),
            Signature::Shift {
                axis,
                offset,
                residual,
            } => format!(
                "runtime is the reference shifted by one along {}: X[t] = R[t{}1] ({})",
                ax(*axis),
                if *offset > 0 { "+" } else { "-" },
                resid_text(*residual)
            ),
            Signature::Offset { by, count } => format!(
                "integer values off by {by:+} ({count} of {count} elements: runtime = reference {} {}): an off-by-one in ids or positions",
                if *by > 0 { "+" } else { "-" },
                by.unsigned_abs()
            ),
            Signature::SignFlip { residual } => {
                format!("runtime = -reference ({})", resid_text(*residual))
            }
            Signature::Scale { factor, .. } if *factor == 0.0 => {
                "runtime is all zeros where the reference is not (runtime = 0 × reference): never written, or never loaded (a bias or table left out)".into()
            }
            Signature::Scale {
                factor,
                residual,
                hint,
            } => {
                let h = hint.as_ref().map(|h| format!(", ≈ {h}")).unwrap_or_default();
                format!(
                    "runtime = {factor:.6} × reference{h} (least squares, {})",
                    resid_text(*residual)
                )
            }
            Signature::Mask {
                region,
                kind,
                rows,
                cols,
                differing_inside,
                inside,
                differing_outside,
                ..
            } => {
                let tri = match region {
                    Triangle::Upper => "upper",
                    Triangle::Lower => "lower",
                };
                let what = match kind {
                    MaskKind::Confined => format!("differences confined to the strict {tri} triangle"),
                    MaskKind::Dropped => format!("the reference is masked in the strict {tri} triangle and the runtime is not (mask dropped)"),
                    MaskKind::Added => format!("the runtime is masked in the strict {tri} triangle and the reference is not (mask added)"),
                };
                format!(
                    "on the last two axes [{rows}, {cols}]: {what}; {differing_inside} of {inside} inside differ, {differing_outside} outside"
                )
            }
            Signature::Rounding {
                format,
                evidence,
                runtime_representable,
                max_rel_half_ulps,
            } => {
                let f = format.as_str();
                match evidence {
                    RoundingEvidence::Exact => format!("runtime = round_to_{f}(reference) exactly"),
                    RoundingEvidence::Representable => format!(
                        "{:.1}% of runtime values are exactly representable in {f} and the reference's are not; errors at {f} scale (max {max_rel_half_ulps:.1} half-ULPs): computed or stored in {f}",
                        100.0 * runtime_representable
                    ),
                    RoundingEvidence::Distribution => format!(
                        "every relative error is within half an {f} ULP (max {max_rel_half_ulps:.2} half-ULPs): rounding-level noise of {f}"
                    ),
                }
            }
            Signature::Subset {
                axis_name,
                indices,
                of,
                swapped,
                ranges,
                segments,
                sources,
                ..
            } => {
                let listed = if segments.is_empty() {
                    let own;
                    relations::ranges_text(if ranges.is_empty() {
                        own = compress_ranges(indices);
                        &own
                    } else {
                        ranges
                    })
                } else {
                    segments.join(", ")
                };
                let mut s = format!(
                    "only {} of {of} slices along {axis_name} differ: {listed}; the rest match",
                    indices.len()
                );
                if !swapped.is_empty() {
                    let pairs: Vec<String> =
                        swapped.iter().map(|(i, j)| format!("X[{i}] = R[{j}]")).collect();
                    s += &format!(" (swapped among themselves: {})", pairs.join(", "));
                }
                if !sources.is_empty() {
                    let from: Vec<String> = sources
                        .iter()
                        .map(|(i, n)| format!("X[{i}] = {n}[{i}]"))
                        .collect();
                    s += &format!(" (read from another tensor: {})", from.join(", "));
                }
                s
            }
            Signature::Wiring { source, residual } => format!(
                "runtime equals the reference's {source} ({}): the op read or wrote the wrong tensor (another layer, step, head or cache slot)",
                resid_text(*residual)
            ),
            Signature::Temperature {
                factor,
                row_factors,
                rows,
                domain,
                residual,
                hint,
            } => {
                let h = hint.as_ref().map(|h| format!(" ≈ {h}")).unwrap_or_default();
                format!(
                    "log-{} linear in the reference's row by row with one slope {factor:.6}{h} over {rows} rows (per row {:.6}..{:.6}, {}): scores or logits scaled by {factor:.4} (a temperature)",
                    if domain == "logits" { "softmax of the logits" } else { "probabilities" },
                    row_factors[0],
                    row_factors[1],
                    resid_text(*residual)
                )
            }
            Signature::RowAffine {
                a_range,
                b_range,
                a_median,
                rows,
                row_len,
                centred,
                residual,
                hint,
            } => {
                let c = if *centred { " - β (per-feature centre)" } else { "" };
                let h = hint.as_ref().map(|h| format!("; {h}")).unwrap_or_default();
                format!(
                    "per-row affine over {rows} rows of {row_len}: X{c} = a_r·(R{c}) + b_r with a_r in {:.6}..{:.6} (median {a_median:.6}), b_r in {:.3e}..{:.3e} ({}): normalization statistics{h}",
                    a_range[0], a_range[1], b_range[0], b_range[1], resid_text(*residual)
                )
            }
            Signature::Affine {
                a,
                b,
                fitted,
                of,
                residual,
                hint,
            } => {
                let h = hint.as_ref().map(|h| format!(": {h}")).unwrap_or_default();
                format!(
                    "X = {a:.6}·R {} {:.6} over the {fitted} of {of} elements above both sides' floors ({}); the floored elements apart{h}",
                    if *b < 0.0 { "-" } else { "+" },
                    b.abs(),
                    resid_text(*residual)
                )
            }
            Signature::ChannelOffset {
                axis_name,
                slices,
                range,
                fitted,
                of,
                floors,
                residual,
                ..
            } => {
                let over = if *floors {
                    format!("the {fitted} of {of} elements above both sides' floors")
                } else {
                    format!("all {of} elements")
                };
                format!(
                    "X = R + o_c, one offset per slice along {axis_name} ({slices} offsets in {:.4e}..{:.4e}) over {over} ({}): a per-{axis_name} bias, or a per-{axis_name} gain before a log",
                    range[0], range[1], resid_text(*residual)
                )
            }
            Signature::Clamp {
                side,
                threshold,
                matching_from,
                differing,
                of,
                reference_range,
                runtime_range,
            } => {
                let (cmp, word) = match side {
                    ClampSide::Below => ("<=", "floor"),
                    ClampSide::Above => (">=", "ceiling"),
                };
                let held = |r: &[f64; 2], who: &str| {
                    if r[0] == r[1] {
                        format!("the {who} is constant {:.6} there", r[0])
                    } else {
                        format!("the {who} spans {:.6}..{:.6}", r[0], r[1])
                    }
                };
                format!(
                    "{differing} of {of} elements differ, exactly those whose reference is {cmp} {threshold:.6} (the next reference value {matching_from:.6} matches); {}, {}: a wrong clamp {word}",
                    held(reference_range, "reference"),
                    held(runtime_range, "runtime")
                )
            }
            Signature::Elementwise {
                runtime,
                reference,
                nearest,
                nearest_residual,
                from_input,
            } => {
                let of = if *from_input {
                    "the op's input"
                } else {
                    "the reference value"
                };
                let r = reference
                    .map(|f| format!(" where the reference computes {}", f.name()))
                    .unwrap_or_default();
                match runtime {
                    Some(g) => format!(
                        "elementwise function of {of}: the runtime computes {}{r} ({})",
                        g.name(),
                        resid_text(*nearest_residual)
                    ),
                    None => format!(
                        "the difference is a smooth function of {of}{r}; nearest known runtime variant {} (residual {nearest_residual:.1e})",
                        nearest.name()
                    ),
                }
            }
            Signature::GridQuantization {
                granularity,
                bits,
                step,
                weight_recovered,
                residual,
            } => {
                let g = match granularity {
                    Granularity::PerTensor => "per tensor",
                    Granularity::PerRow => "per output row",
                };
                let st = if step[0] == step[1] {
                    format!("{:.3e}", step[0])
                } else {
                    format!("{:.3e}..{:.3e}", step[0], step[1])
                };
                format!(
                    "the op's weight is rounded to a symmetric {bits}-bit grid {g} (step {st}); weight {}; {}",
                    if *weight_recovered { "recovered from the reference's input and output" } else { "given" },
                    resid_text(*residual)
                )
            }
        }
    }
}

/// Explanation of the origin in the evidence: `signature` is a [`Signature::kind`], or `layout`,
/// `shape`, `missing` for an origin that is not a numeric difference, or `none`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// Signature kind.
    pub signature: SignatureKind,
    /// Human-readable sentence.
    pub detail: String,
    /// Structured evidence (the signature's fields; `also` lists other matching signatures).
    pub evidence: Value,
}

/// `exact` for a zero residual, else `residual 1.2e-5`.
fn resid_text(r: f64) -> String {
    if r == 0.0 {
        "exact".into()
    } else {
        format!("residual {r:.1e}")
    }
}

fn axis_label(names: &[String], a: usize) -> String {
    names.get(a).cloned().unwrap_or_else(|| format!("axis {a}"))
}

/// Finite-or-zero copy in standard layout.
fn clean(a: &ArrayViewD<f32>) -> ArrayD<f32> {
    let v = a
        .iter()
        .map(|&v| if v.is_finite() { v } else { 0.0 })
        .collect();
    ArrayD::from_shape_vec(a.raw_dim(), v).unwrap_or_else(|_| ArrayD::zeros(a.raw_dim()))
}

fn sumsq<'a>(it: impl Iterator<Item = (&'a f32, &'a f32)>) -> f64 {
    it.map(|(a, b)| {
        let d = *a as f64 - *b as f64;
        d * d
    })
    .sum()
}

/// Sum of squared differences between `pred` (in iteration order) and `x`, or `None` as soon as it
/// exceeds `budget`.
fn resid_within<'a>(pred: impl Iterator<Item = &'a f32>, x: &[f32], budget: f64) -> Option<f64> {
    let mut s = 0f64;
    for (i, (p, v)) in pred.zip(x).enumerate() {
        let d = *p as f64 - *v as f64;
        s += d * d;
        if i % 64 == 63 && s > budget {
            return None;
        }
    }
    (s <= budget).then_some(s)
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    fn rec(cur: &mut Vec<usize>, used: &mut Vec<bool>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == used.len() {
            out.push(cur.clone());
            return;
        }
        for i in 0..used.len() {
            if !used[i] {
                used[i] = true;
                cur.push(i);
                rec(cur, used, out);
                cur.pop();
                used[i] = false;
            }
        }
    }
    let mut out = Vec::new();
    rec(&mut Vec::new(), &mut vec![false; n], &mut out);
    out
}

/// Context shared by the candidate tests.
struct Ctx<'a, 'b> {
    r: ArrayD<f32>,
    x: ArrayD<f32>,
    opts: &'a ExplainOptions,
    /// What the caller knows beyond the two tensors.
    oc: &'a OpContext<'b>,
    /// `||X||^2`.
    xx: f64,
    /// `||X - R||^2` (only meaningful when shapes agree).
    orig: f64,
    /// RMS magnitude of `R` ([`crate::metrics::magnitude`]).
    scale: f64,
}

impl Ctx<'_, '_> {
    /// Largest accepted squared residual for a candidate.
    fn budget(&self, same_shape: bool) -> f64 {
        let b = self.opts.explain_rel.powi(2) * self.xx;
        if same_shape {
            b.min(0.01 * self.orig)
        } else {
            b
        }
    }
    fn rel(&self, sq: f64) -> f64 {
        if self.xx > 0.0 {
            (sq / self.xx).sqrt()
        } else {
            0.0
        }
    }
    /// The metrics' outlier test ([`Tolerance::element_bound`] at the reference's magnitude).
    fn differs(&self, r: f32, x: f32) -> bool {
        (x as f64 - r as f64).abs() > self.opts.tolerance.element_bound(r as f64, self.scale)
    }
}

fn non_finite(r: &ArrayViewD<f32>, x: &ArrayViewD<f32>) -> Option<Signature> {
    let mut first: Option<(usize, f32)> = None;
    let mut count = 0u64;
    for (i, (a, b)) in r.iter().zip(x.iter()).enumerate() {
        if a.is_finite() && !b.is_finite() {
            count += 1;
            first.get_or_insert((i, *b));
        }
    }
    let (i, v) = first?;
    Some(Signature::NonFinite {
        first_index: crate::metrics::unravel(i, r.shape()),
        first_value: if v.is_nan() {
            "NaN".into()
        } else if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        },
        count,
    })
}

const MAX_PERMUTE_RANK: usize = 5;

/// A view of `R` for the permutation search: its shape and the split that produced it.
type SplitView = (Vec<usize>, Option<(usize, [usize; 2])>);

fn permutation(c: &Ctx) -> Option<Signature> {
    let same = c.r.shape() == c.x.shape();
    let budget = c.budget(same);
    let xs = c.x.as_slice()?;
    let rshape = c.r.shape().to_vec();
    // Views of R: as is, and with one axis split in two.
    let mut views: Vec<SplitView> = vec![(rshape.clone(), None)];
    for (a, &n) in rshape.iter().enumerate() {
        for o in 2..n {
            if n % o == 0 && rshape.len() < MAX_PERMUTE_RANK {
                let mut v = rshape.clone();
                v.splice(a..=a, [o, n / o]);
                views.push((v, Some((a, [o, n / o]))));
            }
        }
    }
    let mut best: Option<(f64, Signature)> = None;
    for (vshape, split) in views {
        if vshape.len() > MAX_PERMUTE_RANK {
            continue;
        }
        let Ok(view) = c.r.view().into_shape_with_order(IxDyn(&vshape)) else {
            continue;
        };
        for p in permutations(vshape.len()) {
            // Skip orders that leave the flat data unchanged (only size-1 axes move).
            let moved: Vec<usize> = p.iter().copied().filter(|&a| vshape[a] > 1).collect();
            if moved.windows(2).all(|w| w[0] < w[1]) {
                continue;
            }
            let pv = view.view().permuted_axes(IxDyn(&p));
            let Some(sq) = resid_within(pv.iter(), xs, budget) else {
                continue;
            };
            if best.as_ref().is_none_or(|(b, _)| sq < *b) {
                let exact = sq == 0.0;
                let reinterpreted = pv.shape() != c.x.shape();
                best = Some((
                    sq,
                    Signature::Permutation {
                        view_shape: vshape.clone(),
                        axes: p,
                        split,
                        reinterpreted,
                        residual: c.rel(sq),
                    },
                ));
                if exact {
                    return best.map(|(_, s)| s);
                }
            }
        }
    }
    best.map(|(_, s)| s)
}

/// `X = R + by` for integer-valued tensors (ids, positions) with one non-zero `by`.
fn offset(c: &Ctx) -> Option<Signature> {
    let integral = |v: f32| v.is_finite() && v.fract() == 0.0 && v.abs() < 1e7;
    let mut by: Option<i64> = None;
    for (r, x) in c.r.iter().zip(c.x.iter()) {
        if !integral(*r) || !integral(*x) {
            return None;
        }
        let d = *x as i64 - *r as i64;
        match by {
            None => by = Some(d),
            Some(b) if b != d => return None,
            _ => {}
        }
    }
    by.filter(|&b| b != 0).map(|by| Signature::Offset {
        by,
        count: c.r.len(),
    })
}

fn shift(c: &Ctx) -> Option<Signature> {
    if let Some(s) = offset(c) {
        return Some(s);
    }
    let mut best: Option<(f64, Signature)> = None;
    for a in 0..c.r.ndim() {
        let n = c.r.shape()[a];
        if n < 3 {
            continue;
        }
        for off in [1i32, -1] {
            let (xr, rr) = if off > 0 {
                (Slice::from(0..n - 1), Slice::from(1..n))
            } else {
                (Slice::from(1..n), Slice::from(0..n - 1))
            };
            let xv = c.x.slice_axis(Axis(a), xr);
            let rv = c.r.slice_axis(Axis(a), rr);
            let unshifted = c.r.slice_axis(Axis(a), xr);
            let sq = sumsq(xv.iter().zip(rv.iter()));
            let orig = sumsq(xv.iter().zip(unshifted.iter()));
            let xx: f64 = xv.iter().map(|v| (*v as f64).powi(2)).sum();
            let ok = sq <= c.opts.explain_rel.powi(2) * xx && sq <= 0.01 * orig && orig > 0.0;
            if ok && best.as_ref().is_none_or(|(b, _)| sq < *b) {
                let residual = if xx > 0.0 { (sq / xx).sqrt() } else { 0.0 };
                best = Some((
                    sq,
                    Signature::Shift {
                        axis: a,
                        offset: off,
                        residual,
                    },
                ));
            }
        }
    }
    best.map(|(_, s)| s)
}

/// `X[t] = R[n-1-t]` along the axis that explains the difference best (axes of 2 or more).
fn reversed(c: &Ctx) -> Option<Signature> {
    let mut best: Option<(f64, Signature)> = None;
    let xx = c.xx;
    for a in 0..c.r.ndim() {
        if c.r.shape()[a] < 2 {
            continue;
        }
        let rv = c.r.slice_axis(Axis(a), Slice::new(0, None, -1));
        let sq = sumsq(c.x.iter().zip(rv.iter()));
        let ok = sq <= c.opts.explain_rel.powi(2) * xx && sq <= 0.01 * c.orig && c.orig > 0.0;
        if ok && best.as_ref().is_none_or(|(b, _)| sq < *b) {
            let residual = if xx > 0.0 { (sq / xx).sqrt() } else { 0.0 };
            best = Some((sq, Signature::Reversed { axis: a, residual }));
        }
    }
    best.map(|(_, s)| s)
}

/// Recognizable closed forms near `f` (`k`, `1/k`, `sqrt(k)`, `1/sqrt(k)` for `k` in 2..=1024),
/// joined with ` = ` (e.g. `1/8 = 1/sqrt(64)`).
fn scale_hint(f: f64) -> Option<String> {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs();
    let m = f.abs();
    let sign = if f < 0.0 { "-" } else { "" };
    let mut forms: Vec<String> = Vec::new();
    for k in 2..=1024u32 {
        let kf = k as f64;
        let cands = [
            (kf.recip(), format!("{sign}1/{k}")),
            (kf.sqrt().recip(), format!("{sign}1/sqrt({k})")),
            (kf, format!("{sign}{k}")),
            (kf.sqrt(), format!("{sign}sqrt({k})")),
        ];
        for (v, s) in cands {
            if close(m, v) && forms.len() < 3 {
                forms.push(s);
            }
        }
    }
    (!forms.is_empty()).then(|| forms.join(" = "))
}

fn scale_and_sign(c: &Ctx) -> Vec<Signature> {
    let rr: f64 = c.r.iter().map(|v| (*v as f64).powi(2)).sum();
    if rr == 0.0 || c.r.shape() != c.x.shape() {
        return vec![];
    }
    let rx: f64 =
        c.r.iter()
            .zip(c.x.iter())
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum();
    let alpha = rx / rr;
    let budget = c.budget(true);
    let resid = |k: f64| -> f64 {
        c.r.iter()
            .zip(c.x.iter())
            .map(|(a, b)| (*b as f64 - k * *a as f64).powi(2))
            .sum()
    };
    let mut out = Vec::new();
    let flip = resid(-1.0);
    if flip <= budget {
        out.push(Signature::SignFlip {
            residual: c.rel(flip),
        });
        return out;
    }
    let sq = resid(alpha);
    let residual = c.rel(sq);
    if sq <= budget && (alpha - 1.0).abs() > (10.0 * residual).max(1e-4) {
        let n = c.r.shape().last().copied().unwrap_or(0);
        out.push(Signature::Scale {
            factor: alpha,
            residual,
            hint: scale_hint(alpha).or_else(|| fits::variance_hint(alpha, n)),
        });
    }
    out
}

fn is_masked(v: f32) -> bool {
    v == 0.0 || v <= -1e4
}

fn mask(c: &Ctx) -> Option<Signature> {
    let nd = c.r.ndim();
    if nd < 2 || c.r.shape() != c.x.shape() {
        return None;
    }
    let (rows, cols) = (c.r.shape()[nd - 2], c.r.shape()[nd - 1]);
    if rows < 2 || cols < 2 {
        return None;
    }
    let off = cols as i64 - rows as i64;
    // Counters per triangle: [upper, lower, diagonal].
    let mut size = [0u64; 3];
    let mut diff = [0u64; 3];
    let (mut ref_masked_up, mut run_masked_up) = (0u64, 0u64);
    let plane = rows * cols;
    for (k, (a, b)) in c.r.iter().zip(c.x.iter()).enumerate() {
        let e = k % plane;
        let (i, j) = ((e / cols) as i64, (e % cols) as i64);
        let t = match j.cmp(&(i + off)) {
            std::cmp::Ordering::Greater => 0,
            std::cmp::Ordering::Less => 1,
            std::cmp::Ordering::Equal => 2,
        };
        size[t] += 1;
        diff[t] += c.differs(*a, *b) as u64;
        if t == 0 {
            ref_masked_up += is_masked(*a) as u64;
            run_masked_up += is_masked(*b) as u64;
        }
    }
    let total: u64 = diff.iter().sum();
    if total == 0 {
        return None;
    }
    let mk = |region, kind, t: usize| Signature::Mask {
        region,
        kind,
        rows,
        cols,
        diagonal_offset: off,
        differing_inside: diff[t],
        inside: size[t],
        differing_outside: total - diff[t],
    };
    let half = |t: usize| size[t] > 0 && 2 * diff[t] >= size[t];
    if size[0] > 0 && ref_masked_up == size[0] && 2 * (size[0] - run_masked_up) >= size[0] {
        return Some(mk(Triangle::Upper, MaskKind::Dropped, 0));
    }
    if size[0] > 0 && run_masked_up == size[0] && 2 * (size[0] - ref_masked_up) >= size[0] {
        return Some(mk(Triangle::Upper, MaskKind::Added, 0));
    }
    for (t, region) in [(0, Triangle::Upper), (1, Triangle::Lower)] {
        if diff[t] == total && half(t) {
            return Some(mk(region, MaskKind::Confined, t));
        }
    }
    None
}

/// Statistics of one narrow format against the pair.
struct RoundStats {
    fmt: RoundFormat,
    exact: bool,
    rep_x: f64,
    rep_r: f64,
    max_units: f64,
    /// 99th percentile of the error in half-ULPs: robust to the few near-zero elements where the
    /// runtime's own f32 noise exceeds the format's absolute spacing.
    p99_units: f64,
    at_scale: f64,
}

fn round_stats(c: &Ctx, fmt: RoundFormat) -> RoundStats {
    let hu = fmt.half_ulp();
    let tiny = fmt.min_normal();
    let (mut exact, mut rep_x, mut rep_r, mut nz_x, mut nz_r) = (true, 0u64, 0u64, 0u64, 0u64);
    let (mut max_units, mut at_scale) = (0f64, 0u64);
    let mut all_units = Vec::with_capacity(c.r.len());
    for (a, b) in c.r.iter().zip(c.x.iter()) {
        exact &= fmt.round(*a).to_bits() == b.to_bits();
        if *b != 0.0 {
            nz_x += 1;
            rep_x += (fmt.round(*b) == *b) as u64;
        }
        if *a != 0.0 {
            nz_r += 1;
            rep_r += (fmt.round(*a) == *a) as u64;
        }
        let (a, d) = (*a as f64, (*b as f64 - *a as f64).abs());
        // Error in half-ULPs; below the normal range the spacing is absolute.
        let units = d / (hu * a.abs().max(tiny));
        max_units = max_units.max(units);
        all_units.push(units);
        at_scale += (units > 0.125) as u64;
    }
    let p99_units = if all_units.is_empty() {
        0.0
    } else {
        let k = ((all_units.len() - 1) as f64 * 0.99) as usize;
        *all_units.select_nth_unstable_by(k, |a, b| a.total_cmp(b)).1
    };
    let frac = |k: u64, n: usize| if n > 0 { k as f64 / n as f64 } else { 0.0 };
    RoundStats {
        fmt,
        exact,
        rep_x: frac(rep_x, nz_x as usize),
        rep_r: frac(rep_r, nz_r as usize),
        max_units,
        p99_units,
        at_scale: frac(at_scale, c.r.len()),
    }
}

fn rounding(c: &Ctx) -> Option<Signature> {
    if c.r.shape() != c.x.shape() || c.orig == 0.0 {
        return None;
    }
    // bf16 values are mostly f16-representable, so the representability test goes bf16 first;
    // f16 noise is finer, so the distribution test goes f16 first.
    let b = round_stats(c, RoundFormat::Bf16);
    let h = round_stats(c, RoundFormat::F16);
    let pick = [
        (&b, RoundingEvidence::Exact),
        (&h, RoundingEvidence::Exact),
        (&b, RoundingEvidence::Representable),
        (&h, RoundingEvidence::Representable),
        (&h, RoundingEvidence::Distribution),
        (&b, RoundingEvidence::Distribution),
    ]
    .into_iter()
    .find(|(s, e)| match e {
        RoundingEvidence::Exact => s.exact,
        RoundingEvidence::Representable => s.rep_x >= 0.99 && s.rep_r <= 0.5 && s.p99_units <= 32.0,
        RoundingEvidence::Distribution => s.max_units <= 1.01 && s.at_scale >= 0.25,
    })?;
    let (s, evidence) = pick;
    Some(Signature::Rounding {
        format: s.fmt,
        evidence,
        runtime_representable: s.rep_x,
        max_rel_half_ulps: s.max_units,
    })
}

const MAX_SWAP_SLICES: usize = 8;

fn subset(c: &Ctx) -> Option<Signature> {
    if c.r.shape() != c.x.shape() {
        return None;
    }
    let maxf = c.opts.tolerance.max_outlier_fraction;
    let mut best: Option<(f64, Signature)> = None;
    for a in 0..c.r.ndim() {
        let n = c.r.shape()[a];
        if n < 2 {
            continue;
        }
        let mut idx = Vec::new();
        for (i, (rs, xs)) in
            c.r.axis_iter(Axis(a))
                .zip(c.x.axis_iter(Axis(a)))
                .enumerate()
        {
            let bad = rs
                .iter()
                .zip(xs.iter())
                .filter(|(p, q)| c.differs(**p, **q))
                .count();
            if bad as f64 > maxf * rs.len() as f64 {
                idx.push(i);
            }
        }
        if idx.is_empty() || 2 * idx.len() > n {
            continue;
        }
        let frac = idx.len() as f64 / n as f64;
        if best.as_ref().is_some_and(|(f, _)| *f <= frac) {
            continue;
        }
        let swapped = swaps(c, a, &idx);
        let sources = if swapped.is_empty() {
            relations::slice_sources(c, a, &idx)
        } else {
            vec![]
        };
        let ranges = compress_ranges(&idx);
        let segments = relations::name_ranges(&ranges, a, &c.oc.segments);
        best = Some((
            frac,
            Signature::Subset {
                axis: Some(a),
                axis_name: axis_label(&c.opts.axis_names, a),
                indices: idx,
                of: n,
                swapped,
                ranges,
                segments,
                sources,
            },
        ));
    }
    best.map(|(_, s)| s)
}

/// If the differing slices along `a` are a permutation of each other, the `(i, j)` pairs with
/// `X[i] = R[j]`.
fn swaps(c: &Ctx, a: usize, idx: &[usize]) -> Vec<(usize, usize)> {
    if idx.len() < 2 || idx.len() > MAX_SWAP_SLICES {
        return vec![];
    }
    let mut pairs = Vec::new();
    for &i in idx {
        let xs = c.x.index_axis(Axis(a), i);
        let xx: f64 = xs.iter().map(|v| (*v as f64).powi(2)).sum();
        let hit = idx.iter().copied().find(|&j| {
            j != i && {
                let rs = c.r.index_axis(Axis(a), j);
                sumsq(xs.iter().zip(rs.iter())) <= c.opts.explain_rel.powi(2) * xx
            }
        });
        match hit {
            Some(j) => pairs.push((i, j)),
            None => return vec![],
        }
    }
    pairs
}

/// Every signature that holds for reference `r` and runtime `x`, most specific first (empty when
/// none does). `x` may have another shape with the same element count; then only `permutation`
/// is tested. The signatures that need more than the two tensors are not tested; see
/// [`diagnose_with`].
pub fn diagnose(r: &ArrayViewD<f32>, x: &ArrayViewD<f32>, opts: &ExplainOptions) -> Vec<Signature> {
    diagnose_with(r, x, opts, &OpContext::default())
}

/// [`diagnose`] with what the caller knows about the op ([`OpContext`]): the op's input, its
/// weight, candidate tensors for `wiring`, named segments, whether the tensor holds logits.
pub fn diagnose_with(
    r: &ArrayViewD<f32>,
    x: &ArrayViewD<f32>,
    opts: &ExplainOptions,
    oc: &OpContext<'_>,
) -> Vec<Signature> {
    let mut out = Vec::new();
    if r.len() != x.len() || r.is_empty() {
        return out;
    }
    let same = r.shape() == x.shape();
    if same {
        if let Some(s) = non_finite(r, x) {
            out.push(s);
        }
    }
    let (rc, xc) = (clean(r), clean(x));
    let xx = xc.iter().map(|v| (*v as f64).powi(2)).sum();
    let orig = if same {
        sumsq(rc.iter().zip(xc.iter()))
    } else {
        f64::INFINITY
    };
    let scale = crate::metrics::magnitude(&r.iter().copied().collect::<Vec<f32>>());
    let c = Ctx {
        r: rc,
        x: xc,
        opts,
        oc,
        xx,
        orig,
        scale,
    };
    if same && orig == 0.0 {
        return out;
    }
    out.extend(permutation(&c));
    if !same {
        return out;
    }
    out.extend(shift(&c));
    out.extend(reversed(&c));
    let global = scale_and_sign(&c);
    // A global scale or sign is also a per-row affine and a smooth function of the value: only
    // the more specific statement is made, unless the per-row affine fits ten times better (a
    // norm's bias `β` makes `X = a·R + (1-a)·β` only approximately a scale).
    let global_residual = global.first().map(|s| match s {
        Signature::Scale { residual, .. } | Signature::SignFlip { residual } => *residual,
        _ => 0.0,
    });
    let general = global.is_empty();
    let global_at = out.len();
    out.extend(global);
    out.extend(mask(&c));
    out.extend(relations::wiring(&c));
    out.extend(fits::temperature(&c));
    match (global_residual, fits::row_affine(&c)) {
        (None, affine) => out.extend(affine),
        (Some(g), Some(affine @ Signature::RowAffine { residual, .. })) if residual < 0.1 * g => {
            out.insert(global_at, affine)
        }
        _ => {}
    }
    let affine = fits::affine_above_floor(&c);
    let plain = affine.is_none()
        && general
        && !out.iter().any(|s| {
            matches!(
                s,
                Signature::Shift { .. }
                    | Signature::Reversed { .. }
                    | Signature::Permutation { .. }
                    | Signature::RowAffine { .. }
                    | Signature::Wiring { .. }
            )
        });
    out.extend(affine);
    if plain {
        out.extend(fits::channel_offset(&c));
    }
    let elementwise = fits::elementwise(&c);
    let named = elementwise.as_ref().filter(|s| {
        matches!(
            s,
            Signature::Elementwise {
                runtime: Some(_),
                ..
            }
        )
    });
    out.extend(named.cloned());
    out.extend(linear::grid_from_context(&c));
    out.extend(rounding(&c));
    out.extend(fits::clamp(&c));
    if named.is_none() && general {
        out.extend(elementwise);
    }
    out.extend(subset(&c));
    out
}

/// The best signature as an [`Explanation`] (`none` with summary statistics when nothing holds).
pub fn explain(r: &ArrayViewD<f32>, x: &ArrayViewD<f32>, opts: &ExplainOptions) -> Explanation {
    explain_with(r, x, opts, &OpContext::default())
}

/// [`explain`] with what the caller knows about the op ([`OpContext`]).
pub fn explain_with(
    r: &ArrayViewD<f32>,
    x: &ArrayViewD<f32>,
    opts: &ExplainOptions,
    oc: &OpContext<'_>,
) -> Explanation {
    let found = diagnose_with(r, x, opts, oc);
    match found.first() {
        Some(best) => {
            let mut evidence = serde_json::to_value(best).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut evidence {
                m.remove("signature");
                let also: Vec<Value> = found[1..].iter().map(|s| Value::from(s.name())).collect();
                if !also.is_empty() {
                    m.insert("also".into(), Value::Array(also));
                }
            }
            Explanation {
                signature: best.kind(),
                detail: best.detail(&opts.axis_names),
                evidence,
            }
        }
        None => {
            let detail = if r.shape() == x.shape() {
                let m = crate::metrics::compare(r, x, &opts.tolerance).ok();
                m.map(|m| {
                    format!(
                        "no known pattern: diffuse difference (rel_l2 {:.2e}, cosine {:.6}, {:.2}% of elements beyond tolerance)",
                        m.rel_l2,
                        m.cosine,
                        100.0 * m.beyond_fraction
                    )
                })
            } else {
                None
            };
            Explanation {
                signature: SignatureKind::None,
                detail: detail.unwrap_or_else(|| "no known pattern".into()),
                evidence: Value::Object(Default::default()),
            }
        }
    }
}

/// Subset signature over steps: given `(step, fails)` for one checkpoint name, the failing steps
/// when they are a proper subset (at most half) of the steps.
pub fn steps_subset(per_step: &[(Step, bool)]) -> Option<Signature> {
    let bad: Vec<usize> = per_step
        .iter()
        .filter(|(_, f)| *f)
        .map(|(s, _)| *s)
        .collect();
    (!bad.is_empty() && 2 * bad.len() <= per_step.len()).then(|| Signature::Subset {
        axis: None,
        axis_name: "step".into(),
        ranges: compress_ranges(&bad),
        indices: bad,
        of: per_step.len(),
        swapped: vec![],
        segments: vec![],
        sources: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use ndarray::Array;

    /// Deterministic pseudo-random tensor in [-1, 1).
    fn rand(shape: &[usize], seed: u64) -> ArrayD<f32> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = xray_core::testing::xorshift(seed)
            .take(n)
            .map(|s| ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
            .collect();
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    fn noisy(r: &ArrayD<f32>, rel: f32, seed: u64) -> ArrayD<f32> {
        r + &(rand(r.shape(), seed) * rel)
    }

    fn names(r: &ArrayD<f32>, x: &ArrayD<f32>) -> Vec<&'static str> {
        diagnose(&r.view(), &x.view(), &ExplainOptions::default())
            .iter()
            .map(Signature::name)
            .collect()
    }

    fn best(r: &ArrayD<f32>, x: &ArrayD<f32>) -> Signature {
        diagnose(&r.view(), &x.view(), &ExplainOptions::default())
            .into_iter()
            .next()
            .expect("a signature")
    }

    /// The region and kind of the mask [`best`] finds (panics on another signature).
    fn mask_found(r: &ArrayD<f32>, x: &ArrayD<f32>) -> (Triangle, MaskKind) {
        match best(r, x) {
            Signature::Mask { region, kind, .. } => (region, kind),
            s => panic!("{s:?}"),
        }
    }

    /// The format and evidence of the rounding [`best`] finds (panics on another signature).
    fn rounding_found(r: &ArrayD<f32>, x: &ArrayD<f32>) -> (RoundFormat, RoundingEvidence) {
        match best(r, x) {
            Signature::Rounding {
                format, evidence, ..
            } => (format, evidence),
            s => panic!("{s:?}"),
        }
    }

    /// `a` with `f` applied to every element `[.., i, j]` of its last two axes where `at(i, j)`.
    fn changed_where(
        a: &ArrayD<f32>,
        at: impl Fn(usize, usize) -> bool,
        f: impl Fn(&mut f32),
    ) -> ArrayD<f32> {
        let mut out = a.clone();
        let n = out.ndim();
        for (ix, v) in out.indexed_iter_mut() {
            if at(ix[n - 2], ix[n - 1]) {
                f(v);
            }
        }
        out
    }

    #[test]
    fn plain_noise_matches_nothing() {
        let r = rand(&[6, 16, 8], 1);
        let x = noisy(&r, 1e-2, 2);
        assert!(names(&r, &x).is_empty(), "{:?}", names(&r, &x));
        let e = explain(&r.view(), &x.view(), &ExplainOptions::default());
        assert_eq!(e.signature, SignatureKind::None);
        assert!(e.detail.contains("diffuse"));
        // Unrelated data is no pattern either.
        assert!(names(&r, &rand(&[6, 16, 8], 3)).is_empty());
    }

    #[test]
    fn head_major_token_major_mixup_is_a_permutation() {
        // R is head-major [H, T, D]; the runtime wrote token-major [T, H, D] data into it.
        let r = rand(&[4, 6, 8], 4);
        let tm = r
            .view()
            .permuted_axes(IxDyn(&[1, 0, 2]))
            .as_standard_layout()
            .to_owned();
        let x = ArrayD::from_shape_vec(IxDyn(&[4, 6, 8]), tm.iter().copied().collect()).unwrap();
        match best(&r, &x) {
            Signature::Permutation {
                axes,
                split,
                reinterpreted,
                ..
            } => {
                assert_eq!(axes, vec![1, 0, 2]);
                assert_eq!(split, None);
                assert!(reinterpreted);
            }
            s => panic!("{s:?}"),
        }
        // Token-major reference [T, H*D] holding head-major data: needs a split of axis 1.
        let r2 = rand(&[6, 32], 5);
        let hm = r2
            .clone()
            .into_shape_with_order(IxDyn(&[6, 4, 8]))
            .unwrap()
            .permuted_axes(IxDyn(&[1, 0, 2]))
            .as_standard_layout()
            .to_owned();
        let x2 = ArrayD::from_shape_vec(IxDyn(&[6, 32]), hm.iter().copied().collect()).unwrap();
        match best(&r2, &x2) {
            Signature::Permutation { split, axes, .. } => {
                assert_eq!(split, Some((1, [4, 8])));
                assert_eq!(axes, vec![1, 0, 2]);
            }
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn square_transpose_is_a_permutation_in_place() {
        let r = rand(&[8, 8], 6);
        let x = r.t().as_standard_layout().to_owned();
        match best(&r, &x) {
            Signature::Permutation {
                axes,
                reinterpreted,
                ..
            } => {
                assert_eq!(axes, vec![1, 0]);
                assert!(!reinterpreted);
            }
            s => panic!("{s:?}"),
        }
        // Different runtime shape, same data: still found.
        let xt = ArrayD::from_shape_vec(IxDyn(&[64]), x.iter().copied().collect()).unwrap();
        let sig = diagnose(&r.view(), &xt.view(), &ExplainOptions::default());
        assert_eq!(sig[0].name(), "permutation");
    }

    #[test]
    fn scale_with_hint_and_sign_flip() {
        let r = rand(&[4, 10, 8], 7);
        let x = &r * (1.0 / 8.0f32);
        match best(&r, &x) {
            Signature::Scale { factor, hint, .. } => {
                assert!((factor - 0.125).abs() < 1e-6);
                assert_eq!(hint.as_deref(), Some("1/8 = 1/sqrt(64)"));
            }
            s => panic!("{s:?}"),
        }
        assert_eq!(names(&r, &(&r * -1.0f32)), ["sign_flip"]);
        // Noise around a factor of one is not a scale.
        assert!(!names(&r, &noisy(&r, 1e-3, 8)).contains(&"scale"));
    }

    #[test]
    fn causal_mask_patterns() {
        let t = 6;
        let upper = |i: usize, j: usize| j > i;
        let probs = changed_where(&rand(&[2, t, t], 9).mapv(f32::abs), upper, |v| *v = 0.0);
        let scores = rand(&[2, t, t], 10);
        // Mask dropped on probabilities: the reference is zero above the diagonal.
        let dropped = rand(&[2, t, t], 11).mapv(|v| v.abs() + 0.01);
        assert_eq!(
            mask_found(&probs, &dropped),
            (Triangle::Upper, MaskKind::Dropped)
        );
        // Scores differ only in the strict upper triangle.
        let x = changed_where(&scores, upper, |v| *v = -1e9);
        assert_eq!(mask_found(&scores, &x), (Triangle::Upper, MaskKind::Added));
        // Confined to the lower triangle.
        let y = changed_where(&scores, |i, j| j < i, |v| *v += 1.0);
        assert_eq!(
            mask_found(&scores, &y),
            (Triangle::Lower, MaskKind::Confined)
        );
        assert!(!names(&scores, &noisy(&scores, 1e-1, 12)).contains(&"mask"));
    }

    #[test]
    fn subset_of_heads_and_swapped_heads() {
        let r = rand(&[6, 5, 8], 13);
        let mut x = r.clone();
        x.index_axis_mut(Axis(0), 2).mapv_inplace(|v| v + 0.5);
        let opts = ExplainOptions {
            axis_names: vec!["heads".into(), "tokens".into(), "head_dim".into()],
            ..Default::default()
        };
        let e = explain(&r.view(), &x.view(), &opts);
        assert_eq!(e.signature, SignatureKind::Subset);
        assert_eq!(e.evidence["indices"], serde_json::json!([2]));
        assert!(e.detail.contains("heads"), "{}", e.detail);
        // Two heads swapped.
        let mut s = r.clone();
        let (h1, h3) = (
            r.index_axis(Axis(0), 1).to_owned(),
            r.index_axis(Axis(0), 3).to_owned(),
        );
        s.index_axis_mut(Axis(0), 1).assign(&h3);
        s.index_axis_mut(Axis(0), 3).assign(&h1);
        match best(&r, &s) {
            Signature::Subset {
                axis,
                indices,
                swapped,
                ..
            } => {
                assert_eq!(axis, Some(0));
                assert_eq!(indices, vec![1, 3]);
                assert_eq!(swapped, vec![(1, 3), (3, 1)]);
            }
            sig => panic!("{sig:?}"),
        }
    }

    #[test]
    fn rounding_to_f16_and_bf16() {
        let r = rand(&[4, 64], 14) * 3.0f32;
        let f = r.mapv(|v| f16::from_f32(v).to_f32());
        assert_eq!(
            rounding_found(&r, &f),
            (RoundFormat::F16, RoundingEvidence::Exact)
        );
        let b = r.mapv(|v| bf16::from_f32(v).to_f32());
        assert_eq!(rounding_found(&r, &b).0, RoundFormat::Bf16);
        // Computed in f16 (representable, a few ULPs off) rather than a single rounding.
        let c = r.mapv(|v| f16::from_f32(v * 1.0007).to_f32());
        assert_eq!(
            rounding_found(&r, &c),
            (RoundFormat::F16, RoundingEvidence::Representable)
        );
        // Half-ULP-bounded noise that is not representable: the distribution test.
        let d = Array::from_iter(r.iter().zip(f.iter()).map(|(a, q)| a + 0.5 * (q - a)))
            .into_shape_with_order(IxDyn(&[4, 64]))
            .unwrap();
        assert_eq!(
            rounding_found(&r, &d),
            (RoundFormat::F16, RoundingEvidence::Distribution)
        );
        // Plain f32-level noise is not rounding.
        assert!(!names(&r, &noisy(&r, 1e-3, 15)).contains(&"rounding"));
    }

    #[test]
    fn non_finite_first_index() {
        let r = rand(&[3, 4], 16);
        let mut x = r.clone();
        x[[1, 2]] = f32::NAN;
        x[[2, 0]] = f32::INFINITY;
        match best(&r, &x) {
            Signature::NonFinite {
                first_index,
                first_value,
                count,
            } => {
                assert_eq!(first_index, vec![1, 2]);
                assert_eq!(first_value, "NaN");
                assert_eq!(count, 2);
            }
            s => panic!("{s:?}"),
        }
    }

    /// A kernel read backwards along its last axis (a conv flipped in time): `reversed`, that
    /// axis; noise is not.
    #[test]
    fn read_backwards_along_one_axis() {
        let r = rand(&[6, 5, 3], 23);
        let mut x = r.clone();
        x.invert_axis(Axis(2));
        match best(&r, &x) {
            Signature::Reversed { axis, residual } => {
                assert_eq!(axis, 2);
                assert!(residual < 1e-7, "{residual}");
            }
            s => panic!("{s:?}"),
        }
        assert!(!names(&r, &noisy(&r, 1e-1, 24)).contains(&"reversed"));
    }

    #[test]
    fn off_by_one_shift() {
        let r = rand(&[10, 16], 17);
        let mut x = r.clone();
        for t in 0..9 {
            let next = r.index_axis(Axis(0), t + 1).to_owned();
            x.index_axis_mut(Axis(0), t).assign(&next);
        }
        match best(&r, &x) {
            Signature::Shift { axis, offset, .. } => assert_eq!((axis, offset), (0, 1)),
            s => panic!("{s:?}"),
        }
        assert!(!names(&r, &noisy(&r, 1e-2, 18)).contains(&"shift"));
    }

    #[test]
    fn steps_subset_reports_failing_steps() {
        let s = steps_subset(&[(0, false), (1, true), (2, false), (3, false)]).unwrap();
        assert!(s.detail(&[]).contains("differ: 1;"), "{}", s.detail(&[]));
        // Consecutive failing steps read as one range.
        let s = steps_subset(&[
            (0, false),
            (1, true),
            (2, true),
            (3, true),
            (4, false),
            (5, false),
            (6, false),
        ])
        .unwrap();
        assert!(s.detail(&[]).contains("differ: 1..3;"), "{}", s.detail(&[]));
        assert!(steps_subset(&[(0, true), (1, false)]).is_some());
        assert!(steps_subset(&[(0, true), (1, true), (2, true)]).is_none());
        assert!(steps_subset(&[(0, false)]).is_none());
    }

    #[test]
    fn identical_tensors_have_no_signature() {
        let r = rand(&[3, 3], 19);
        assert!(names(&r, &r).is_empty());
    }
}
