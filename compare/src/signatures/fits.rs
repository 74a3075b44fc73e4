//! Signatures that fit a small model to the pair: `temperature` (one slope between
//! log-probabilities, row by row), `row_affine` (a slope and offset per row: normalization
//! statistics), `elementwise` (the difference is a function of the op's input, named when a known
//! activation variant fits) and `clamp` (differences exactly beyond a threshold).

use super::{scale_hint, ClampSide, Ctx, Signature};

/// Known elementwise activations the `elementwise` signature names (shared with replay).
pub use xray_core::replay::Activation;

/// Probabilities below this are left out of the log-domain fit (masked or underflowed).
const TINY_PROB: f32 = 1e-30;

/// Rows (last axis) that are probability distributions: values in `[0, 1]`, sums within `1e-3`
/// of one.
fn prob_rows(v: &[f32], n: usize) -> bool {
    v.chunks(n).all(|row| {
        row.iter().all(|p| (0.0..=1.0 + 1e-4).contains(p))
            && (row.iter().map(|p| *p as f64).sum::<f64>() - 1.0).abs() <= 1e-3
    })
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// Temperature: `log X = a·log R + c_row` with one slope `a` for every row (rows of the last
/// axis; probabilities directly, logits after a log-softmax).
pub(super) fn temperature(c: &Ctx) -> Option<Signature> {
    let n = *c.r.shape().last()?;
    let (rs, xs) = (c.r.as_slice()?, c.x.as_slice()?);
    if n < 3 {
        return None;
    }
    let probs = prob_rows(rs, n) && prob_rows(xs, n);
    if !probs && !c.oc.logits {
        return None;
    }
    let (mut sxy, mut sxx, mut syy, mut orig) = (0f64, 0f64, 0f64, 0f64);
    let mut slopes: Vec<(f64, f64)> = Vec::new();
    for (rr, xr) in rs.chunks(n).zip(xs.chunks(n)) {
        let pts: Vec<(f64, f64)> = if probs {
            rr.iter()
                .zip(xr)
                .filter(|(a, b)| **a > TINY_PROB && **b > TINY_PROB)
                .map(|(a, b)| ((*a as f64).ln(), (*b as f64).ln()))
                .collect()
        } else {
            log_softmax(rr).into_iter().zip(log_softmax(xr)).collect()
        };
        if pts.len() < 3 {
            continue;
        }
        let m = pts.len() as f64;
        let (mx, my) = (
            pts.iter().map(|p| p.0).sum::<f64>() / m,
            pts.iter().map(|p| p.1).sum::<f64>() / m,
        );
        let (mut a, mut b, mut d) = (0f64, 0f64, 0f64);
        for (u, v) in &pts {
            let (u, v) = (u - mx, v - my);
            a += u * v;
            b += u * u;
            d += v * v;
        }
        if b <= 1e-12 * m {
            continue;
        }
        sxy += a;
        sxx += b;
        syy += d;
        orig += (d - 2.0 * a + b).max(0.0);
        slopes.push((a / b, b));
    }
    if slopes.is_empty() || sxx <= 0.0 || syy <= 0.0 {
        return None;
    }
    let f = sxy / sxx;
    let resid = (syy - 2.0 * f * sxy + f * f * sxx).max(0.0);
    let rel = (resid / syy).sqrt();
    let ok = resid <= c.opts.explain_rel.powi(2) * syy
        && resid <= 0.01 * orig
        && (f - 1.0).abs() > (10.0 * rel).max(1e-3);
    if !ok {
        return None;
    }
    // The per-row range over rows with a spread comparable to the typical row (a row of two
    // near-equal entries has an ill-determined slope).
    let mut spreads: Vec<f64> = slopes.iter().map(|s| s.1).collect();
    let k = spreads.len() / 2;
    let median = *spreads.select_nth_unstable_by(k, |a, b| a.total_cmp(b)).1;
    let (lo, hi) = slopes
        .iter()
        .filter(|s| s.1 >= 1e-3 * median)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), s| {
            (l.min(s.0), h.max(s.0))
        });
    Some(Signature::Temperature {
        factor: f,
        row_factors: [lo, hi],
        rows: slopes.len() as u64,
        domain: if probs { "probabilities" } else { "logits" }.into(),
        residual: rel,
        hint: scale_hint(f),
    })
}

