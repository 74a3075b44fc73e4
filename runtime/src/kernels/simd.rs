//! Row primitives with a fixed arithmetic order: the same inputs give the same bits on every code
//! path (an AVX2 build of each function is selected at run time; it executes the same IEEE
//! operations in the same order, only wider, and never fuses a multiply-add).
//!
//! The AVX2 builds are `unsafe` (target features, raw loads): the one module of the runtime where
//! unsafe code is allowed, each block with its SAFETY comment.
#![allow(unsafe_code)]

/// Lanes of the dot-product accumulators (two 8-wide vectors).
const L: usize = 16;

/// How many weight rows ahead the row-stable f32 GEMV prefetches (two blocks of four).
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 8;

/// How far ahead the packed f16 GEMV prefetches (its blocks are one sequential stream).
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 4096;

/// The scalar definition of every primitive. The AVX2 versions perform the same IEEE operations
/// per lane in the same order (no fused multiply-add), so both give the same bits.
mod scalar {
    use super::L;

    /// Fixed reduction of the 16 lane accumulators: `(a[i] + a[i+8])`, then halves, then pairs.
    #[inline(always)]
    pub fn reduce(acc: &[f32; L]) -> f32 {
        let mut s8 = [0f32; 8];
        for i in 0..8 {
            s8[i] = acc[i] + acc[i + 8];
        }
        let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
        (s4[0] + s4[2]) + (s4[1] + s4[3])
    }

    /// Dot product: 16 lane accumulators over `k = 16c + lane`, [`reduce`], then the tail
    /// (`k >= 16 * (n / 16)`) added left to right.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let full = n / L * L;
        let mut acc = [0f32; L];
        for c in (0..full).step_by(L) {
            for l in 0..L {
                acc[l] += a[c + l] * b[c + l];
            }
        }
        let mut s = reduce(&acc);
        for i in full..n {
            s += a[i] * b[i];
        }
        s
    }

    pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi += a * *xi;
        }
    }

    /// `o = 0; for j in 0..p.len() { o += p[j] * row(j) }`.
    pub fn weighted_sum<'a>(o: &mut [f32], p: &[f32], row: impl Fn(usize) -> &'a [f32]) {
        o.fill(0.0);
        for (j, &pj) in p.iter().enumerate() {
            axpy(o, pj, row(j));
        }
    }

    pub fn exp(x: f32) -> f32 {
        super::exp_f32(x)
    }

    pub fn softmax(x: &mut [f32]) {
        let mut m = f32::NEG_INFINITY;
        for &v in x.iter() {
            m = super::max_f32(m, v);
        }
        let n = x.len();
        let full = n / L * L;
        let mut acc = [0f32; L];
        for c in (0..full).step_by(L) {
            for l in 0..L {
                let e = exp(x[c + l] - m);
                x[c + l] = e;
                acc[l] += e;
            }
        }
        let mut s = reduce(&acc);
        for v in x[full..].iter_mut() {
            let e = exp(*v - m);
            *v = e;
            s += e;
        }
        let inv = 1.0 / s;
        for v in x.iter_mut() {
            *v *= inv;
        }
    }

    /// `dst[i] = gelu(src[i])` for `i < n` (`src` may equal `dst`).
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `n` values.
    pub unsafe fn gelu_ptr(src: *const f32, dst: *mut f32, n: usize) {
        for i in 0..n {
            *dst.add(i) = super::gelu_f32(*src.add(i));
        }
    }

    pub fn gelu(x: &mut [f32]) {
        // SAFETY: in place over the slice.
        unsafe { gelu_ptr(x.as_ptr(), x.as_mut_ptr(), x.len()) }
    }
}

/// `max` as `_mm256_max_ps` computes it: `if a > b { a } else { b }` (the second operand when
/// either is NaN).
#[inline(always)]
fn max_f32(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Cephes-style single-precision exp (range reduction by ln 2 in two parts, degree-5
/// polynomial), about 1 ulp. Inputs are clamped to [-87.34, 88]; below about -87.3 the result
/// flushes to (near) zero. NaN stays NaN (as torch's `exp`): the clamps keep a NaN operand, so a
/// softmax row holding a NaN score is NaN everywhere, never finite probabilities.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    // `x > 88 ? 88 : x` and `-87.34 > x ? -87.34 : x` both keep NaN (a comparison with NaN is
    // false); NaN then flows through the polynomial.
    let x = max_f32(-87.336_55, if x > 88.0 { 88.0 } else { x });
    let z = x * std::f32::consts::LOG2_E + 0.5;
    let t = z as i32;
    let fl = t - ((t as f32) > z) as i32;
    let n = fl as f32;
    let r = (x - n * EXP_C1) - n * EXP_C2;
    let p = ((((EXP_P0 * r + EXP_P1) * r + EXP_P2) * r + EXP_P3) * r + EXP_P4) * r + EXP_P5;
    let y = (p * (r * r) + r) + 1.0;
    y * f32::from_bits(((fl + 127) as u32) << 23)
}

const EXP_C1: f32 = 0.693_359_4;
const EXP_C2: f32 = -2.121_944_4e-4;
const EXP_P0: f32 = 1.987_569_1e-4;
const EXP_P1: f32 = 1.398_199_9e-3;
const EXP_P2: f32 = 8.333_452e-3;
const EXP_P3: f32 = 4.166_579_6e-2;
const EXP_P4: f32 = 1.666_666_5e-1;
// Cephes writes 5.0000001201e-1, which is 0.5 in f32.
const EXP_P5: f32 = 0.5;

const ERF_P: f32 = 0.327_591_1;
const ERF_A1: f32 = 0.254_829_6;
const ERF_A2: f32 = -0.284_496_74;
const ERF_A3: f32 = 1.421_413_7;
const ERF_A4: f32 = -1.453_152_1;
const ERF_A5: f32 = 1.061_405_4;

/// erf as PyTorch's vectorised CPU kernel computes it (Abramowitz & Stegun 7.1.26:
/// `1 - t * poly(t) * exp(-x^2)`, `t = 1 / (1 + p|x|)`, |error| < 1.5e-7), without fused
/// multiply-adds.
///
/// Upstream: pytorch v2.11.0 aten/src/ATen/cpu/vec/vec256/vec256_float.h `Vectorized<float>::erf`.
#[inline(always)]
fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (ERF_P * a + 1.0);
    let r = (((ERF_A5 * t + ERF_A4) * t + ERF_A3) * t + ERF_A2) * t + ERF_A1;
    let e = exp_f32(-(x * x));
    let v = 1.0 - (e * t) * r;
    v.copysign(x)
}

