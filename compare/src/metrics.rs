//! Element-wise comparison metrics between a reference tensor and a runtime tensor.
//!
//! [`compare`] makes one pass over two equally shaped `f32` tensors and returns every metric the
//! evidence carries ([`Metrics`]). [`compare_logits`] adds the per-position token-level metrics for
//! `[positions, vocab]` logits ([`LogitsMetrics`]).
//!
//! Conventions (also in `docs/tolerances.md`):
//! - `d = runtime - reference`, evaluated in `f64` (exact for two `f32` values).
//! - The reference must be finite: [`compare`] and [`compare_logits`] refuse a reference holding a
//!   NaN or Inf with [`Error::NonFiniteReference`] (an input error, never a match: NaN against NaN
//!   proves nothing). A non-finite runtime value where the reference is finite fails the checkpoint
//!   whatever the tolerance ([`Metrics::passes`]). [`compare_slices`] itself still counts
//!   non-finite values per side in [`NonFinite`] (sums run over the finite pairs).
//! - An element is beyond tolerance when `|d| > atol + rtol * max(|ref|, s)` with `s` the
//!   reference's RMS magnitude ([`magnitude`], [`Tolerance::element_bound`]).
//! - `rel_l2 = ||d|| / ||ref||`, `nmse = ||d||^2 / ||ref||^2`; when `||ref|| = 0` they are `0` if
//!   `d = 0` and `f64::MAX` otherwise, so every field is a finite JSON number.
//! - `cosine = <ref, run> / (||ref|| ||run||)`; `1` when both norms are zero, `0` when one is.
//! - `max_ulp` is the distance between the two `f32` bit patterns on the sign-aware ordered line
//!   (`+0` and `-0` are 0 apart; `-min_subnormal` and `+min_subnormal` are 2 apart).
//!
//! Speed: the contiguous path walks fixed-size chunks with lane-parallel `f64` accumulators that the
//! compiler vectorizes; the index of the worst element is recovered by rescanning only the chunk
//! that improved the maximum, and chunks holding non-finite values fall back to a careful scalar
//! path. See [`mod@bench`] for the throughput benchmark.

use ndarray::{ArrayViewD, Axis, Ix2};
use serde::{Deserialize, Serialize};

use crate::tolerance::Tolerance;
use crate::Error;

/// The element with the largest finite absolute difference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorstElement {
    /// Unravelled (C-order) index into the tensor.
    pub index: Vec<usize>,
    /// Reference value at `index`.
    #[serde(deserialize_with = "finite_f32")]
    pub reference: f32,
    /// Runtime value at `index`.
    #[serde(deserialize_with = "finite_f32")]
    pub runtime: f32,
}

/// A finite f32 read from JSON: a number past f32's range would become an infinity (which writes
/// back as `null`), so evidence holding one is refused, not read as a different value.
fn finite_f32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    let v = <f64 as Deserialize>::deserialize(d)?;
    let x = v as f32;
    if x.is_finite() {
        Ok(x)
    } else {
        Err(serde::de::Error::custom(format!("{v} is not a finite f32")))
    }
}

/// Non-finite value counts on each side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NonFinite {
    /// NaN count in the reference.
    pub reference_nan: u64,
    /// +/-Inf count in the reference.
    pub reference_inf: u64,
    /// NaN count in the runtime tensor.
    pub runtime_nan: u64,
    /// +/-Inf count in the runtime tensor.
    pub runtime_inf: u64,
    /// Elements where the runtime is non-finite and the reference is finite (always a failure).
    pub runtime_only: u64,
    /// Unravelled index of the first runtime-only non-finite element (C order).
    pub first_runtime_only: Option<Vec<usize>>,
}

/// Metrics of one reference/runtime pair. All floats are finite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Number of elements.
    pub count: u64,
    /// Largest `|d|` over finite pairs.
    pub max_abs: f64,
    /// Mean `|d|` over finite pairs.
    pub mean_abs: f64,
    /// Root mean square of `d` over finite pairs.
    pub rmse: f64,
    /// `||d|| / ||ref||` (see module doc for the zero-reference convention).
    pub rel_l2: f64,
    /// Cosine similarity of the two tensors.
    pub cosine: f64,
    /// `||d||^2 / ||ref||^2`.
    pub nmse: f64,
    /// Largest sign-aware `f32` ULP distance over finite pairs.
    pub max_ulp: u64,
    /// Elements with `|d| > atol + rtol * |ref|` (plus mismatched non-finite pairs).
    pub beyond_tolerance: u64,
    /// `beyond_tolerance / count` (0 for an empty tensor).
    pub beyond_fraction: f64,
    /// Largest `|d| / element bound` over finite pairs ([`Tolerance::element_bound`]; an element
    /// is an outlier when it exceeds 1): how close the closest element comes to the bound.
    #[serde(default)]
    pub max_bound_ratio: f64,
    /// Element with the largest finite `|d|` (`None` when there is no finite pair).
    pub worst: Option<WorstElement>,
    /// Non-finite counts.
    pub non_finite: NonFinite,
    /// Token-level metrics when the checkpoint is logits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits: Option<LogitsMetrics>,
}