/// Least-squares `y = a·x + b` of one row; `None` when `x` is constant.
fn line(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    let m = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / m, y.iter().sum::<f64>() / m);
    let (mut sxy, mut sxx) = (0f64, 0f64);
    for (u, v) in x.iter().zip(y) {
        sxy += (u - mx) * (v - my);
        sxx += (u - mx) * (u - mx);
    }
    (sxx > 1e-30 * m.max(1.0)).then(|| {
        let a = sxy / sxx;
        (a, my - a * mx)
    })
}

/// A slope `a` near `sqrt((n-1)/n)` (or its inverse) for rows of `n`: the variance divided by the
/// other of `n` and `n - 1`.
pub(super) fn variance_hint(a: f64, n: usize) -> Option<String> {
    if n < 2 {
        return None;
    }
    let nf = n as f64;
    let unbiased = ((nf - 1.0) / nf).sqrt();
    if (a - unbiased).abs() <= 0.1 * (1.0 - unbiased) {
        Some(format!(
            "sqrt((n-1)/n) = {unbiased:.6} for n = {n}: the variance divided by n-1 (unbiased) where the reference divides by n"
        ))
    } else if (a - unbiased.recip()).abs() <= 0.1 * (unbiased.recip() - 1.0) {
        Some(format!(
            "sqrt(n/(n-1)) = {:.6} for n = {n}: the variance divided by n where the reference divides by n-1",
            unbiased.recip()
        ))
    } else {
        None
    }
}

/// Rows and columns below which the per-row fits are not tested (too few points per parameter).
const MIN_ROW_LEN: usize = 8;
const MIN_ROWS_CENTRED: usize = 4;
const CENTRE_ITERATIONS: usize = 25;