/// Exact-erf GELU `x * 0.5 * (1 + erf(x / sqrt 2))`.
///
/// Upstream: pytorch v2.11.0 aten/src/ATen/native/cpu/Activation.cpp `GeluKernelImpl`
/// (GeluType::None).
#[inline(always)]
fn gelu_f32(x: f32) -> f32 {
    (x * 0.5) * (1.0 + erf_f32(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `unsafe fn ld(p: &[f32], i: usize) -> V`, the vector `V` of `p[i..i + lanes]` (the build's
/// `loadu`, the bounds checked in debug builds), under the build's `#[target_feature]` and
/// `#[inline]`: `ld!(#[target_feature(..)] V, lanes)`.
#[cfg(target_arch = "x86_64")]
macro_rules! ld {
    (#[$feature:meta] $v:ty, $w:literal) => {
        #[$feature]
        #[inline]
        unsafe fn ld(p: &[f32], i: usize) -> $v {
            debug_assert!(i + $w <= p.len());
            loadu(p.as_ptr().add(i))
        }
    };
}

/// [`exp_f32`] on one vector of lanes, written once for the AVX2 and the AVX-512 build: each
/// expands it over the short names its module imports (`min`, `max`, `add`, `mul`, `set1`, ...:
/// `_mm256_*` in `avx2`, `_mm512_*` in `avx512`), so an expansion is that build's intrinsics in
/// the order written here. `exp_lanes!(x, |t, z| floor)`: `floor` is the build's form of
/// `t - (float(t) > z)` for `t = trunc(z)` (the comparison is a vector mask in AVX2, a bit mask
/// in AVX-512).
#[cfg(target_arch = "x86_64")]
macro_rules! exp_lanes {
    ($x:expr, |$t:ident, $z:ident| $floor:expr) => {{
        use super::*;
        // min(88, x) as `88 < x ? 88 : x`, then max(-87.34, .) as `-87.34 > x ? -87.34 : x`:
        // vminps/vmaxps return the second operand when either is NaN, so NaN survives both
        // clamps (and the polynomial), as in [`super::exp_f32`].
        let x = min(set1(88.0), $x);
        let x = max(set1(-87.336_55), x);
        let $z = add(mul(x, set1(std::f32::consts::LOG2_E)), set1(0.5));
        let $t = cvtt_epi32($z);
        let fl = $floor;
        let n = cvt_ps(fl);
        let r = sub(sub(x, mul(n, set1(EXP_C1))), mul(n, set1(EXP_C2)));
        let mut p = add(mul(set1(EXP_P0), r), set1(EXP_P1));
        p = add(mul(p, r), set1(EXP_P2));
        p = add(mul(p, r), set1(EXP_P3));
        p = add(mul(p, r), set1(EXP_P4));
        p = add(mul(p, r), set1(EXP_P5));
        let y = add(add(mul(p, mul(r, r)), r), set1(1.0));
        let pow2 = cast_ps(slli_epi32(add_epi32(fl, set1_epi32(127)), 23));
        mul(y, pow2)
    }};
}

/// [`gelu_f32`] from `src` into `dst` for `n` values, `lanes` at a time, the rest one by one;
/// written once for the AVX2 and the AVX-512 build over their short intrinsic names (see
/// `exp_lanes!`; `and`, `andnot`, `or`, `xor` are the bitwise float operations). `sign` is the
/// build's vector of `-0.0` (the sign bit alone), `exp` its `exp_lanes!` function.
#[cfg(target_arch = "x86_64")]
macro_rules! gelu_lanes {
    ($src:ident, $dst:ident, $n:ident, lanes = $w:literal, sign = $sign:expr, exp = $exp:ident) => {{
        use super::*;
        let full = $n / $w * $w;
        let sign = $sign;
        let one = set1(1.0);
        let mut i = 0;
        while i < full {
            let v = loadu($src.add(i));
            let u = mul(v, set1(std::f32::consts::FRAC_1_SQRT_2));
            let a = andnot(sign, u);
            let t = div(one, add(mul(set1(ERF_P), a), one));
            let mut r = add(mul(set1(ERF_A5), t), set1(ERF_A4));
            r = add(mul(r, t), set1(ERF_A3));
            r = add(mul(r, t), set1(ERF_A2));
            r = add(mul(r, t), set1(ERF_A1));
            let e = $exp(xor(sign, mul(u, u)));
            let erf_abs = sub(one, mul(mul(e, t), r));
            let erf = or(andnot(sign, erf_abs), and(sign, u));
            let g = mul(mul(v, set1(0.5)), add(one, erf));
            storeu($dst.add(i), g);
            i += $w;
        }
        for j in full..$n {
            *$dst.add(j) = gelu_f32(*$src.add(j));
        }
    }};
}

/// The end of a vector softmax row, written once for both builds (see `exp_lanes!`): the
/// exponentials of the scalar tail `x[full..]` added after the lanes' sum `s` (left to right),
/// then every value times `1 / sum`, `lanes` at a time below `upto` and the rest one by one.
#[cfg(target_arch = "x86_64")]
macro_rules! softmax_tail {
    ($x:ident, $m:ident, $s:expr, full = $full:ident, upto = $upto:expr, lanes = $w:literal) => {{
        let mut s = $s;
        for v in $x[$full..].iter_mut() {
            let e = super::exp_f32(*v - $m);
            *v = e;
            s += e;
        }
        let inv = 1.0 / s;
        let iv = set1(inv);
        let upto = $upto;
        let mut i = 0;
        while i < upto {
            storeu($x.as_mut_ptr().add(i), mul(ld($x, i), iv));
            i += $w;
        }
        for v in $x[upto..].iter_mut() {
            *v *= inv;
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2 versions of [`super::scalar`]: same operations per lane, same order.
    #![allow(unsafe_op_in_unsafe_fn)]
    use std::arch::x86_64::*;
    // The names `ld!`, `exp_lanes!`, `gelu_lanes!` and `softmax_tail!` are written in: this
    // build's intrinsics.
    use std::arch::x86_64::{
        _mm256_add_epi32 as add_epi32, _mm256_add_ps as add, _mm256_and_ps as and,
        _mm256_andnot_ps as andnot, _mm256_castsi256_ps as cast_ps, _mm256_cvtepi32_ps as cvt_ps,
        _mm256_cvttps_epi32 as cvtt_epi32, _mm256_div_ps as div, _mm256_loadu_ps as loadu,
        _mm256_max_ps as max, _mm256_min_ps as min, _mm256_mul_ps as mul, _mm256_or_ps as or,
        _mm256_set1_epi32 as set1_epi32, _mm256_set1_ps as set1, _mm256_slli_epi32 as slli_epi32,
        _mm256_storeu_ps as storeu, _mm256_sub_ps as sub, _mm256_xor_ps as xor,
    };

    ld! { #[target_feature(enable = "avx,avx2")] __m256, 8 }

    /// [`super::scalar::reduce`] of the accumulators (lanes 0-7 in `a`, 8-15 in `b`).
    #[target_feature(enable = "avx,avx2")]
    #[inline]
    unsafe fn reduce(a: __m256, b: __m256) -> f32 {
        reduce8(_mm256_add_ps(a, b))
    }

    /// The rest of [`super::scalar::reduce`] from its 8 sums `s8` (`a[i] + a[i+8]`): halves,
    /// then pairs (also the end of `avx512::reduce`).
    #[target_feature(enable = "avx,avx2")]
    #[inline]
    pub(super) unsafe fn reduce8(s8: __m256) -> f32 {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        let t = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); // [s4[0]+s4[2], s4[1]+s4[3], ..]
        _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)))
    }

    #[target_feature(enable = "avx,avx2")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let full = n / 16 * 16;
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut k = 0;
        while k < full {
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(ld(a, k), ld(b, k)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(ld(a, k + 8), ld(b, k + 8)));
            k += 16;
        }
        let mut s = reduce(a0, a1);
        for i in full..n {
            s += a[i] * b[i];
        }
        s
    }

    /// Four dot products of `x` with four weight rows held in `$w`, sharing the loads of `x`:
    /// `$ld8($w, j, k)` loads lanes `k..k + 8` of row `j` as f32, `$at($w, j, i)` one element,
    /// `$pf($w, k)` prefetches ahead (a hint only: it never faults nor changes a result). Same
    /// operations and order as [`dot`] (the loads only widen, which is exact).
    macro_rules! dot4_body {
        ($x:expr, $w:expr, $ld8:ident, $at:ident, $pf:ident) => {{
            let (x, w) = ($x, $w);
            let n = x.len();
            let full = n / 16 * 16;
            let z = _mm256_setzero_ps();
            let mut acc = [z; 8];
            let mut k = 0;
            while k < full {
                let x0 = ld(x, k);
                let x1 = ld(x, k + 8);
                $pf(w, k);
                for j in 0..4 {
                    acc[2 * j] = _mm256_add_ps(acc[2 * j], _mm256_mul_ps(x0, $ld8(w, j, k)));
                    acc[2 * j + 1] =
                        _mm256_add_ps(acc[2 * j + 1], _mm256_mul_ps(x1, $ld8(w, j, k + 8)));
                }
                k += 16;
            }
            let mut out = [0f32; 4];
            for j in 0..4 {
                let mut s = reduce(acc[2 * j], acc[2 * j + 1]);
                for i in full..n {
                    s += x[i] * $at(w, j, i);
                }
                out[j] = s;
            }
            out
        }};
    }

    #[target_feature(enable = "avx,avx2")]
    #[inline]
    unsafe fn rows_ld(w: &[&[f32]; 4], j: usize, k: usize) -> __m256 {
        ld(w[j], k)
    }

    #[inline(always)]
    fn rows_at(w: &[&[f32]; 4], j: usize, i: usize) -> f32 {
        w[j][i]
    }

    /// Rows are consecutive in W: the same offset PREFETCH_ROWS rows ahead.
    #[target_feature(enable = "avx,avx2")]
    #[inline]
    unsafe fn rows_pf(w: &[&[f32]; 4], k: usize) {
        let ahead = super::PREFETCH_ROWS * w[0].len();
        for r in w {
            _mm_prefetch(r.as_ptr().wrapping_add(k + ahead) as *const i8, _MM_HINT_T0);
        }
    }

    /// Four [`dot`]s of `x` with rows `w[0..4]`, sharing the loads of `x`.
    #[target_feature(enable = "avx,avx2")]
    pub unsafe fn dot4(x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
        dot4_body!(x, &w, rows_ld, rows_at, rows_pf)
    }

    /// One block of four rows in the packed f16 layout (see [`super::pack_f16_rows`]) and the
    /// row length.
    pub struct Block<'a>(pub &'a [u16], pub usize);

    #[target_feature(enable = "avx,avx2,f16c")]
    #[inline]
    unsafe fn packed_ld(b: &Block, j: usize, k: usize) -> __m256 {
        let off = super::packed_offset(b.1, j, k);
        debug_assert!(off + 8 <= b.0.len());
        _mm256_cvtph_ps(_mm_loadu_si128(b.0.as_ptr().add(off) as *const __m128i))
    }

    #[inline(always)]
    fn packed_at(b: &Block, j: usize, i: usize) -> f32 {
        half::f16::from_bits(b.0[super::packed_offset(b.1, j, i)]).to_f32()
    }

    /// A block is one sequential stream: prefetch PREFETCH_BYTES ahead of this iteration's
    /// 128 bytes (the next blocks follow in memory).
    #[target_feature(enable = "avx,avx2,f16c")]
    #[inline]
    unsafe fn packed_pf(b: &Block, k: usize) {
        let p = b.0.as_ptr().wrapping_add(4 * k + super::PREFETCH_BYTES / 2) as *const i8;
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p.wrapping_add(64), _MM_HINT_T0);
    }

    /// [`dot4`] with the four rows given as one packed block of exact f16 bit patterns: the
    /// same bits as [`dot4`] on the widened rows.
    #[target_feature(enable = "avx,avx2,f16c")]
    pub unsafe fn dot4_packed(x: &[f32], b: &Block) -> [f32; 4] {
        dot4_body!(x, b, packed_ld, packed_at, packed_pf)
    }

    /// [`super::scalar::weighted_sum`] with 64 output lanes held in registers across the rows
    /// (the same adds per lane, in row order).
    #[target_feature(enable = "avx,avx2")]
    pub unsafe fn weighted_sum<'a>(o: &mut [f32], p: &[f32], row: impl Fn(usize) -> &'a [f32]) {
        let dv = o.len();
        let mut c0 = 0;
        while c0 + 64 <= dv {
            let mut acc = [_mm256_setzero_ps(); 8];
            for (j, &pj) in p.iter().enumerate() {
                let pv = _mm256_set1_ps(pj);
                let r = &row(j)[c0..c0 + 64];
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(pv, ld(r, 8 * i)));
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(c0 + 8 * i), *a);
            }
            c0 += 64;
        }
        if c0 < dv {
            let rest = &mut o[c0..];
            rest.fill(0.0);
            for (j, &pj) in p.iter().enumerate() {
                axpy(rest, pj, &row(j)[c0..dv]);
            }
        }
    }

    #[target_feature(enable = "avx,avx2")]
    pub unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let full = n / 8 * 8;
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i < full {
            let r = _mm256_add_ps(
                _mm256_loadu_ps(y.as_ptr().add(i)),
                _mm256_mul_ps(av, ld(x, i)),
            );
            _mm256_storeu_ps(y.as_mut_ptr().add(i), r);
            i += 8;
        }
        for j in full..n {
            y[j] += a * x[j];
        }
    }

    /// [`super::exp_f32`] on 8 lanes.
    #[target_feature(enable = "avx,avx2")]
    #[inline]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        exp_lanes!(x, |t, z| {
            // The comparison mask is -1 where true.
            let gt = _mm256_castps_si256(_mm256_cmp_ps(cvt_ps(t), z, _CMP_GT_OQ));
            add_epi32(t, gt)
        })
    }

    #[target_feature(enable = "avx,avx2")]
    pub unsafe fn softmax(x: &mut [f32]) {
        let n = x.len();
        let mut m = f32::NEG_INFINITY;
        for &v in x.iter() {
            m = super::max_f32(m, v);
        }
        let mv = _mm256_set1_ps(m);
        let full = n / 16 * 16;
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut k = 0;
        while k < full {
            let e0 = exp8(_mm256_sub_ps(ld(x, k), mv));
            let e1 = exp8(_mm256_sub_ps(ld(x, k + 8), mv));
            _mm256_storeu_ps(x.as_mut_ptr().add(k), e0);
            _mm256_storeu_ps(x.as_mut_ptr().add(k + 8), e1);
            a0 = _mm256_add_ps(a0, e0);
            a1 = _mm256_add_ps(a1, e1);
            k += 16;
        }
        softmax_tail!(
            x,
            m,
            reduce(a0, a1),
            full = full,
            upto = n / 8 * 8,
            lanes = 8
        )
    }

    #[target_feature(enable = "avx,avx2")]
    pub unsafe fn gelu(x: &mut [f32]) {
        gelu_ptr(x.as_ptr(), x.as_mut_ptr(), x.len())
    }

    /// [`gelu`] from `src` into `dst`, `n` values (`src` may equal `dst`).
    #[target_feature(enable = "avx,avx2")]
    pub unsafe fn gelu_ptr(src: *const f32, dst: *mut f32, n: usize) {
        gelu_lanes!(src, dst, n, lanes = 8, sign = set1(-0.0), exp = exp8)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! AVX-512 versions of the hottest [`super::avx2`] functions: one 16-lane register where the
    //! AVX2 build holds two 8-lane ones, the same IEEE operations per lane in the same order (no
    //! fused multiply-add), the same final reduction: the same bits, from half the instructions.
    #![allow(unsafe_op_in_unsafe_fn)]
    use std::arch::x86_64::*;
    // The names `ld!`, `exp_lanes!`, `gelu_lanes!` and `softmax_tail!` are written in: this
    // build's intrinsics (and the bitwise `and`, `andnot`, `or`, `xor` below).
    use std::arch::x86_64::{
        _mm512_add_epi32 as add_epi32, _mm512_add_ps as add, _mm512_castsi512_ps as cast_ps,
        _mm512_cvtepi32_ps as cvt_ps, _mm512_cvttps_epi32 as cvtt_epi32, _mm512_div_ps as div,
        _mm512_loadu_ps as loadu, _mm512_max_ps as max, _mm512_min_ps as min, _mm512_mul_ps as mul,
        _mm512_set1_epi32 as set1_epi32, _mm512_set1_ps as set1, _mm512_slli_epi32 as slli_epi32,
        _mm512_storeu_ps as storeu, _mm512_sub_ps as sub,
    };

    ld! { #[target_feature(enable = "avx512f")] __m512, 16 }

    /// [`super::scalar::reduce`] of 16 lane accumulators: `(a[i] + a[i+8])`, halves, pairs.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn reduce(a: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(a);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
        super::avx2::reduce8(_mm256_add_ps(lo, hi))
    }

    // Bitwise float ops through the integer forms: `_mm512_{and,andnot,or,xor}_ps` are AVX-512DQ
    // (not enabled here: they would not inline and cost a call each), these are AVX-512F and give
    // the same bits.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn andnot(a: __m512, b: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_andnot_si512(
            _mm512_castps_si512(a),
            _mm512_castps_si512(b),
        ))
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn and(a: __m512, b: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(a),
            _mm512_castps_si512(b),
        ))
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn or(a: __m512, b: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(a),
            _mm512_castps_si512(b),
        ))
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn xor(a: __m512, b: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(a),
            _mm512_castps_si512(b),
        ))
    }

    /// [`super::exp_f32`] on 16 lanes (the operations of `avx2::exp8`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn exp16(x: __m512) -> __m512 {
        exp_lanes!(x, |t, z| {
            let gt = _mm512_cmp_ps_mask(cvt_ps(t), z, _CMP_GT_OQ);
            _mm512_mask_sub_epi32(t, gt, t, set1_epi32(1))
        })
    }

    /// [`super::scalar::softmax`]. The maximum is taken 16 lanes wide: for a row without NaN the
    /// maximum does not depend on the order (a row holding NaN is NaN whatever its maximum).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn softmax(x: &mut [f32]) {
        let n = x.len();
        let full = n / 16 * 16;
        let mut m = f32::NEG_INFINITY;
        if full > 0 {
            let mut mv = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut k = 0;
            while k < full {
                mv = _mm512_max_ps(ld(x, k), mv);
                k += 16;
            }
            m = _mm512_reduce_max_ps(mv);
        }
        for &v in x[full..].iter() {
            m = super::max_f32(m, v);
        }
        let mv = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        let mut k = 0;
        while k < full {
            let e = exp16(_mm512_sub_ps(ld(x, k), mv));
            _mm512_storeu_ps(x.as_mut_ptr().add(k), e);
            acc = _mm512_add_ps(acc, e);
            k += 16;
        }
        softmax_tail!(x, m, reduce(acc), full = full, upto = full, lanes = 16)
    }

    /// [`super::scalar::gelu`] (the operations of `avx2::gelu`).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gelu(x: &mut [f32]) {
        gelu_ptr(x.as_ptr(), x.as_mut_ptr(), x.len())
    }

    /// [`gelu`] from `src` into `dst`, `n` values (`src` may equal `dst`).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gelu_ptr(src: *const f32, dst: *mut f32, n: usize) {
        gelu_lanes!(
            src,
            dst,
            n,
            lanes = 16,
            sign = cast_ps(_mm512_set1_epi32(i32::MIN)),
            exp = exp16
        )
    }

    /// `avx2::dot4_packed`: four dots of `x` with one packed f16 block of four rows, one 16-lane
    /// accumulator per row (lane `l` sums `k = 16c + l`, as the AVX2 pair does).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot4_packed(x: &[f32], blk: &[u16], k: usize) -> [f32; 4] {
        let full = k / 16 * 16;
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut c = 0;
        while c < full {
            let xv = ld(x, c);
            let base = blk.as_ptr().add(4 * c);
            let pf = base.wrapping_add(super::PREFETCH_BYTES / 2) as *const i8;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf.wrapping_add(64), _MM_HINT_T0);
            for (j, a) in acc.iter_mut().enumerate() {
                let h = _mm256_loadu_si256(base.add(16 * j) as *const __m256i);
                *a = _mm512_add_ps(*a, _mm512_mul_ps(xv, _mm512_cvtph_ps(h)));
            }
            c += 16;
        }
        let mut out = [0f32; 4];
        for (j, o) in out.iter_mut().enumerate() {
            let mut s = reduce(acc[j]);
            for i in full..k {
                s += x[i] * half::f16::from_bits(blk[super::packed_offset(k, j, i)]).to_f32();
            }
            *o = s;
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| has_avx2() && std::arch::is_x86_feature_detected!("avx512f"))
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("avx2")
    })
}

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F.get_or_init(|| has_avx2() && std::arch::is_x86_feature_detected!("f16c"))
}

