//! Grid quantization of a linear op's weight, at the op: `y = x·Wᵀ + b` with the runtime using
//! `W_q = round(W / s)·s`, a symmetric uniform grid of `2^(b-1) - 1` steps either side (per
//! tensor: one `s = max|W| / (2^(b-1) - 1)`; per row: one per output row).
//!
//! What detection needs: the op's input `x` (the reference's, `[rows, in]`) and both outputs
//! (`[rows, out]`). Then `X - R = x·(W_q - W)ᵀ`:
//! - with the weight `W` (the caller has the model folder), each grid hypothesis is tested directly
//!   against the residual;
//! - without it, `W` and `W_q` are recovered by least squares from `(x, R)` and `(x, X)` (with a bias
//!   column), which needs more rows than input features and a well-conditioned `x`; `W_q` must
//!   then lie on a grid and `W` must not. A norm's output is never well-conditioned here (its
//!   centred features satisfy one linear relation, so `W` is known only up to one direction): the
//!   projections that read one (Q/K/V, fc1) need the weight.
//!
//! At the weight's consumer further downstream (a layer output) the rounding is one diffuse error
//! among many: it is not claimed there.

use ndarray::{Array2, ArrayView2, Axis};

use super::{Ctx, Granularity, Signature};

/// Bit widths tried.
const BITS: std::ops::RangeInclusive<u32> = 2..=8;
/// A recovered weight is "on the grid" within this fraction of a step.
const ON_GRID: f64 = 0.1;

fn to64(a: &ArrayView2<f32>) -> Array2<f64> {
    a.mapv(|v| v as f64)
}

/// The grid steps of a hypothesis, one per row of `w` (`[out, in]`), or `None` for an all-zero row
/// set.
fn steps(w: &Array2<f64>, g: Granularity, bits: u32) -> Option<Vec<f64>> {
    let levels = ((1u32 << (bits - 1)) - 1) as f64;
    let row_max: Vec<f64> = w
        .axis_iter(Axis(0))
        .map(|r| r.iter().fold(0f64, |m, v| m.max(v.abs())))
        .collect();
    let all = row_max.iter().fold(0f64, |m, v| m.max(*v));
    if all <= 0.0 {
        return None;
    }
    Some(match g {
        Granularity::PerTensor => vec![all / levels; row_max.len()],
        Granularity::PerRow => row_max
            .iter()
            .map(|m| if *m > 0.0 { m / levels } else { all / levels })
            .collect(),
    })
}

fn quantize(w: &Array2<f64>, s: &[f64]) -> Array2<f64> {
    let mut q = w.clone();
    for (mut row, st) in q.axis_iter_mut(Axis(0)).zip(s) {
        row.mapv_inplace(|v| (v / st).round() * st);
    }
    q
}

/// Fraction of `w`'s elements within [`ON_GRID`] of a step multiple.
fn on_grid(w: &Array2<f64>, s: &[f64]) -> f64 {
    let mut k = 0usize;
    for (row, st) in w.axis_iter(Axis(0)).zip(s) {
        k += row
            .iter()
            .filter(|v| {
                let t = *v / st;
                (t - t.round()).abs() <= ON_GRID
            })
            .count();
    }
    k as f64 / w.len().max(1) as f64
}

/// Solves `A z = B` for symmetric positive definite `A` (Cholesky, f64); `None` when `A` is not
/// numerically positive definite.
fn cholesky_solve(a: &Array2<f64>, b: &Array2<f64>) -> Option<Array2<f64>> {
    let n = a.nrows();
    let mut l = Array2::<f64>::zeros((n, n));
    let max_diag = (0..n).map(|i| a[[i, i]]).fold(0f64, f64::max);
    for j in 0..n {
        let mut d = a[[j, j]];
        for k in 0..j {
            d -= l[[j, k]] * l[[j, k]];
        }
        if d <= 1e-12 * max_diag {
            return None;
        }
        let d = d.sqrt();
        l[[j, j]] = d;
        for i in (j + 1)..n {
            let mut s = a[[i, j]];
            for k in 0..j {
                s -= l[[i, k]] * l[[j, k]];
            }
            l[[i, j]] = s / d;
        }
    }
    let mut z = b.clone();
    for mut col in z.axis_iter_mut(Axis(1)) {
        for i in 0..n {
            let mut s = col[i];
            for k in 0..i {
                s -= l[[i, k]] * col[k];
            }
            col[i] = s / l[[i, i]];
        }
        for i in (0..n).rev() {
            let mut s = col[i];
            for k in (i + 1)..n {
                s -= l[[k, i]] * col[k];
            }
            col[i] = s / l[[i, i]];
        }
    }
    Some(z)
}

/// Least-squares `y ≈ x·Wᵀ + b`: `(W [out, in], b, relative residual)`.
fn recover(
    xa: &Array2<f64>,
    gram: &Array2<f64>,
    y: &Array2<f64>,
) -> Option<(Array2<f64>, Vec<f64>, f64)> {
    let k = xa.ncols() - 1;
    let z = cholesky_solve(gram, &xa.t().dot(y))?;
    let resid = (y - &xa.dot(&z)).mapv(|v| v * v).sum();
    let yy = y.mapv(|v| v * v).sum();
    let w = z.slice(ndarray::s![..k, ..]).t().to_owned();
    let b = z.row(k).to_vec();
    Some((w, b, if yy > 0.0 { (resid / yy).sqrt() } else { 0.0 }))
}