/// Per-row affine: `X - β = a_r (R - β) + b_r` for each row of the last axis, first with `β = 0`,
/// then with a fitted per-feature centre `β` (alternating least squares).
pub(super) fn row_affine(c: &Ctx) -> Option<Signature> {
    let n = *c.r.shape().last()?;
    let (rs, xs) = (c.r.as_slice()?, c.x.as_slice()?);
    if n < MIN_ROW_LEN {
        return None;
    }
    let rows = rs.len() / n;
    // Normalization statistics move most rows; a few differing rows are a `subset`.
    let moved = rs
        .chunks(n)
        .zip(xs.chunks(n))
        .filter(|(a, b)| a.iter().zip(b.iter()).any(|(p, q)| c.differs(*p, *q)))
        .count();
    if 2 * moved <= rows {
        return None;
    }
    let budget = c.budget(true);
    let r64: Vec<f64> = rs.iter().map(|v| *v as f64).collect();
    let x64: Vec<f64> = xs.iter().map(|v| *v as f64).collect();
    let mut beta = vec![0f64; n];
    let mut ab = vec![(1f64, 0f64); rows];
    let fit_rows = |beta: &[f64], ab: &mut [(f64, f64)]| -> f64 {
        let mut resid = 0f64;
        let (mut u, mut v) = (vec![0f64; n], vec![0f64; n]);
        for (i, p) in ab.iter_mut().enumerate() {
            let (rr, xr) = (&r64[i * n..(i + 1) * n], &x64[i * n..(i + 1) * n]);
            for j in 0..n {
                u[j] = rr[j] - beta[j];
                v[j] = xr[j] - beta[j];
            }
            *p = line(&u, &v).unwrap_or((
                1.0,
                v.iter().zip(&u).map(|(a, b)| a - b).sum::<f64>() / n as f64,
            ));
            resid += u
                .iter()
                .zip(&v)
                .map(|(a, b)| (b - p.0 * a - p.1).powi(2))
                .sum::<f64>();
        }
        resid
    };
    let plain = fit_rows(&beta, &mut ab);
    let (mut resid, mut centred) = (plain, false);
    // The centred model is tried whenever there are rows enough, and kept when it explains at
    // least ten times more: a norm's bias makes the plain per-row fit only approximate.
    if plain > 0.0 && rows >= MIN_ROWS_CENTRED {
        let plain_ab = ab.clone();
        // Start from the column means: a norm's output averages to its bias over many rows.
        for (j, bj) in beta.iter_mut().enumerate() {
            *bj = (0..rows).map(|i| r64[i * n + j]).sum::<f64>() / rows as f64;
        }
        let mut cur = fit_rows(&beta, &mut ab);
        for _ in 0..CENTRE_ITERATIONS {
            // β_j minimizes sum_r (x_rj - a_r r_rj - b_r - (1 - a_r) β_j)^2.
            let den: f64 = ab.iter().map(|(a, _)| (1.0 - a).powi(2)).sum();
            if den <= 1e-30 {
                break;
            }
            for (j, bj) in beta.iter_mut().enumerate() {
                let num: f64 = ab
                    .iter()
                    .enumerate()
                    .map(|(i, (a, b))| (1.0 - a) * (x64[i * n + j] - a * r64[i * n + j] - b))
                    .sum();
                *bj = num / den;
            }
            let next = fit_rows(&beta, &mut ab);
            // Iterate to convergence, not just to the budget: the slopes are the parameter.
            let done = next <= 1e-6 * budget || next >= 0.999 * cur;
            cur = next;
            if done {
                break;
            }
        }
        if cur < 0.1 * plain {
            (resid, centred) = (cur, true);
        } else {
            ab = plain_ab;
        }
    }
    if resid > budget {
        return None;
    }
    let mut a: Vec<f64> = ab.iter().map(|p| p.0).collect();
    let bs: Vec<f64> = ab.iter().map(|p| p.1).collect();
    let range = |v: &[f64]| {
        v.iter()
            .fold([f64::INFINITY, f64::NEG_INFINITY], |[l, h], x| {
                [l.min(*x), h.max(*x)]
            })
    };
    let (a_range, b_range) = (range(&a), range(&bs));
    let k = a.len() / 2;
    let a_median = *a.select_nth_unstable_by(k, |p, q| p.total_cmp(q)).1;
    let hint = if let Some(h) = variance_hint(a_median, n) {
        Some(format!("a_r ≈ {h}"))
    } else if a_range[1] < 1.0 && a_range[1] - a_range[0] > 0.1 * (1.0 - a_median) {
        Some("slopes below one that vary from row to row: a larger epsilon (or variance) in the normalization".into())
    } else {
        None
    };
    Some(Signature::RowAffine {
        a_range,
        b_range,
        a_median,
        rows: rows as u64,
        row_len: n,
        centred,
        residual: c.rel(resid),
        hint,
    })
}

/// Elements fitted at the least, and the least share of them, for [`affine_above_floor`].
const MIN_FITTED: usize = 64;

/// Which elements sit above both sides' floors (each side's minimum, when at least one element
/// in a hundred holds it: a clamp's floor), or `None` when neither side has a floor.
fn above_floors(rs: &[f32], xs: &[f32]) -> Option<Vec<bool>> {
    let n = rs.len();
    let floor = |v: &[f32]| -> Option<f64> {
        let m = v.iter().copied().fold(f32::INFINITY, f32::min) as f64;
        let at = v
            .iter()
            .filter(|&&u| (u as f64 - m).abs() <= 1e-6 * m.abs().max(1.0))
            .count();
        (at * 100 >= n && at > 1).then_some(m)
    };
    let (fr, fx) = (floor(rs), floor(xs));
    if fr.is_none() && fx.is_none() {
        return None;
    }
    let above =
        |v: f32, f: Option<f64>| f.is_none_or(|m| (v as f64 - m).abs() > 1e-6 * m.abs().max(1.0));
    Some(
        rs.iter()
            .zip(xs)
            .map(|(&a, &b)| above(a, fr) && above(b, fx))
            .collect(),
    )
}