/// Dispatch to the AVX-512 build, else the AVX2 build, when the CPU has it (same bits every way).
macro_rules! dispatch3 {
    ($avx512:expr, $avx:expr, $scalar:expr) => {{
        #[cfg(target_arch = "x86_64")]
        let r = if has_avx512() {
            // SAFETY: the AVX-512 build (avx512f only) runs only when the CPU supports AVX-512F.
            unsafe { $avx512 }
        } else if has_avx2() {
            // SAFETY: the AVX2 build runs only when the CPU supports AVX and AVX2.
            unsafe { $avx }
        } else {
            $scalar
        };
        #[cfg(not(target_arch = "x86_64"))]
        let r = $scalar;
        r
    }};
}

/// Dispatch to the AVX2 build when the CPU has it (same bits either way).
macro_rules! dispatch {
    ($avx:expr, $scalar:expr) => {{
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 build runs only when the CPU supports AVX and AVX2.
        let r = if has_avx2() { unsafe { $avx } } else { $scalar };
        #[cfg(not(target_arch = "x86_64"))]
        let r = $scalar;
        r
    }};
}

/// Fixed-order dot product (see `scalar::dot`).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    dispatch!(avx2::dot(a, b), scalar::dot(a, b))
}

/// `y[r, n - n0] = dot(x[r, :], w[n, :]) (+ bias[n])` for rows `0..m` of a row-major `[m, k]` x
/// and columns `n0..n1` of a row-major `[*, k]` w, into `out` as `[m, n1 - n0]`. Every element
/// is exactly [`dot`] then `+ bias`, whatever the tiling, the row count or the column range.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_nt_rows(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    m: usize,
    n0: usize,
    n1: usize,
    out: &mut [f32],
) {
    gemm_nt_rows_with(
        bias,
        m,
        n0,
        n1,
        out,
        |_| true,
        |n, r| {
            let ws = rows4(w, n, k);
            let xr = &x[r * k..(r + 1) * k];
            dispatch!(
                avx2::dot4(xr, ws),
                [
                    scalar::dot(xr, ws[0]),
                    scalar::dot(xr, ws[1]),
                    scalar::dot(xr, ws[2]),
                    scalar::dot(xr, ws[3])
                ]
            )
        },
        |n, r| dot(&x[r * k..(r + 1) * k], &w[n * k..(n + 1) * k]),
    )
}