/// Grid quantization of a linear op's weight from its input `x` `[rows, in]`, the reference and
/// runtime outputs `[rows, out]`, and the reference weight `[out, in]` when known. `explain_rel` is
/// the relative residual a hypothesis must reach (as in
/// [`super::ExplainOptions::explain_rel`]); it must also explain 99% of the squared difference.
pub fn linear_grid(
    x: &ArrayView2<f32>,
    y_ref: &ArrayView2<f32>,
    y_run: &ArrayView2<f32>,
    weight: Option<&ArrayView2<f32>>,
    explain_rel: f64,
) -> Option<Signature> {
    let (n, k) = x.dim();
    let m = y_ref.ncols();
    if y_ref.dim() != (n, m) || y_run.dim() != (n, m) || n == 0 || k == 0 {
        return None;
    }
    let xs = to64(x);
    let (yr, yx) = (to64(y_ref), to64(y_run));
    let d = &yx - &yr;
    let dd = d.mapv(|v| v * v).sum();
    let xx = yx.mapv(|v| v * v).sum();
    let budget = (explain_rel.powi(2) * xx).min(0.01 * dd);
    if dd <= 0.0 || xs.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let rel = |sq: f64| if xx > 0.0 { (sq / xx).sqrt() } else { 0.0 };
    let hyps = || {
        [Granularity::PerTensor, Granularity::PerRow]
            .into_iter()
            .flat_map(|g| BITS.map(move |b| (g, b)))
    };
    let (w, recovered, w_run) = match weight {
        Some(w) if w.dim() == (m, k) => (to64(w), false, None),
        Some(_) => return None,
        None => {
            // More rows than unknowns per output (k weights and a bias).
            if n <= k + 1 {
                return None;
            }
            let mut xa = Array2::<f64>::ones((n, k + 1));
            xa.slice_mut(ndarray::s![.., ..k]).assign(&xs);
            let gram = xa.t().dot(&xa);
            let (wr, _, fr) = recover(&xa, &gram, &yr)?;
            let (wx, _, fx) = recover(&xa, &gram, &yx)?;
            // Both sides must be the linear op they claim to be.
            if fr > explain_rel || fx > explain_rel {
                return None;
            }
            (wr, true, Some(wx))
        }
    };
    let mut best: Option<(f64, Granularity, u32, Vec<f64>)> = None;
    for (g, bits) in hyps() {
        // The grid is read off the runtime weight when recovered (its max is a grid point), else
        // off the given reference weight.
        let s = match &w_run {
            Some(wx) => {
                let s = steps(wx, g, bits)?;
                if on_grid(wx, &s) < 0.99 || on_grid(&w, &s) > 0.5 {
                    continue;
                }
                s
            }
            None => steps(&w, g, bits)?,
        };
        let dw = quantize(&w, &s) - &w;
        let sq = (&d - &xs.dot(&dw.t())).mapv(|v| v * v).sum();
        if sq <= budget && best.as_ref().is_none_or(|b| sq < b.0) {
            best = Some((sq, g, bits, s));
        }
    }
    let (sq, granularity, bits, s) = best?;
    let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = s.iter().copied().fold(0f64, f64::max);
    Some(Signature::GridQuantization {
        granularity,
        bits,
        step: [lo, hi],
        weight_recovered: recovered,
        residual: rel(sq),
    })
}

/// [`linear_grid`] on the origin when the caller gave the op's input `[rows, in]`: the output is
/// read as `[rows, out]` either directly (`[.., out]` with the input's leading elements) or, for a
/// head-major `[heads, rows, head_dim]` output (a projection split into heads: cross-attention
/// K/V), as `[rows, heads·head_dim]`.
pub(super) fn grid_from_context(c: &Ctx) -> Option<Signature> {
    let u = c.oc.op_input.as_ref()?;
    let m = *c.r.shape().last()?;
    let k = *u.shape().last()?;
    if m == 0 || k == 0 {
        return None;
    }
    let u = u.as_standard_layout();
    let rows_in = u.len() / k;
    let x = u.view().into_shape_with_order((rows_in, k)).ok()?;
    let as_rows = |t: &ndarray::ArrayD<f32>| -> Option<Array2<f32>> {
        if t.len() == rows_in * m {
            return t
                .view()
                .into_shape_with_order((rows_in, m))
                .ok()
                .map(|v| v.to_owned());
        }
        let s = t.shape();
        if s.len() == 3 && s[1] == rows_in {
            let p = t.view().permuted_axes(ndarray::IxDyn(&[1, 0, 2]));
            let p = p.as_standard_layout();
            return p
                .view()
                .into_shape_with_order((rows_in, s[0] * s[2]))
                .ok()
                .map(|v| v.to_owned());
        }
        None
    };
    let (yr, yx) = (as_rows(&c.r)?, as_rows(&c.x)?);
    linear_grid(
        &x,
        &yr.view(),
        &yx.view(),
        c.oc.weight.as_ref(),
        c.opts.explain_rel,
    )
}