/// `X = a·R + b` over the elements above both sides' floors: each side's minimum, held by at
/// least one element in a hundred (a clamp's floor: a log-mel's `max - 8`, padding's silence);
/// the floored elements are left out, as the floors themselves need not map onto each other (a
/// floor `8` below each side's own maximum). Not stated when there is no floor (a per-row or
/// global affine says it), when the map is the identity (then only the clamp differs: `clamp`),
/// or when fewer than [`MIN_FITTED`] elements (or one in a hundred) are above both floors.
pub(super) fn affine_above_floor(c: &Ctx) -> Option<Signature> {
    let (rs, xs) = (c.r.as_slice()?, c.x.as_slice()?);
    let n = rs.len();
    let keep = above_floors(rs, xs)?;
    let (mut r, mut x) = (Vec::new(), Vec::new());
    for ((&a, &b), _) in rs.iter().zip(xs).zip(&keep).filter(|(_, &k)| k) {
        r.push(a as f64);
        x.push(b as f64);
    }
    if r.len() < MIN_FITTED || r.len() * 100 < n {
        return None;
    }
    let (a, b) = line(&r, &x)?;
    let xx: f64 = x.iter().map(|v| v * v).sum();
    let sq: f64 = r.iter().zip(&x).map(|(u, v)| (v - a * u - b).powi(2)).sum();
    let identity = (a - 1.0).abs() <= 1e-3 && b.abs() <= 1e-3 * c.scale.max(1e-30);
    if identity || xx <= 0.0 || sq > c.opts.explain_rel.powi(2) * xx {
        return None;
    }
    let near = |v: f64| (a - v).abs() <= 1e-3 * v;
    let ln10 = std::f64::consts::LN_10;
    let hint = if near(ln10) {
        Some("a = ln(10): a natural log where the reference takes log10".to_string())
    } else if near(1.0 / ln10) {
        Some("a = 1/ln(10): log10 where the reference takes a natural log".to_string())
    } else if near(std::f64::consts::LOG2_10) {
        Some("a = log2(10): log2 where the reference takes log10".to_string())
    } else {
        scale_hint(a)
    };
    Some(Signature::Affine {
        a,
        b,
        fitted: r.len() as u64,
        of: n as u64,
        residual: (sq / xx).sqrt(),
        hint,
    })
}

/// `sum (d_i - mean of its 4 nearest neighbours by key)^2` over the pairs sorted by key, relative
/// to the spread of `d`: small when `d` is a smooth function of the key.
fn roughness(mut pts: Vec<(f64, f64)>) -> Option<f64> {
    if pts.len() < 16 {
        return None;
    }
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let m = pts.len() as f64;
    let mean = pts.iter().map(|p| p.1).sum::<f64>() / m;
    let spread: f64 = pts.iter().map(|p| (p.1 - mean).powi(2)).sum();
    if spread <= 0.0 {
        return None;
    }
    let mut rough = 0f64;
    for i in 0..pts.len() {
        let lo = i.saturating_sub(2);
        let hi = (i + 3).min(pts.len());
        let (s, k) = (lo..hi)
            .filter(|&j| j != i)
            .fold((0f64, 0u32), |(s, k), j| (s + pts[j].1, k + 1));
        rough += (pts[i].1 - s / k as f64).powi(2);
    }
    Some(rough / spread)
}

/// Elements the output-only pair search ranks the activation pairs on.
const PAIR_SAMPLE: usize = 4096;

/// Largest relative roughness for "a smooth function".
const MAX_ROUGHNESS: f64 = 0.01;

/// Inverse of `f` on its increasing branch (from its minimum up), by a table: the `u` with
/// `f(u) = y` for `y` above the minimum.
struct Inverse {
    u: Vec<f64>,
    y: Vec<f64>,
}