/// Rows `n..n + 4` of a row-major `[*, k]` matrix.
fn rows4<T>(w: &[T], n: usize, k: usize) -> [&[T]; 4] {
    [
        &w[n * k..(n + 1) * k],
        &w[(n + 1) * k..(n + 2) * k],
        &w[(n + 2) * k..(n + 3) * k],
        &w[(n + 3) * k..(n + 4) * k],
    ]
}

/// Where element `i` of row `j` (0..4) of a block sits in the packed f16 layout of
/// [`pack_f16_rows`] for rows of length `k`.
#[inline(always)]
fn packed_offset(k: usize, j: usize, i: usize) -> usize {
    let full = k / 16 * 16;
    if i < full {
        (i / 16 * 4 + j) * 16 + i % 16
    } else {
        4 * full + j * (k - full) + (i - full)
    }
}

/// The layout the row-stable GEMV reads f16 weights in: a row-major `[n, k]` matrix (f16 bits)
/// regrouped into blocks of four rows, each block one contiguous run of `4 k` values: the first
/// 16 values of rows 0, 1, 2, 3, then the next 16 of each, ..., then the `k % 16` tail of each
/// row; the last `n % 4` rows follow row-major. A block is then read as one sequential stream
/// (four rows read side by side are four streams, which the hardware prefetches worse: 3.6 vs
/// 2.6 ms for the tiny.en logits projection on one thread).
pub(crate) fn pack_f16_rows(w: &[u16], n: usize, k: usize) -> Vec<u16> {
    let mut out = vec![0u16; n * k];
    let blocks = n / 4;
    for b in 0..blocks {
        let blk = &mut out[b * 4 * k..(b + 1) * 4 * k];
        for j in 0..4 {
            for (i, &v) in w[(4 * b + j) * k..(4 * b + j + 1) * k].iter().enumerate() {
                blk[packed_offset(k, j, i)] = v;
            }
        }
    }
    out[blocks * 4 * k..].copy_from_slice(&w[blocks * 4 * k..n * k]);
    out
}