impl Metrics {
    /// Whether these metrics pass `tol`: no runtime-only non-finite value, `rel_l2` within
    /// `tol.max_rel_l2` when set, and
    /// - ordinary tensors: the outlier fraction at most `tol.max_outlier_fraction`;
    /// - logits (`self.logits` set): judged as a token distribution instead of element by
    ///   element: KL defined and within `tol.max_kl` (when set) at every position, and no argmax
    ///   disagreement beyond a reference near-tie ([`LogitsMetrics::first_argmax_disagreement`]).
    pub fn passes(&self, tol: &Tolerance) -> bool {
        let common = self.non_finite.runtime_only == 0
            && self.non_finite.reference_nan == 0
            && self.non_finite.reference_inf == 0
            && tol.max_rel_l2.is_none_or(|m| self.rel_l2 <= m);
        common
            && match &self.logits {
                // Logits whose argmax disagrees would choose another token: a divergence even
                // inside the element tolerance. Elementwise outliers do not decide logits: the
                // distribution does (a logit of a token nobody picks may move by its noise).
                Some(l) => {
                    l.first_argmax_disagreement.is_none()
                        && l.kl_undefined == 0
                        && tol.max_kl.is_none_or(|k| l.kl_max <= k)
                }
                None => self.beyond_fraction <= tol.max_outlier_fraction,
            }
    }
}

/// Token-level metrics of one logits position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitsPosition {
    /// Argmax of the reference row (first maximum).
    pub argmax_reference: usize,
    /// Argmax of the runtime row (first maximum).
    pub argmax_runtime: usize,
    /// `|top5(ref) ∩ top5(run)|` (0..=5).
    pub top5_overlap: u32,
    /// `KL(softmax(ref) || softmax(run))` in nats; `None` when a row has a non-finite value.
    pub kl: Option<f64>,
    /// The argmaxes differ but the reference's values at the two indices are within twice their
    /// element tolerance of each other: a tie below the noise floor, not a disagreement.
    #[serde(default)]
    pub near_tie: bool,
}

/// Aggregated token-level metrics of a `[positions, vocab]` logits tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitsMetrics {
    /// Number of positions.
    pub positions: u64,
    /// Fraction of positions whose argmax agrees (near-ties count as disagreements here).
    pub argmax_agreement: f64,
    /// First position whose argmax disagrees and is not a reference near-tie.
    pub first_argmax_disagreement: Option<u64>,
    /// Positions whose argmax differs only within a reference near-tie.
    #[serde(default)]
    pub argmax_near_ties: u64,
    /// Positions whose KL is undefined (a non-finite value in a row).
    #[serde(default)]
    pub kl_undefined: u64,
    /// Mean top-5 overlap divided by 5 (1 = identical top-5 sets).
    pub top5_overlap_mean: f64,
    /// Smallest top-5 overlap count over positions.
    pub top5_overlap_min: u32,
    /// Mean KL over positions with a defined KL.
    pub kl_mean: f64,
    /// Largest KL over positions with a defined KL.
    pub kl_max: f64,
    /// Per-position detail.
    pub per_position: Vec<LogitsPosition>,
}

const CHUNK: usize = 2048;
const LANES: usize = 8;

/// Sign-aware ULP distance between two finite `f32` values.
#[inline(always)]
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    ulp_bits(a.to_bits(), b.to_bits()) as u64
}

/// Running sums of one comparison.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Acc {
    abs: f64,
    sq: f64,
    rr: f64,
    xx: f64,
    rx: f64,
    max_abs: f64,
    max_ulp: u64,
    beyond: u64,
    finite: u64,
    ratio: f64,
}

impl Acc {
    /// Add one finite pair (`a32` the reference, `b32` the runtime) to the sums (not to
    /// `finite`): the scalar form of [`chunk_lanes`]' per-lane arithmetic.
    #[inline(always)]
    fn add(&mut self, a32: f32, b32: f32, atol: f64, rtol: f64, scale: f64) {
        let (a, b) = (a32 as f64, b32 as f64);
        let d = b - a;
        self.abs += d.abs();
        self.sq += d * d;
        self.rr += a * a;
        self.xx += b * b;
        self.rx += a * b;
        self.max_abs = self.max_abs.max(d.abs());
        self.max_ulp = self.max_ulp.max(ulp_distance(a32, b32));
        let bound = atol + rtol * a.abs().max(scale);
        self.beyond += (d.abs() > bound) as u64;
        let q = d.abs() / bound;
        self.ratio = if q > self.ratio { q } else { self.ratio };
    }
}