impl Inverse {
    fn new(f: Activation) -> Inverse {
        let (lo, hi, k) = (-10.0f64, 10.0f64, 40_001usize);
        let us: Vec<f64> = (0..k)
            .map(|i| lo + (hi - lo) * i as f64 / (k - 1) as f64)
            .collect();
        let ys: Vec<f64> = us.iter().map(|u| f.apply(*u)).collect();
        let start = (0..k).min_by(|&a, &b| ys[a].total_cmp(&ys[b])).unwrap_or(0);
        Inverse {
            u: us[start..].to_vec(),
            y: ys[start..].to_vec(),
        }
    }
    fn at(&self, y: f64) -> f64 {
        let n = self.y.len();
        if n < 2 || y <= self.y[0] {
            return self.u.first().copied().unwrap_or(0.0);
        }
        if y >= self.y[n - 1] {
            // Beyond the table the variants are the identity to f64 precision.
            return self.u[n - 1] + (y - self.y[n - 1]);
        }
        let i = self.y.partition_point(|v| *v < y).clamp(1, n - 1);
        let (y0, y1) = (self.y[i - 1], self.y[i]);
        let t = if y1 > y0 { (y - y0) / (y1 - y0) } else { 0.0 };
        self.u[i - 1] + t * (self.u[i] - self.u[i - 1])
    }
}

/// Elementwise function: with the op's input `U`, the activations `f` (reference) and `g`
/// (runtime) that fit `R = f(U)` and `X = g(U)`; without it, `X = g(f⁻¹(R))` on the elements with
/// `R > 0` (where every variant has one preimage). When no variant fits exactly, the signature
/// still holds (unnamed) if `X - R` is a smooth function of `U` (or of `R`).
pub(super) fn elementwise(c: &Ctx) -> Option<Signature> {
    let input = c.oc.op_input.as_ref().filter(|u| u.shape() == c.r.shape());
    let budget = c.budget(true);
    let others = |f: Option<Activation>| Activation::ALL.into_iter().filter(move |g| Some(*g) != f);
    if let Some(u) = input {
        let u: Vec<f64> = u.iter().map(|v| *v as f64).collect();
        if u.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let fit = |f: Activation, t: &ndarray::ArrayD<f32>| -> f64 {
            t.iter()
                .zip(&u)
                .map(|(y, v)| (*y as f64 - f.apply(*v)).powi(2))
                .sum()
        };
        let rr: f64 = c.r.iter().map(|v| (*v as f64).powi(2)).sum();
        let reference = Activation::ALL
            .into_iter()
            .map(|f| (f, fit(f, &c.r)))
            .filter(|(_, s)| *s <= c.opts.explain_rel.powi(2) * rr)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|p| p.0);
        let (nearest, sq) = others(reference)
            .map(|g| (g, fit(g, &c.x)))
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let exact = sq <= budget;
        if !exact {
            let pts = u
                .iter()
                .zip(c.r.iter().zip(c.x.iter()))
                .map(|(k, (a, b))| (*k, *b as f64 - *a as f64))
                .collect();
            if roughness(pts)? > MAX_ROUGHNESS {
                return None;
            }
        }
        return Some(Signature::Elementwise {
            runtime: exact.then_some(nearest),
            reference,
            nearest,
            nearest_residual: c.rel(sq),
            from_input: true,
        });
    }
    // Output only: the map R -> X on the positive side.
    let pos: Vec<(f64, f64)> =
        c.r.iter()
            .zip(c.x.iter())
            .filter(|(a, _)| **a > 0.0)
            .map(|(a, b)| (*a as f64, *b as f64))
            .collect();
    // Any map R -> X makes the difference a smooth function of R on the positive side: when it
    // is not, nothing below can hold (and the common noisy case stops here, cheaply).
    if roughness(pos.iter().map(|(a, b)| (*a, b - a)).collect())? > MAX_ROUGHNESS {
        return None;
    }
    let d_pos: f64 = pos.iter().map(|(a, b)| (b - a).powi(2)).sum();
    let x_pos: f64 = pos.iter().map(|(_, b)| b * b).sum();
    let mut best: Option<(f64, Activation, Activation)> = None;
    if d_pos > 0.1 * c.orig {
        // Rank the pairs on an evenly strided sample, then measure the best on every element.
        let stride = (pos.len() / PAIR_SAMPLE).max(1);
        let sample: Vec<(f64, f64)> = pos.iter().step_by(stride).copied().collect();
        let sq = |pts: &[(f64, f64)], inv: &Inverse, g: Activation| -> f64 {
            pts.iter()
                .map(|(a, b)| (b - g.apply(inv.at(*a))).powi(2))
                .sum()
        };
        let mut ranked: Option<(f64, Activation, Activation)> = None;
        for f in Activation::ALL {
            let inv = Inverse::new(f);
            for g in others(Some(f)) {
                let s = sq(&sample, &inv, g);
                if ranked.is_none_or(|(b, _, _)| s < b) {
                    ranked = Some((s, f, g));
                }
            }
        }
        best = ranked.map(|(_, f, g)| (sq(&pos, &Inverse::new(f), g), f, g));
    }
    let pos_budget = (c.opts.explain_rel.powi(2) * x_pos).min(0.01 * d_pos);
    let rel_pos = |sq: f64| {
        if x_pos > 0.0 {
            (sq / x_pos).sqrt()
        } else {
            0.0
        }
    };
    match best {
        Some((sq, f, g)) if sq <= pos_budget => Some(Signature::Elementwise {
            runtime: Some(g),
            reference: Some(f),
            nearest: g,
            nearest_residual: rel_pos(sq),
            from_input: false,
        }),
        _ => {
            let pts =
                c.r.iter()
                    .zip(c.x.iter())
                    .map(|(a, b)| (*a as f64, *b as f64 - *a as f64))
                    .collect();
            if roughness(pts)? > MAX_ROUGHNESS {
                return None;
            }
            let (sq, _, g) = best?;
            Some(Signature::Elementwise {
                runtime: None,
                reference: None,
                nearest: g,
                nearest_residual: rel_pos(sq),
                from_input: false,
            })
        }
    }
}