/// Row `r` of a packed matrix ([`pack_f16_rows`]), widened to f32.
fn unpack_f16_row(w: &[u16], n: usize, k: usize, r: usize) -> Vec<f32> {
    let f = |h: u16| half::f16::from_bits(h).to_f32();
    if r < n / 4 * 4 {
        let blk = &w[r / 4 * 4 * k..(r / 4 + 1) * 4 * k];
        (0..k).map(|i| f(blk[packed_offset(k, r % 4, i)])).collect()
    } else {
        w[r * k..(r + 1) * k].iter().map(|&h| f(h)).collect()
    }
}

/// [`gemm_nt_rows`] with `w` an exact f16 mirror of the f32 weight in the packed layout of
/// [`pack_f16_rows`] (`n` rows in all): widening is exact, so every element has the bits
/// [`gemm_nt_rows`] gives on the f32 weight, from half the bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_nt_rows_f16(
    x: &[f32],
    w: &[u16],
    n: usize,
    bias: Option<&[f32]>,
    k: usize,
    m: usize,
    n0: usize,
    n1: usize,
    out: &mut [f32],
) {
    let in_block = n / 4 * 4;
    gemm_nt_rows_with(
        bias,
        m,
        n0,
        n1,
        out,
        // Only whole packed blocks go four at a time.
        |col| col.is_multiple_of(4) && col + 4 <= in_block,
        |col, r| {
            let xr = &x[r * k..(r + 1) * k];
            #[cfg(target_arch = "x86_64")]
            if has_avx512() {
                // SAFETY: runs only when the CPU has AVX-512F (its cvtph covers F16C).
                return unsafe { avx512::dot4_packed(xr, &w[col * k..(col + 4) * k], k) };
            }
            if has_f16c() {
                let blk = &w[col * k..(col + 4) * k];
                // SAFETY: runs only when the CPU has AVX, AVX2 and F16C.
                return unsafe { avx2::dot4_packed(xr, &avx2::Block(blk, k)) };
            }
            std::array::from_fn(|j| dot(xr, &unpack_f16_row(w, n, k, col + j)))
        },
        |col, r| dot(&x[r * k..(r + 1) * k], &unpack_f16_row(w, n, k, col)),
    )
}