/// Sign-aware ULP distance from raw `f32` bits, branch-free in `u32` (vectorizes). Never
/// overflows: two magnitudes are at most `0x7fff_ffff` each.
#[inline(always)]
fn ulp_bits(a: u32, b: u32) -> u32 {
    let (ma, mb) = (a & 0x7fff_ffff, b & 0x7fff_ffff);
    if (a ^ b) & 0x8000_0000 == 0 {
        ma.abs_diff(mb)
    } else {
        ma + mb
    }
}

/// Lane-parallel sums over one chunk of finite pairs; returns `None` if the chunk holds a
/// non-finite value (the caller then takes the scalar path). The lane structure is explicit, so
/// the result is bit-identical whatever instruction set the compiler vectorizes it for.
#[inline(always)]
fn chunk_lanes(r: &[f32], x: &[f32], atol: f64, rtol: f64, scale: f64) -> Option<Acc> {
    let mut abs = [0f64; LANES];
    let mut sq = [0f64; LANES];
    let mut rr = [0f64; LANES];
    let mut xx = [0f64; LANES];
    let mut rx = [0f64; LANES];
    let mut mx = [0f64; LANES];
    let mut mu = [0u32; LANES];
    let mut bey = [0u32; LANES];
    let mut rat = [0f64; LANES];
    let rc = r.chunks_exact(LANES);
    let xc = x.chunks_exact(LANES);
    let (rt, xt) = (rc.remainder(), xc.remainder());
    for (rl, xl) in rc.zip(xc) {
        for l in 0..LANES {
            let a = rl[l] as f64;
            let b = xl[l] as f64;
            let d = b - a;
            let ad = d.abs();
            abs[l] += ad;
            sq[l] += d * d;
            rr[l] += a * a;
            xx[l] += b * b;
            rx[l] += a * b;
            mx[l] = if ad > mx[l] { ad } else { mx[l] };
            let u = ulp_bits(rl[l].to_bits(), xl[l].to_bits());
            mu[l] = if u > mu[l] { u } else { mu[l] };
            let bound = atol + rtol * a.abs().max(scale);
            bey[l] += (ad > bound) as u32;
            // 0 / 0 is NaN and loses the comparison; a zero bound with ad > 0 gives +inf.
            let q = ad / bound;
            rat[l] = if q > rat[l] { q } else { rat[l] };
        }
    }
    let mut acc = Acc {
        abs: abs.iter().sum(),
        sq: sq.iter().sum(),
        rr: rr.iter().sum(),
        xx: xx.iter().sum(),
        rx: rx.iter().sum(),
        max_abs: mx.iter().copied().fold(0.0, f64::max),
        max_ulp: mu.iter().copied().max().unwrap_or(0) as u64,
        beyond: bey.iter().map(|&b| b as u64).sum(),
        finite: r.len() as u64,
        ratio: rat.iter().copied().fold(0.0, f64::max),
    };
    for (&a32, &b32) in rt.iter().zip(xt) {
        acc.add(a32, b32, atol, rtol, scale);
    }
    // With f64 sums of f32 inputs only a non-finite input can make a sum non-finite.
    (acc.abs.is_finite() && acc.rr.is_finite() && acc.xx.is_finite()).then_some(acc)
}

/// [`chunk_lanes`] compiled for AVX2 (4 f64 lanes per register instead of SSE2's 2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn chunk_avx2(r: &[f32], x: &[f32], atol: f64, rtol: f64, scale: f64) -> Option<Acc> {
    chunk_lanes(r, x, atol, rtol, scale)
}

type ChunkFn = fn(&[f32], &[f32], f64, f64, f64) -> Option<Acc>;

/// Chooses the widest available instruction set once per comparison.
#[allow(unsafe_code)] // calling the AVX2 build once the CPU is known to support it
fn chunk_kernel() -> ChunkFn {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, the only requirement of `chunk_avx2`.
            return |r, x, a, t, s| unsafe { chunk_avx2(r, x, a, t, s) };
        }
    }
    |r, x, a, t, s| chunk_lanes(r, x, a, t, s)
}

/// Merges chunk sums into the running total.
fn merge(t: &mut Acc, c: &Acc) {
    t.abs += c.abs;
    t.sq += c.sq;
    t.rr += c.rr;
    t.xx += c.xx;
    t.rx += c.rx;
    t.max_ulp = t.max_ulp.max(c.max_ulp);
    t.beyond += c.beyond;
    t.finite += c.finite;
    t.ratio = t.ratio.max(c.ratio);
}

/// Unravels a C-order flat index.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (i, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[i] = flat % n;
            flat /= n;
        }
    }
    idx
}