/// Clamp: the differing elements are exactly those whose reference is at or below (above) a
/// threshold, and one side is constant over them (the side that clamps).
pub(super) fn clamp(c: &Ctx) -> Option<Signature> {
    let n = c.r.len();
    let diff: Vec<bool> =
        c.r.iter()
            .zip(c.x.iter())
            .map(|(a, b)| c.differs(*a, *b))
            .collect();
    let nd = diff.iter().filter(|d| **d).count();
    if nd < 3 || nd == n {
        return None;
    }
    for side in [ClampSide::Below, ClampSide::Above] {
        let key = |v: f32| match side {
            ClampSide::Below => v as f64,
            ClampSide::Above => -(v as f64),
        };
        let t =
            c.r.iter()
                .zip(&diff)
                .filter(|(_, d)| **d)
                .map(|(a, _)| key(*a))
                .fold(f64::NEG_INFINITY, f64::max);
        let (mut exceptions, mut next) = (0usize, f64::INFINITY);
        for (a, d) in c.r.iter().zip(&diff) {
            let k = key(*a);
            if !*d {
                if k < t {
                    exceptions += 1;
                } else if k > t {
                    next = next.min(k);
                }
            }
        }
        if exceptions as f64 > 0.005 * nd as f64 || !next.is_finite() {
            continue;
        }
        let range = |t: &ndarray::ArrayD<f32>| {
            t.iter()
                .zip(&diff)
                .filter(|(_, d)| **d)
                .fold([f64::INFINITY, f64::NEG_INFINITY], |[l, h], (v, _)| {
                    [l.min(*v as f64), h.max(*v as f64)]
                })
        };
        let (rr, xr) = (range(&c.r), range(&c.x));
        let constant = |r: &[f64; 2]| {
            r[1] - r[0]
                <= 2.0
                    * c.opts
                        .tolerance
                        .element_bound(r[0].abs().max(r[1].abs()), c.scale)
        };
        if !constant(&rr) && !constant(&xr) {
            continue;
        }
        let back = |k: f64| match side {
            ClampSide::Below => k,
            ClampSide::Above => -k,
        };
        return Some(Signature::Clamp {
            side,
            threshold: back(t),
            matching_from: back(next),
            differing: nd as u64,
            of: n as u64,
            reference_range: rr,
            runtime_range: xr,
        });
    }
    None
}