/// The tiling shared by [`gemm_nt_rows`] and [`gemm_nt_rows_f16`]: a column `n` where
/// `block(n)` holds starts a block of four (`dot4(n, r)` = the dots of row `r` with columns
/// `n..n + 4`, used when the four fit before `n1`); other columns go one by one (`dot1(n, r)`);
/// then `+ bias`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemm_nt_rows_with(
    bias: Option<&[f32]>,
    m: usize,
    n0: usize,
    n1: usize,
    out: &mut [f32],
    block: impl Fn(usize) -> bool,
    dot4: impl Fn(usize, usize) -> [f32; 4],
    dot1: impl Fn(usize, usize) -> f32,
) {
    let nb = n1 - n0;
    let mut n = n0;
    while n < n1 {
        if n + 4 <= n1 && block(n) {
            for r in 0..m {
                let d = dot4(n, r);
                for j in 0..4 {
                    out[r * nb + n - n0 + j] = match bias {
                        Some(b) => d[j] + b[n + j],
                        None => d[j],
                    };
                }
            }
            n += 4;
        } else {
            for r in 0..m {
                let d = dot1(n, r);
                out[r * nb + n - n0] = match bias {
                    Some(b) => d + b[n],
                    None => d,
                };
            }
            n += 1;
        }
    }
}

/// Multiply in place by a scalar.
pub(crate) fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// Softmax of a row in place: max, `exp(x - max)` with 16 fixed sum lanes, times `1 / sum` (the
/// order of PyTorch's vectorised CPU softmax).
///
/// Upstream: pytorch v2.11.0 aten/src/ATen/native/cpu/SoftMaxKernel.cpp `_vec_softmax_lastdim`.
pub(crate) fn softmax_row(x: &mut [f32]) {
    dispatch3!(avx512::softmax(x), avx2::softmax(x), scalar::softmax(x))
}

/// One query row of attention over the first `n` keys: `o = sum_j softmax(q . k_j)_j v_j`,
/// summed in key order; `q` already scaled; `k`, `v` one head's `[keys, d]` / `[keys, dv]` rows;
/// `sc` scratch of at least `n`; `o` is overwritten.
pub(crate) fn attend_row(q: &[f32], k: &[f32], v: &[f32], n: usize, sc: &mut [f32], o: &mut [f32]) {
    let d = q.len();
    let dv = o.len();
    // Scores are exactly `dot(q, k_j)` (four keys at a time share the loads of q).
    gemm_nt_rows(q, &k[..n * d], None, d, 1, 0, n, &mut sc[..n]);
    softmax_row(&mut sc[..n]);
    weighted_sum(o, &sc[..n], |j| &v[j * dv..(j + 1) * dv]);
}