/// Both sides must have the same shape (the pair was aligned before it got here).
fn same_shape(reference: &ArrayViewD<f32>, runtime: &ArrayViewD<f32>) -> Result<(), Error> {
    if reference.shape() != runtime.shape() {
        return Err(Error::ShapeMismatch {
            reference: reference.shape().to_vec(),
            runtime: runtime.shape().to_vec(),
        });
    }
    Ok(())
}

/// Compares two equally shaped tensors under `tol` (only `atol` and `rtol` enter the metrics).
///
/// Non-contiguous views are copied once into standard layout; indices are always C-order logical
/// indices.
pub fn compare(
    reference: &ArrayViewD<f32>,
    runtime: &ArrayViewD<f32>,
    tol: &Tolerance,
) -> Result<Metrics, Error> {
    same_shape(reference, runtime)?;
    let r = reference.as_standard_layout();
    let x = runtime.as_standard_layout();
    let shape = reference.shape();
    check_reference_finite(&r.view())?;
    Ok(match (r.as_slice(), x.as_slice()) {
        (Some(rs), Some(xs)) => compare_slices(rs, xs, shape, tol),
        // Standard layout is contiguous; this copy only guards against a future ndarray change.
        _ => {
            let rs: Vec<f32> = r.iter().copied().collect();
            let xs: Vec<f32> = x.iter().copied().collect();
            compare_slices(&rs, &xs, shape, tol)
        }
    })
}

/// Refuses a reference holding a NaN or Inf: [`Error::NonFiniteReference`] with the count and
/// the first (C-order) index. The reference is the oracle's output; a non-finite value there means
/// broken weights or input, and comparing against it would let NaN match NaN.
pub fn check_reference_finite(reference: &ArrayViewD<f32>) -> Result<(), Error> {
    let mut first: Option<(usize, f32)> = None;
    let mut count = 0u64;
    for (i, &v) in reference.iter().enumerate() {
        if !v.is_finite() {
            count += 1;
            first.get_or_insert((i, v));
        }
    }
    match first {
        None => Ok(()),
        Some((i, v)) => Err(Error::NonFiniteReference {
            checkpoint: None,
            count,
            index: unravel(i, reference.shape()),
            value: non_finite_name(v).into(),
        }),
    }
}

/// `NaN`, `inf` or `-inf`.
pub fn non_finite_name(v: f32) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// RMS magnitude of the finite values of `r` (`0` when there are none): the scale that f32
/// accumulation noise grows with, used by [`Tolerance::element_bound`].
pub fn magnitude(r: &[f32]) -> f64 {
    let mut ss = [0f64; LANES];
    let mut n = 0u64;
    let c = r.chunks_exact(LANES);
    let rest = c.remainder();
    for l8 in c {
        for l in 0..LANES {
            let v = l8[l] as f64;
            let ok = v.is_finite();
            ss[l] += if ok { v * v } else { 0.0 };
            n += ok as u64;
        }
    }
    let mut s: f64 = ss.iter().sum();
    for &v in rest {
        if v.is_finite() {
            s += (v as f64).powi(2);
            n += 1;
        }
    }
    if n > 0 {
        (s / n as f64).sqrt()
    } else {
        0.0
    }
}

/// [`compare`] on contiguous C-order data of the given shape (`r.len() == x.len()` is assumed to be
/// the product of `shape`; extra elements of the longer slice are ignored).
pub fn compare_slices(r: &[f32], x: &[f32], shape: &[usize], tol: &Tolerance) -> Metrics {
    let n = r.len().min(x.len());
    let (r, x) = (&r[..n], &x[..n]);
    let (atol, rtol) = (tol.atol, tol.rtol);
    let scale = magnitude(r);
    let mut t = Acc::default();
    let mut worst_flat: Option<usize> = None;
    let mut nf = NonFinite::default();
    let mut first_bad: Option<usize> = None;
    let chunk_fast = chunk_kernel();
    for (ci, (rc, xc)) in r.chunks(CHUNK).zip(x.chunks(CHUNK)).enumerate() {
        let base = ci * CHUNK;
        let c = match chunk_fast(rc, xc, atol, rtol, scale) {
            Some(c) => c,
            None => chunk_slow(rc, xc, base, (atol, rtol, scale), &mut nf, &mut first_bad),
        };
        if c.finite > 0 && (worst_flat.is_none() || c.max_abs > t.max_abs) {
            // Rescan only the chunk that holds the new maximum (first occurrence wins).
            for (i, (&a, &b)) in rc.iter().zip(xc).enumerate() {
                if a.is_finite() && b.is_finite() && (b as f64 - a as f64).abs() == c.max_abs {
                    worst_flat = Some(base + i);
                    break;
                }
            }
            t.max_abs = c.max_abs;
        }
        merge(&mut t, &c);
    }
    nf.first_runtime_only = first_bad.map(|f| unravel(f, shape));
    let count = n as u64;
    let fin = t.finite.max(1) as f64;
    let (dn, rn, xn) = (t.sq.sqrt(), t.rr.sqrt(), t.xx.sqrt());
    let ratio = |num: f64, den: f64| {
        if den > 0.0 {
            (num / den).min(f64::MAX)
        } else if num == 0.0 {
            0.0
        } else {
            f64::MAX
        }
    };
    let cosine = match (rn > 0.0, xn > 0.0) {
        (true, true) => (t.rx / (rn * xn)).clamp(-1.0, 1.0),
        (false, false) => 1.0,
        _ => 0.0,
    };
    Metrics {
        count,
        max_abs: t.max_abs,
        mean_abs: t.abs / fin,
        rmse: (t.sq / fin).sqrt(),
        rel_l2: ratio(dn, rn),
        cosine,
        nmse: ratio(t.sq, t.rr),
        max_ulp: t.max_ulp,
        beyond_tolerance: t.beyond,
        beyond_fraction: if count > 0 {
            t.beyond as f64 / count as f64
        } else {
            0.0
        },
        max_bound_ratio: t.ratio.min(f64::MAX),
        worst: worst_flat.map(|f| WorstElement {
            index: unravel(f, shape),
            reference: r[f],
            runtime: x[f],
        }),
        non_finite: nf,
        logits: None,
    }
}