/// `X = R + o_c`: one offset per slice along one axis, over the elements above both sides' floors
/// when there are floors (else all of them): a per-channel bias, or a per-channel gain before a
/// log (a log-mel whose filters are scaled row by row). The axis whose offsets leave the least
/// unexplained is the one named; the offsets must differ (one offset for all is `affine`), more
/// than half of them must be off zero (else it is a `subset`), and the fit must explain the
/// difference as every fit here does.
pub(super) fn channel_offset(c: &Ctx) -> Option<Signature> {
    let (rs, xs) = (c.r.as_slice()?, c.x.as_slice()?);
    let (n, shape) = (rs.len(), c.r.shape());
    if shape.len() < 2 {
        return None;
    }
    let keep = above_floors(rs, xs);
    let idx: Vec<usize> = (0..n)
        .filter(|&i| keep.as_ref().is_none_or(|k| k[i]))
        .collect();
    let fitted = idx.len();
    if fitted < MIN_FITTED || fitted * 100 < n {
        return None;
    }
    let (mut xx, mut orig) = (0f64, 0f64);
    for &i in &idx {
        let (r, x) = (rs[i] as f64, xs[i] as f64);
        xx += x * x;
        orig += (x - r).powi(2);
    }
    if orig <= 0.0 || xx <= 0.0 {
        return None;
    }
    // (axis, offsets, residual sum of squares)
    let mut best: Option<(usize, Vec<f64>, f64)> = None;
    for (axis, &m) in shape.iter().enumerate() {
        if m < 2 || m * 4 > fitted {
            continue;
        }
        let inner: usize = shape[axis + 1..].iter().product();
        let slice = |i: usize| (i / inner) % m;
        let (mut sum, mut count) = (vec![0f64; m], vec![0u64; m]);
        for &i in &idx {
            sum[slice(i)] += xs[i] as f64 - rs[i] as f64;
            count[slice(i)] += 1;
        }
        let off: Vec<f64> = sum
            .iter()
            .zip(&count)
            .map(|(s, &k)| if k > 0 { s / k as f64 } else { f64::NAN })
            .collect();
        let sq: f64 = idx
            .iter()
            .map(|&i| (xs[i] as f64 - rs[i] as f64 - off[slice(i)]).powi(2))
            .sum();
        if best.as_ref().is_none_or(|b| sq < b.2) {
            best = Some((axis, off, sq));
        }
    }
    let (axis, off, sq) = best?;
    let held: Vec<f64> = off.iter().copied().filter(|o| o.is_finite()).collect();
    let lo = held.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = held.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let rms = (sq / fitted as f64).sqrt();
    let tiny = (10.0 * rms).max(1e-3 * c.scale.max(1e-30));
    // Offsets on a few slices only are a `subset` (one head off by a constant is said as such).
    let moved = held.iter().filter(|o| o.abs() > tiny).count();
    if held.len() < 2
        || hi - lo <= tiny
        || moved * 2 <= held.len()
        || sq > c.opts.explain_rel.powi(2) * xx
        || sq > 0.01 * orig
    {
        return None;
    }
    Some(Signature::ChannelOffset {
        axis,
        axis_name: super::axis_label(&c.opts.axis_names, axis),
        slices: held.len() as u64,
        range: [lo, hi],
        fitted: fitted as u64,
        of: n as u64,
        floors: keep.is_some(),
        residual: (sq / xx).sqrt(),
    })
}