/// `o = sum_j p[j] * row(j)`, the rows added in `j` order from `o = 0` (each row at least
/// `o.len()` long; only its first `o.len()` values are read).
pub(crate) fn weighted_sum<'a>(o: &mut [f32], p: &[f32], row: impl Fn(usize) -> &'a [f32]) {
    let dv = o.len();
    let row = |j: usize| &row(j)[..dv];
    dispatch!(
        avx2::weighted_sum(o, p, row),
        scalar::weighted_sum(o, p, row)
    )
}

/// Exact-erf GELU in place (HF `"gelu"` = `torch.nn.functional.gelu`, approximate='none').
pub(crate) fn gelu_inplace(x: &mut [f32]) {
    dispatch3!(avx512::gelu(x), avx2::gelu(x), scalar::gelu(x))
}

/// `gelu(x)` into a new vector (the bits of [`gelu_inplace`]), written once: no zero fill, no
/// copy of `x` first. Splits into chunks on the kernels' pool when large (elementwise: any split
/// gives the same bits).
pub(crate) fn gelu_to_vec(x: &[f32]) -> Vec<f32> {
    let n = x.len();
    let mut y: Vec<f32> = Vec::with_capacity(n);
    let fill = |src: &[f32], dst: &mut [std::mem::MaybeUninit<f32>]| {
        let (s, d, len) = (
            src.as_ptr(),
            dst.as_mut_ptr() as *mut f32,
            src.len().min(dst.len()),
        );
        // Every build reads `s` and writes `d` for `len` values: two disjoint slices of at least
        // that length (MaybeUninit<f32> has f32's layout), written only.
        dispatch3!(
            avx512::gelu_ptr(s, d, len),
            avx2::gelu_ptr(s, d, len),
            // SAFETY: see above.
            unsafe { scalar::gelu_ptr(s, d, len) }
        )
    };
    const CHUNK: usize = 1 << 14;
    let spare = &mut y.spare_capacity_mut()[..n];
    match super::pool().filter(|_| n >= super::PAR_MIN_WORK / 8) {
        Some(pool) => pool.install(|| {
            use rayon::prelude::*;
            spare
                .par_chunks_mut(CHUNK)
                .zip(x.par_chunks(CHUNK))
                .with_max_len(1)
                .for_each(|(d, s)| fill(s, d))
        }),
        None => fill(x, spare),
    }
    // SAFETY: all `n` values were written above (the chunks cover `0..n`).
    unsafe { y.set_len(n) };
    y
}