/// Scalar path for a chunk that holds non-finite values.
fn chunk_slow(
    r: &[f32],
    x: &[f32],
    base: usize,
    (atol, rtol, scale): (f64, f64, f64),
    nf: &mut NonFinite,
    first_bad: &mut Option<usize>,
) -> Acc {
    let mut acc = Acc::default();
    for (i, (&a32, &b32)) in r.iter().zip(x).enumerate() {
        let (fa, fb) = (a32.is_finite(), b32.is_finite());
        nf.reference_nan += a32.is_nan() as u64;
        nf.reference_inf += a32.is_infinite() as u64;
        nf.runtime_nan += b32.is_nan() as u64;
        nf.runtime_inf += b32.is_infinite() as u64;
        if fa && fb {
            acc.add(a32, b32, atol, rtol, scale);
            acc.finite += 1;
        } else {
            let same = (a32.is_nan() && b32.is_nan()) || (a32 == b32);
            acc.beyond += (!same) as u64;
            if fa && !fb {
                nf.runtime_only += 1;
                first_bad.get_or_insert(base + i);
            }
        }
    }
    acc
}

/// Indices of the `k` largest values of `row` (ties: lower index first; NaN sorts lowest).
fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        let v = key(v);
        if best.len() == k && best.last().is_some_and(|&j| key(row[j]) >= v) {
            continue;
        }
        let pos = best
            .iter()
            .position(|&j| key(row[j]) < v)
            .unwrap_or(best.len());
        best.insert(pos, i);
        best.truncate(k);
    }
    best
}

/// `log_softmax` of a row in `f64`; `None` if the row has a non-finite value or is empty.
fn log_softmax(row: &[f32]) -> Option<Vec<f64>> {
    if row.is_empty() || row.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    Some(row.iter().map(|&v| v as f64 - lse).collect())
}

/// Token-level metrics of `[positions, vocab]` logits: per-position argmax agreement, top-5
/// overlap and `KL(softmax(ref) || softmax(run))`, aggregated. An argmax disagreement is a
/// *near-tie* (not counted in `first_argmax_disagreement`) when the reference's values at the two
/// indices are within `2 * tol.element_bound` of each other: each may legitimately move by its
/// element bound, so their order is below the noise floor.
pub fn logits_metrics(
    reference: &ArrayViewD<f32>,
    runtime: &ArrayViewD<f32>,
    tol: &Tolerance,
) -> Result<LogitsMetrics, Error> {
    same_shape(reference, runtime)?;
    let not_logits = || Error::NotLogits {
        shape: reference.shape().to_vec(),
    };
    let r2 = reference
        .view()
        .into_dimensionality::<Ix2>()
        .map_err(|_| not_logits())?;
    let x2 = runtime
        .view()
        .into_dimensionality::<Ix2>()
        .map_err(|_| not_logits())?;
    let scale = magnitude(&reference.iter().copied().collect::<Vec<f32>>());
    let mut per_position = Vec::with_capacity(r2.nrows());
    for (rrow, xrow) in r2.axis_iter(Axis(0)).zip(x2.axis_iter(Axis(0))) {
        let rrow = rrow.to_vec();
        let xrow = xrow.to_vec();
        let (tr, tx) = (top_k(&rrow, 5), top_k(&xrow, 5));
        let kl = match (log_softmax(&rrow), log_softmax(&xrow)) {
            (Some(lr), Some(lx)) => Some(
                lr.iter()
                    .zip(&lx)
                    .map(|(a, b)| a.exp() * (a - b))
                    .sum::<f64>()
                    .max(0.0),
            ),
            _ => None,
        };
        let (ar, ax) = (
            tr.first().copied().unwrap_or(0),
            tx.first().copied().unwrap_or(0),
        );
        let near_tie = ar != ax && {
            let (top, other) = (rrow[ar] as f64, rrow[ax] as f64);
            // Both values finite and apart by at most the sum of their element bounds.
            (top - other).abs() <= tol.element_bound(top, scale) + tol.element_bound(other, scale)
        };
        per_position.push(LogitsPosition {
            argmax_reference: ar,
            argmax_runtime: ax,
            top5_overlap: tr.iter().filter(|i| tx.contains(i)).count() as u32,
            kl,
            near_tie,
        });
    }
    let n = per_position.len();
    let agree = per_position
        .iter()
        .filter(|p| p.argmax_reference == p.argmax_runtime)
        .count();
    let kls: Vec<f64> = per_position.iter().filter_map(|p| p.kl).collect();
    Ok(LogitsMetrics {
        positions: n as u64,
        argmax_agreement: if n > 0 { agree as f64 / n as f64 } else { 1.0 },
        first_argmax_disagreement: per_position
            .iter()
            .position(|p| p.argmax_reference != p.argmax_runtime && !p.near_tie)
            .map(|p| p as u64),
        argmax_near_ties: per_position.iter().filter(|p| p.near_tie).count() as u64,
        kl_undefined: per_position.iter().filter(|p| p.kl.is_none()).count() as u64,
        top5_overlap_mean: if n > 0 {
            per_position
                .iter()
                .map(|p| p.top5_overlap as f64)
                .sum::<f64>()
                / (5.0 * n as f64)
        } else {
            1.0
        },
        top5_overlap_min: per_position
            .iter()
            .map(|p| p.top5_overlap)
            .min()
            .unwrap_or(5),
        kl_mean: if kls.is_empty() {
            0.0
        } else {
            kls.iter().sum::<f64>() / kls.len() as f64
        },
        kl_max: kls.iter().copied().fold(0.0, f64::max),
        per_position,
    })
}

/// [`compare`] plus [`logits_metrics`] in `Metrics::logits`.
pub fn compare_logits(
    reference: &ArrayViewD<f32>,
    runtime: &ArrayViewD<f32>,
    tol: &Tolerance,
) -> Result<Metrics, Error> {
    let mut m = compare(reference, runtime, tol)?;
    m.logits = Some(logits_metrics(reference, runtime, tol)?);
    Ok(m)
}

/// Throughput benchmark of [`compare_slices`] (plain `std::time`).
pub mod bench {
    use std::time::Instant;

    use crate::tolerance::Tolerance;

    /// Result of one benchmark run.
    #[derive(Debug, Clone)]
    pub struct BenchResult {
        /// Elements per tensor.
        pub elements: usize,
        /// Timed iterations.
        pub iterations: usize,
        /// Best wall time of one iteration, seconds.
        pub best_seconds: f64,
        /// Throughput counting the bytes of both tensors (8 bytes per pair), GB/s (1e9).
        pub gbps_pairs: f64,
        /// Throughput counting one tensor's bytes (4 bytes per element), GB/s (1e9).
        pub gbps_one_side: f64,
    }