/// Elementwise `a += b`.
pub(crate) fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += *y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::bits;

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 0.0 {
            let r = exp_f32(x) as f64;
            let e = (x as f64).exp();
            worst = worst.max(((r - e) / e).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert!(exp_f32(f32::NAN).is_nan(), "exp(NaN) is NaN, as in torch");
        let mut row = [0.5f32, f32::NAN, -1.0];
        scalar::softmax(&mut row);
        assert!(row.iter().all(|v| v.is_nan()), "{row:?}");
    }

    #[test]
    fn erf_close_to_libm() {
        for i in -400..400 {
            let x = i as f32 * 0.01;
            let e = libm_erf(x as f64);
            let err = (erf_f32(x) as f64 - e).abs();
            // A&S 7.1.26 is within 1.5e-7; f32 rounding of `1 - e t r` adds a few 1e-8.
            assert!(err < 5e-7, "erf({x}): error {err}");
        }
    }

    fn libm_erf(x: f64) -> f64 {
        // Series / continued fraction are overkill: integrate exp(-t^2) with Simpson's rule.
        let n = 2000;
        let h = x / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut s = f(0.0) + f(x);
        for i in 1..n {
            s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        crate::kernels::noise(n, seed, 12.0)
    }

    #[test]
    fn gemm_rows_equal_dot() {
        let x = data(77, 1);
        let w = data(77 * 6, 2);
        let mut out = vec![0f32; 6];
        gemm_nt_rows(&x, &w, None, 77, 1, 0, 6, &mut out);
        for n in 0..6 {
            assert_eq!(
                out[n].to_bits(),
                dot(&x, &w[n * 77..(n + 1) * 77]).to_bits()
            );
            assert_eq!(
                out[n].to_bits(),
                scalar::dot(&x, &w[n * 77..(n + 1) * 77]).to_bits()
            );
        }
    }

    /// An exact f16 mirror in the packed layout gives the f32 weight's bits on every path:
    /// four-row blocks, the rows after the last block, column ranges that start mid-block,
    /// several rows of x, `k` with and without a tail past a multiple of 16.
    #[test]
    fn gemm_rows_f16_equal_f32() {
        for (m, k, n) in [(3usize, 77usize, 11usize), (2, 64, 8), (1, 384, 9)] {
            let x = data(m * k, 4);
            let w: Vec<f32> = data(n * k, 5)
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect();
            let bits16: Vec<u16> = w
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let packed = pack_f16_rows(&bits16, n, k);
            for r in 0..n {
                let want = bits(&w[r * k..(r + 1) * k]);
                assert_eq!(
                    bits(&unpack_f16_row(&packed, n, k, r)),
                    want,
                    "unpacked row {r}"
                );
            }
            let b = data(n, 6);
            for bias in [None, Some(&b[..])] {
                for (n0, n1) in [(0, n), (1, n - 2), (4, n), (n - 1, n)] {
                    let mut o32 = vec![0f32; m * (n1 - n0)];
                    let mut o16 = vec![1f32; m * (n1 - n0)];
                    gemm_nt_rows(&x, &w, bias, k, m, n0, n1, &mut o32);
                    gemm_nt_rows_f16(&x, &packed, n, bias, k, m, n0, n1, &mut o16);
                    assert_eq!(bits(&o32), bits(&o16), "k {k}, columns {n0}..{n1}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            if has_f16c() {
                // SAFETY: F16C (and AVX2) checked above.
                let d = unsafe { avx2::dot4_packed(&x[..k], &avx2::Block(&packed[..4 * k], k)) };
                for (j, dj) in d.iter().enumerate() {
                    let s = scalar::dot(&x[..k], &w[j * k..(j + 1) * k]);
                    assert_eq!(dj.to_bits(), s.to_bits(), "dot4_packed row {j}");
                }
            }
        }
    }

    /// The out-of-place GELU (chunked on the pool when large) gives the in-place bits.
    #[test]
    fn gelu_to_vec_equals_in_place() {
        for n in [0usize, 5, 16, 1000, 70_001] {
            let x = data(n, 21 + n as u32);
            let mut want = x.clone();
            gelu_inplace(&mut want);
            let mut s = x.clone();
            scalar::gelu(&mut s);
            let got = gelu_to_vec(&x);
            assert_eq!(bits(&got), bits(&want), "n {n}");
            assert_eq!(bits(&got), bits(&s), "n {n} scalar");
        }
    }

    /// The AVX2 build must give the scalar definition's bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_equals_scalar() {
        if !xray_core::testing::require_cpu(&["avx", "avx2", "avx512f"]) {
            return;
        }
        for n in [1usize, 7, 16, 33, 64, 100, 1500, 1501] {
            let a = data(n, n as u32);
            // SAFETY: AVX-512F checked above.
            unsafe {
                let (mut s1, mut s2) = (a.clone(), a.clone());
                avx512::softmax(&mut s1);
                scalar::softmax(&mut s2);
                assert_eq!(s1, s2, "softmax n={n}");
                // A row holding NaN (anywhere) is NaN everywhere, as the scalar build gives.
                for at in [0, n / 2, n - 1] {
                    let (mut s1, mut s2) = (a.clone(), a.clone());
                    s1[at] = f32::NAN;
                    s2[at] = f32::NAN;
                    avx512::softmax(&mut s1);
                    scalar::softmax(&mut s2);
                    assert!(s1.iter().all(|v| v.is_nan()), "softmax NaN n={n} at={at}");
                    assert!(s2.iter().all(|v| v.is_nan()), "scalar NaN n={n} at={at}");
                }
                let (mut g1, mut g2) = (a.clone(), a.clone());
                avx512::gelu(&mut g1);
                scalar::gelu(&mut g2);
                assert_eq!(g1, g2, "gelu n={n}");
            }
            // dot4_packed against the scalar dot of each widened row.
            let k = n;
            let w: Vec<u16> = data(4 * k, 11 + n as u32)
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let packed = pack_f16_rows(&w, 4, k);
            // SAFETY: AVX-512F checked above.
            let d = unsafe { avx512::dot4_packed(&a, &packed, k) };
            for (j, dj) in d.iter().enumerate() {
                let row = unpack_f16_row(&packed, 4, k, j);
                assert_eq!(
                    dj.to_bits(),
                    scalar::dot(&a, &row).to_bits(),
                    "dot4_packed n={n} j={j}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_equals_scalar() {
        if !xray_core::testing::require_cpu(&["avx", "avx2"]) {
            return;
        }
        for n in [1usize, 7, 16, 33, 64, 100, 1500] {
            let a = data(n, n as u32);
            let b = data(n, 7 + n as u32);
            // SAFETY: AVX2 checked above.
            unsafe {
                assert_eq!(
                    avx2::dot(&a, &b).to_bits(),
                    scalar::dot(&a, &b).to_bits(),
                    "dot n={n}"
                );
                let w = [&b[..], &a[..], &b[..], &a[..]];
                let d4 = avx2::dot4(&a, w);
                assert_eq!(d4[0].to_bits(), scalar::dot(&a, &b).to_bits(), "dot4 n={n}");
                assert_eq!(d4[1].to_bits(), scalar::dot(&a, &a).to_bits(), "dot4 n={n}");
                let (mut s1, mut s2) = (a.clone(), a.clone());
                avx2::softmax(&mut s1);
                scalar::softmax(&mut s2);
                assert_eq!(s1, s2, "softmax n={n}");
                let (mut g1, mut g2) = (a.clone(), a.clone());
                avx2::gelu(&mut g1);
                scalar::gelu(&mut g2);
                assert_eq!(g1, g2, "gelu n={n}");
                // weighted_sum: 64-lane register blocks plus a tail, against the scalar loop.
                for dv in [64usize, 8, 72, 130] {
                    let rows = n.min(40);
                    let v = data(rows * dv, 3 + n as u32);
                    let row = |j: usize| &v[j * dv..(j + 1) * dv];
                    let (mut o1, mut o2) = (vec![1f32; dv], vec![2f32; dv]);
                    avx2::weighted_sum(&mut o1, &a[..rows], row);
                    scalar::weighted_sum(&mut o2, &a[..rows], row);
                    assert_eq!(o1, o2, "weighted_sum n={n} dv={dv}");
                }
                let (mut y1, mut y2) = (b.clone(), b.clone());
                avx2::axpy(&mut y1, 0.37, &a);
                scalar::axpy(&mut y2, 0.37, &a);
                assert_eq!(y1, y2, "axpy n={n}");
            }
        }
        use std::arch::x86_64::*;
        // `exp8` of 8 values. SAFETY: AVX2 checked above.
        let exp8 = |c: &[f32], out: &mut [f32]| unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), avx2::exp8(_mm256_loadu_ps(c.as_ptr())))
        };
        // exp over its whole clamped range, `lanes` values at a time, on each build the CPU has.
        let xs: Vec<f32> = (0..20000).map(|i| -100.0 + i as f32 * 0.0097).collect();
        let whole_range = |lanes: usize, exp: &dyn Fn(&[f32], &mut [f32])| {
            for c in xs.chunks_exact(lanes) {
                let mut out = vec![0f32; lanes];
                exp(c, &mut out);
                for (o, x) in out.iter().zip(c) {
                    assert_eq!(
                        o.to_bits(),
                        exp_f32(*x).to_bits(),
                        "exp({x}), {lanes} lanes"
                    );
                }
            }
        };
        if has_avx512() {
            // SAFETY: AVX-512F checked above.
            whole_range(16, &|c, out| unsafe {
                _mm512_storeu_ps(out.as_mut_ptr(), avx512::exp16(_mm512_loadu_ps(c.as_ptr())))
            });
        }
        whole_range(8, &exp8);
        // NaN stays NaN in every lane position.
        for lane in 0..8 {
            let mut c = [1.0f32; 8];
            c[lane] = f32::NAN;
            let mut out = [0f32; 8];
            exp8(&c, &mut out);
            assert!(out[lane].is_nan() && out.iter().filter(|v| v.is_nan()).count() == 1);
        }
    }
}