    /// Seconds [`crate::signatures::explain`] takes on a noisy tensor of `shape` (the common,
    /// no-pattern case, which runs every candidate test).
    pub fn explain_seconds(shape: &[usize]) -> f64 {
        let n: usize = shape.iter().product();
        let r: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.618).sin()).collect();
        let x: Vec<f32> = r
            .iter()
            .enumerate()
            .map(|(i, v)| v + 1e-3 * ((i as f32) * 1.7).cos())
            .collect();
        let (Ok(r), Ok(x)) = (
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), r),
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), x),
        ) else {
            return 0.0;
        };
        let t = Instant::now();
        let e = crate::signatures::explain(&r.view(), &x.view(), &Default::default());
        std::hint::black_box(&e);
        t.elapsed().as_secs_f64()
    }

    /// Compares two pseudo-random tensors of `elements` `f32` values `iterations` times on the
    /// current thread and reports the best iteration.
    pub fn run(elements: usize, iterations: usize) -> BenchResult {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let r: Vec<f32> = (0..elements).map(|_| next()).collect();
        let x: Vec<f32> = r.iter().map(|&v| v + 1e-6 * next()).collect();
        let tol = Tolerance::default_f32();
        let mut best = f64::INFINITY;
        for _ in 0..iterations.max(1) {
            let t = Instant::now();
            let m = super::compare_slices(&r, &x, &[elements], &tol);
            std::hint::black_box(&m);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let best = best.max(1e-12);
        BenchResult {
            elements,
            iterations: iterations.max(1),
            best_seconds: best,
            gbps_pairs: 8.0 * elements as f64 / best / 1e9,
            gbps_one_side: 4.0 * elements as f64 / best / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;
    use ndarray::{ArrayD, IxDyn};

    /// A worst element past f32's range is refused on reading, not read as an infinity (which
    /// would write back as `null` and read back as something else).
    #[test]
    fn a_worst_element_past_f32_range_is_refused() {
        let read = |r: &str| {
            serde_json::from_str::<WorstElement>(&format!(
                r#"{{"index": [0], "reference": {r}, "runtime": 0.5}}"#
            ))
        };
        assert!(read("1e39").is_err_and(|e| e.to_string().contains("not a finite f32")));
        assert!(read("-3.5e38").is_err());
        let w = read("1.5").expect("a finite value reads");
        let back: WorstElement =
            serde_json::from_str(&serde_json::to_string(&w).expect("writes")).expect("reads back");
        assert_eq!(back, w);
    }

    fn arr(shape: &[usize], v: Vec<f32>) -> ArrayD<f32> {
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    fn tol(atol: f64, rtol: f64) -> Tolerance {
        Tolerance {
            atol,
            rtol,
            max_outlier_fraction: 0.0,
            max_rel_l2: None,
            max_kl: None,
        }
    }

    #[test]
    fn basic_metrics_match_hand_computation() {
        let r = arr(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let x = arr(&[2, 2], vec![1.0, 2.5, 3.0, 3.0]);
        let m = compare(&r.view(), &x.view(), &tol(0.1, 0.0)).unwrap();
        assert_eq!(m.count, 4);
        assert_relative_eq!(m.max_abs, 1.0);
        assert_relative_eq!(m.mean_abs, 0.375);
        assert_relative_eq!(m.rmse, (1.25f64 / 4.0).sqrt());
        assert_relative_eq!(m.rel_l2, (1.25f64 / 30.0).sqrt());
        assert_relative_eq!(m.nmse, 1.25 / 30.0);
        let dot = 1.0 + 5.0 + 9.0 + 12.0;
        let cos = dot / (30f64.sqrt() * (1.0f64 + 6.25 + 9.0 + 9.0).sqrt());
        assert_relative_eq!(m.cosine, cos, epsilon = 1e-12);
        assert_eq!(m.beyond_tolerance, 2);
        assert_relative_eq!(m.beyond_fraction, 0.5);
        let w = m.worst.unwrap();
        assert_eq!(w.index, vec![1, 1]);
        assert_eq!((w.reference, w.runtime), (4.0, 3.0));
    }

    #[test]
    fn identical_tensors_are_exact() {
        let r = arr(&[3], vec![0.0, -1.0, 5.0]);
        let m = compare(&r.view(), &r.view(), &tol(0.0, 0.0)).unwrap();
        assert_eq!(m.max_abs, 0.0);
        assert_eq!(m.rel_l2, 0.0);
        assert_eq!(m.max_ulp, 0);
        assert_eq!(m.cosine, 1.0);
        assert!(m.passes(&tol(0.0, 0.0)));
    }

    #[test]
    fn ulp_distance_is_sign_aware() {
        assert_eq!(ulp_distance(0.0, -0.0), 0);
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        let tiny = f32::from_bits(1);
        assert_eq!(ulp_distance(tiny, -tiny), 2);
        assert_eq!(ulp_distance(-1.0, -1.0 - f32::EPSILON), 1);
    }

    #[test]
    fn runtime_only_non_finite_always_fails() {
        let r = arr(&[2, 3], vec![1.0, 2.0, f32::NAN, 4.0, 5.0, 6.0]);
        let x = arr(&[2, 3], vec![1.0, 2.0, f32::NAN, f32::INFINITY, 5.0, 6.0]);
        // `compare` refuses the NaN reference; the slice kernel still counts both sides.
        assert!(matches!(
            compare(&r.view(), &x.view(), &tol(1e9, 1e9)),
            Err(Error::NonFiniteReference { count: 1, .. })
        ));
        let m = compare_slices(
            r.as_slice().unwrap(),
            x.as_slice().unwrap(),
            &[2, 3],
            &tol(1e9, 1e9),
        );
        assert_eq!(m.non_finite.reference_nan, 1);
        assert_eq!(m.non_finite.runtime_nan, 1);
        assert_eq!(m.non_finite.runtime_inf, 1);
        assert_eq!(m.non_finite.runtime_only, 1);
        assert_eq!(m.non_finite.first_runtime_only, Some(vec![1, 0]));
        assert_eq!(m.beyond_tolerance, 1, "matching NaNs are not outliers");
        assert_eq!(m.max_abs, 0.0, "sums cover finite pairs only");
        let mut loose = tol(1e9, 1e9);
        loose.max_outlier_fraction = 1.0;
        assert!(!m.passes(&loose));
    }

    #[test]
    fn zero_reference_conventions() {
        let z = arr(&[4], vec![0.0; 4]);
        let x = arr(&[4], vec![0.0, 0.0, 1.0, 0.0]);
        let m = compare(&z.view(), &z.view(), &tol(0.0, 0.0)).unwrap();
        assert_eq!((m.rel_l2, m.nmse, m.cosine), (0.0, 0.0, 1.0));
        let m = compare(&z.view(), &x.view(), &tol(0.0, 0.0)).unwrap();
        assert_eq!((m.rel_l2, m.cosine), (f64::MAX, 0.0));
        let back: Metrics = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back.rel_l2, f64::MAX, "the sentinel survives JSON");
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        let a = arr(&[2, 3], vec![0.0; 6]);
        let b = arr(&[3, 2], vec![0.0; 6]);
        assert!(matches!(
            compare(&a.view(), &b.view(), &tol(0.0, 0.0)),
            Err(Error::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn fast_path_matches_scalar_reference_on_large_input() {
        let n = 3 * CHUNK + 37;
        let r: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        let mut x: Vec<f32> = r.iter().map(|v| v * 1.0001).collect();
        x[2 * CHUNK + 5] += 3.0;
        let m = compare_slices(&r, &x, &[n], &tol(1e-4, 0.0));
        let (mut sq, mut rr, mut beyond) = (0f64, 0f64, 0u64);
        for (a, b) in r.iter().zip(&x) {
            let d = *b as f64 - *a as f64;
            sq += d * d;
            rr += (*a as f64).powi(2);
            beyond += (d.abs() > 1e-4) as u64;
        }
        assert_relative_eq!(m.rel_l2, (sq / rr).sqrt(), max_relative = 1e-12);
        assert_eq!(m.beyond_tolerance, beyond);
        assert_eq!(m.worst.unwrap().index, vec![2 * CHUNK + 5]);
    }

    #[test]
    fn non_contiguous_views_use_logical_indices() {
        let r = arr(&[2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let mut x = r.clone();
        x[[0, 2]] = 9.0;
        let (rt, xt) = (r.t(), x.t());
        let m = compare(&rt, &xt, &tol(0.0, 0.0)).unwrap();
        assert_eq!(m.worst.unwrap().index, vec![2, 0]);
    }

    #[test]
    fn logits_metrics_per_position() {
        let r = arr(
            &[2, 6],
            vec![
                0.0, 5.0, 1.0, 2.0, 3.0, 4.0, //
                9.0, 0.0, 0.0, 0.0, 0.0, 1.0,
            ],
        );
        let x = arr(
            &[2, 6],
            vec![
                0.0, 5.0, 1.0, 2.0, 3.0, 4.0, //
                0.0, 9.0, 0.0, 0.0, 0.0, 1.0,
            ],
        );
        let m = compare_logits(&r.view(), &x.view(), &tol(0.0, 0.0)).unwrap();
        let l = m.logits.unwrap();
        assert_eq!(l.positions, 2);
        assert_relative_eq!(l.argmax_agreement, 0.5);
        assert_eq!(l.first_argmax_disagreement, Some(1));
        assert_eq!(l.per_position[0].top5_overlap, 5);
        assert_relative_eq!(l.per_position[0].kl.unwrap(), 0.0, epsilon = 1e-12);
        assert!(l.per_position[1].kl.unwrap() > 1.0);
        assert_eq!(l.per_position[1].argmax_runtime, 1);
        assert!(l.kl_max >= l.kl_mean);
        let bad = arr(&[3], vec![0.0; 3]);
        assert!(logits_metrics(&bad.view(), &bad.view(), &tol(0.0, 0.0)).is_err());
    }

    #[test]
    fn top_k_orders_and_breaks_ties_by_index() {
        assert_eq!(top_k(&[1.0, 3.0, 3.0, 0.0, 2.0], 3), vec![1, 2, 4]);
        assert_eq!(top_k(&[f32::NAN, 1.0], 5), vec![1, 0]);
    }

    #[test]
    fn simd_kernel_is_bit_identical_to_portable() {
        let r: Vec<f32> = (0..CHUNK + 5)
            .map(|i| (i as f32 * 0.31).sin() * 7.0)
            .collect();
        let x: Vec<f32> = r
            .iter()
            .enumerate()
            .map(|(i, v)| v + (i as f32).cos() * 1e-3)
            .collect();
        let portable = chunk_lanes(&r, &x, 1e-4, 1e-3, 0.5);
        assert_eq!(chunk_kernel()(&r, &x, 1e-4, 1e-3, 0.5), portable);
        assert!(portable.is_some());
    }

    #[test]
    fn bench_runs() {
        let b = bench::run(10_000, 2);
        assert!(b.gbps_pairs > 0.0);
    }
}
