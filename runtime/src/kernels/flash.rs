//! Fused scaled dot-product attention for the `gemm` strategy (the encoder's bidirectional
//! self-attention over 1500 frames) on AVX-512 or AVX2 (with FMA): per task of (head, [`BQ`]
//! query rows), the block's scores `q k^T` by a register-tiled microkernel into a `BQ x keys`
//! slab that stays in L2 (never the `T x S` matrix), their row maxima, `exp(s - max)` and row sums in one pass, then
//! `p v` by the same microkernel and one multiply of the `BQ x Dv` context by `1 / sum` (the
//! probabilities themselves are normalized only when they are an output). Fused multiply-adds
//! throughout, so the rounding differs from the unfused path (within the checkpoints'
//! tolerances); every output row is computed whole by one thread from its own query row with the
//! same order of operations whatever the block, the task split or the thread count, so the bits
//! do not depend on the thread count.
//!
//! Used when the CPU has AVX-512F and FMA and the head width is [`NR`] (Whisper: 64 at every
//! size); otherwise [`super::Attention`] keeps its two-sgemm path.
#![allow(unsafe_code)]

use std::cell::RefCell;

pub(crate) use super::gemm512::NR;
/// Query rows of one microtile, and its columns (four 16-lane registers): keys per score panel,
/// and the head width the context product needs (the linear's microkernel, [`super::gemm512`]).
use super::gemm512::{Epilogue, MR};
/// Keys per block of the context product's sum (see [`block`]).
const KC: usize = 256;
/// Query rows per task: `BQ x keys` scores (48 x 1536 x 4 B = 288 KB for Whisper's encoder) stay
/// in L2 with the head's packed keys and values.
const BQ: usize = 8 * MR;

/// Whether the fused kernel runs here: the packed GEMM's microkernel does
/// ([`super::gemm512::tile_available`]: x86-64 with FMA and AVX-512F or AVX2), head width [`NR`].
pub(crate) fn available(dv: usize) -> bool {
    dv == NR && super::gemm512::tile_available()
}

/// One attention call's operands: q `[H, T, D]`, k `[H, S, D]`, v `[H, S, NR]`, head-major.
pub(crate) struct Call<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub h: usize,
    pub t: usize,
    pub s: usize,
    pub d: usize,
    pub scale: f32,
    pub causal: bool,
    /// q, k, v and the context token-major (`[T, H * D]`, `[S, H * D]`, `[S, H * NR]`,
    /// `[T, H * NR]`: the projections' own layout, no head split or merge copies) instead of
    /// head-major. The probabilities are head-major either way.
    pub token_major: bool,
}

impl Call<'_> {
    /// Element strides `(row, head)` of an operand with `rows` rows of `width` values per head.
    fn strides(&self, rows: usize, width: usize) -> (usize, usize) {
        if self.token_major {
            (self.h * width, width)
        } else {
            (width, rows * width)
        }
    }
}

/// The context's base pointer, shared by the tasks: each task writes only its own (head, rows)
/// elements, which no other task touches.
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (see `attention_with`); the pointer outlives them.
unsafe impl Sync for OutPtr {}

thread_local! {
    /// Per-thread scratch (query block, scores, context), reused across tasks and calls: no
    /// fresh pages per task.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The fused attention into `out` `[H, T, NR]` (and the probabilities into `probs` `[H, T, S]`
/// when given). The caller has checked [`available`] and the operand sizes.
pub(crate) fn attention(
    c: &Call,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> Result<(), String> {
    attention_with(c, out, probs, true)
}

/// [`attention`], on the kernels' pool when `parallel` and the work is large enough.
fn attention_with(
    c: &Call,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
    parallel: bool,
) -> Result<(), String> {
    let Call { h, t, s, d, .. } = *c;
    if c.q.len() != h * t * d || c.k.len() != h * s * d || c.v.len() != h * s * NR {
        return Err("fused attention: q, k, v sizes do not fit".into());
    }
    if out.len() != h * t * NR || probs.as_ref().is_some_and(|p| p.len() != h * t * s) {
        return Err("fused attention: output sizes do not fit".into());
    }
    if !available(NR) {
        return Err("fused attention needs AVX-512F and FMA".into());
    }
    if h == 0 || t == 0 {
        return Ok(());
    }
    if s == 0 {
        // No keys: torch's softmax of an empty row is empty and the context is 0.
        out.fill(0.0);
        return Ok(());
    }
    // Keys padded to whole panels; the packed K^T of every head, panel by panel: `[H, SP / NR,
    // D, NR]` (a panel is one contiguous 16 KB block: rows `sp` apart would map a panel's 64
    // rows onto a few L1 sets and evict it between microtiles).
    let sp = s.div_ceil(NR) * NR;
    let mut kt = vec![0f32; h * d * sp];
    let (k_rs, k_hs) = c.strides(s, d);
    // Token-major values are re-packed per head, `[H, S, NR]` contiguous (rows `H * NR` apart
    // alias in L1 the same way); head-major ones already are.
    let mut vp = vec![0f32; if c.token_major { h * s * NR } else { 0 }];
    let pack = |hi: usize, dst: &mut [f32], vdst: &mut [f32]| {
        for j in 0..s {
            let row = &c.k[j * k_rs + hi * k_hs..j * k_rs + hi * k_hs + d];
            let panel = &mut dst[(j / NR) * d * NR..];
            for (kk, &x) in row.iter().enumerate() {
                panel[kk * NR + j % NR] = x;
            }
        }
        if !vdst.is_empty() {
            let (v_rs, v_hs) = c.strides(s, NR);
            for (j, out) in vdst.chunks_exact_mut(NR).enumerate() {
                out.copy_from_slice(&c.v[j * v_rs + hi * v_hs..j * v_rs + hi * v_hs + NR]);
            }
        }
    };
    // Tasks: (head, first row, rows, its probability rows).
    type Task<'b> = (usize, usize, usize, Option<&'b mut [f32]>);
    let mut tasks: Vec<Task> = Vec::with_capacity(h * t.div_ceil(BQ));
    let mut prob_heads = probs.map(|p| p.chunks_mut(t * s));
    for hi in 0..h {
        let mut pbs = prob_heads
            .as_mut()
            .and_then(|it| it.next())
            .map(|ph| ph.chunks_mut(BQ * s));
        for t0 in (0..t).step_by(BQ) {
            let pb = pbs.as_mut().and_then(|it| it.next());
            tasks.push((hi, t0, BQ.min(t - t0), pb));
        }
    }
    let base = OutPtr(out.as_mut_ptr());
    let run = |(hi, t0, rows, pb): Task, kt: &[f32], vp: &[f32]| -> Result<(), String> {
        // This head's values and their row stride.
        let (vh, v_rs) = if vp.is_empty() {
            let (v_rs, v_hs) = c.strides(s, NR);
            (&c.v[hi * v_hs..], v_rs)
        } else {
            (&vp[hi * s * NR..(hi + 1) * s * NR], NR)
        };
        block(
            c,
            &kt[hi * d * sp..(hi + 1) * d * sp],
            vh,
            v_rs,
            sp,
            hi,
            t0,
            rows,
            &base,
            pb,
        )
    };
    let work = h.saturating_mul(t).saturating_mul(s).saturating_mul(d + NR);
    match super::pool().filter(|_| parallel && work >= super::PAR_MIN_WORK) {
        Some(pool) => pool.install(|| {
            use rayon::prelude::*;
            let vchunk = if vp.is_empty() { 0 } else { s * NR };
            kt.par_chunks_mut(d * sp)
                .zip(par_chunks_or_empty(&mut vp, vchunk, h))
                .enumerate()
                .for_each(|(hi, (dst, vdst))| pack(hi, dst, vdst));
            let (kt, vp) = (&kt, &vp);
            tasks
                .into_par_iter()
                .with_max_len(1)
                .try_for_each(|task| run(task, kt, vp))
        }),
        None => {
            let vchunk = if vp.is_empty() { 0 } else { s * NR };
            for (hi, dst) in kt.chunks_mut(d * sp).enumerate() {
                let vdst: &mut [f32] = if vchunk == 0 {
                    &mut []
                } else {
                    &mut vp[hi * vchunk..(hi + 1) * vchunk]
                };
                pack(hi, dst, vdst);
            }
            tasks.into_iter().try_for_each(|task| run(task, &kt, &vp))
        }
    }
}

/// `h` mutable chunks of `v` of `chunk` values each, or `h` empty slices when `chunk` is 0.
fn par_chunks_or_empty(v: &mut [f32], chunk: usize, h: usize) -> rayon::vec::IntoIter<&mut [f32]> {
    use rayon::prelude::*;
    let parts: Vec<&mut [f32]> = if chunk == 0 {
        (0..h).map(|_| -> &mut [f32] { &mut [] }).collect()
    } else {
        v.chunks_mut(chunk).collect()
    };
    parts.into_par_iter()
}

/// One task: rows `t0 .. t0 + rows` of head `hi` (`kt` the head's packed K^T, `vh` its values
/// with rows `v_rs` apart), the context written through `out`.
#[allow(clippy::too_many_arguments)]
fn block(
    c: &Call,
    kt: &[f32],
    vh: &[f32],
    v_rs: usize,
    sp: usize,
    hi: usize,
    t0: usize,
    rows: usize,
    out: &OutPtr,
    pb: Option<&mut [f32]>,
) -> Result<(), String> {
    let (t, s, d) = (c.t, c.s, c.d);
    let rp = rows.div_ceil(MR) * MR;
    let (q_rs, q_hs) = c.strides(t, d);
    let (o_rs, o_hs) = c.strides(t, NR);
    SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        let need = rp * d + rp * sp + rp * NR;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (qb, rest) = buf.split_at_mut(rp * d);
        let (sc, rest) = rest.split_at_mut(rp * sp);
        let ot = &mut rest[..rp * NR];
        // The block's query rows, scaled (padding rows zero: their results are dropped).
        for (i, qr) in qb.chunks_exact_mut(d).take(rows).enumerate() {
            let at = (t0 + i) * q_rs + hi * q_hs;
            for (dst, &x) in qr.iter_mut().zip(&c.q[at..at + d]) {
                *dst = x * c.scale;
            }
        }
        qb[rows * d..].fill(0.0);
        // Scores, panel by panel (a 64-key panel of K^T stays in L1 across the microtiles).
        for j0 in (0..sp).step_by(NR) {
            for r0 in (0..rp).step_by(MR) {
                microkernel(
                    d,
                    &qb[r0 * d..],
                    d,
                    &kt[j0 * d..],
                    NR,
                    &mut sc[r0 * sp + j0..],
                    sp,
                    Epilogue::Store,
                )?;
            }
        }
        // exp(s - max) over each row's visible keys (masked and padding keys 0), row sums.
        let mut inv = [0f32; BQ];
        for (i, row) in sc.chunks_exact_mut(sp).take(rows).enumerate() {
            let n = if c.causal {
                (s - t + t0 + i + 1).min(s)
            } else {
                s
            };
            // SAFETY: available() (checked by the caller) ensured FMA and AVX-512F or AVX2.
            let sum = unsafe { exp_row(row, n) };
            inv[i] = 1.0 / sum;
        }
        for row in sc.chunks_exact_mut(sp).skip(rows) {
            row.fill(0.0);
        }
        if let Some(pb) = pb {
            // Normalized probabilities (the output), and the context from them.
            for (i, (row, prow)) in sc
                .chunks_exact_mut(sp)
                .zip(pb.chunks_exact_mut(s))
                .enumerate()
            {
                let n = if c.causal {
                    (s - t + t0 + i + 1).min(s)
                } else {
                    s
                };
                for x in row[..n].iter_mut() {
                    *x *= inv[i];
                }
                // A row holding NaN is NaN everywhere, masked keys included (as torch).
                let masked = if inv[i].is_nan() { f32::NAN } else { 0.0 };
                prow[..n].copy_from_slice(&row[..n]);
                prow[n..].fill(masked);
                inv[i] = 1.0;
            }
        }
        // The context in blocks of KC keys: each block's products summed from 0, then added to
        // the running sum (a chain of 1500 fused multiply-adds per element loses more to
        // rounding than blocks of KC do; the order is fixed, the bits the same for every split).
        // Block by block over all the microtiles: a block of V (KC x NR, 64 KB) is read from
        // memory once per task and stays in L2 across them (microtile by microtile, the whole of
        // V would be streamed once per microtile); each element's sum is the same either way.
        for k0 in (0..s).step_by(KC) {
            let kn = KC.min(s - k0);
            let epi = if k0 == 0 {
                Epilogue::Store
            } else {
                Epilogue::Add
            };
            for r0 in (0..rp).step_by(MR) {
                let acc = &mut ot[r0 * NR..(r0 + MR) * NR];
                let a = &sc[r0 * sp + k0..];
                microkernel(kn, a, sp, &vh[k0 * v_rs..], v_rs, acc, NR, epi)?;
            }
        }
        for (i, src) in ot.chunks_exact(NR).take(rows).enumerate() {
            let f = inv[i];
            let at = (t0 + i) * o_rs + hi * o_hs;
            // SAFETY: `at + NR <= out.len()` (row t0 + i < t, head hi < h, checked sizes), and
            // (head hi, row t0 + i) belongs to this task alone.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), NR) };
            for (o, &x) in dst.iter_mut().zip(src) {
                *o = x * f;
            }
        }
        Ok(())
    })
}

/// `C[MR x NR] (epilogue) A[MR x k] B[k x NR]` ([`super::gemm512::microkernel`]) over slices:
/// A's rows `lda` apart, B's rows `ldb` apart (NR contiguous values each), C's rows `ldc` apart,
/// the extents checked. Each element is one chain of fused multiply-adds in `k` order (its bits
/// depend only on its own row of A and column of B).
#[allow(clippy::too_many_arguments)]
fn microkernel(
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    epi: Epilogue,
) -> Result<(), String> {
    if k == 0 {
        // An empty sum: C = 0 (Store) or unchanged (Add).
        match epi {
            Epilogue::Store => {
                for r in 0..MR {
                    c[r * ldc..r * ldc + NR].fill(0.0);
                }
            }
            Epilogue::Add => {}
            Epilogue::Bias(_) | Epilogue::RowBias(_) => {
                return Err("attention microkernel: no bias epilogue".into())
            }
        }
        return Ok(());
    }
    if a.len() < (MR - 1) * lda + k || b.len() < (k - 1) * ldb + NR || c.len() < (MR - 1) * ldc + NR
    {
        return Err(format!("attention microkernel operands too small (k {k})"));
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the extents were checked above; the CPU by the caller (available()).
        unsafe {
            super::gemm512::microkernel(
                k,
                a.as_ptr(),
                lda,
                b.as_ptr(),
                ldb,
                c.as_mut_ptr(),
                ldc,
                epi,
            )
        };
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    Err("fused attention needs x86-64".into())
}

/// `x[..n] = exp(x - max x[..n])`, `x[n..] = 0`; returns the sum of the exponentials (NaN when
/// the visible scores hold NaN).
///
/// # Safety
/// The CPU must have FMA and AVX-512F or AVX2 ([`available`]).
unsafe fn exp_row(x: &mut [f32], n: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if super::gemm512::x86::wide() {
            avx512::exp_row(x, n)
        } else {
            avx2::exp_row(x, n)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, n);
        f32::NAN
    }
}

/// Cephes exp (the constants of `super::simd::exp_f32`) with fused multiply-adds on one vector
/// of lanes, written once for the AVX-512 and the AVX2 build: each expands it over the short
/// names its module imports (`min`, `max`, `mul`, `fmadd`, `fnmadd`, `add`, `set1`: `_mm512_*` in
/// `avx512`, `_mm256_*` in `avx2`), so an expansion is that build's intrinsics in the order
/// written here. `fma_exp_lanes!(x, round, |y, n| scale)`: `round` is the build's
/// round-to-nearest of `x log2 e`, `scale` its `y * 2^n`. NaN stays NaN.
#[cfg(target_arch = "x86_64")]
macro_rules! fma_exp_lanes {
    ($x:expr, $round:ident, |$y:ident, $n:ident| $scale:expr) => {{
        let x = min(set1(88.0), $x);
        let x = max(set1(-87.336_55), x);
        let $n = $round::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(mul(
            x,
            set1(std::f32::consts::LOG2_E),
        ));
        let r = fnmadd($n, set1(0.693_359_4), x);
        let r = fnmadd($n, set1(-2.121_944_4e-4), r);
        let mut p = fmadd(set1(1.987_569_1e-4), r, set1(1.398_199_9e-3));
        p = fmadd(p, r, set1(8.333_452e-3));
        p = fmadd(p, r, set1(4.166_579_6e-2));
        p = fmadd(p, r, set1(1.666_666_5e-1));
        p = fmadd(p, r, set1(0.5));
        let $y = add(fmadd(p, mul(r, r), r), set1(1.0));
        $scale
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    #![allow(unsafe_op_in_unsafe_fn)]
    use std::arch::x86_64::*;
    // The names `fma_exp_lanes!` uses: this build's intrinsics.
    use std::arch::x86_64::{
        _mm512_add_ps as add, _mm512_fmadd_ps as fmadd, _mm512_fnmadd_ps as fnmadd,
        _mm512_max_ps as max, _mm512_min_ps as min, _mm512_mul_ps as mul, _mm512_set1_ps as set1,
    };

    /// `fma_exp_lanes!` on 16 lanes, `2^n` by `vscalefps`.
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    unsafe fn exp16(x: __m512) -> __m512 {
        fma_exp_lanes!(x, _mm512_roundscale_ps, |y, n| _mm512_scalef_ps(y, n))
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn exp_row(x: &mut [f32], n: usize) -> f32 {
        let p = x.as_mut_ptr();
        let full = n / 16 * 16;
        let tail: __mmask16 = ((1u32 << (n - full)) - 1) as __mmask16;
        // Maximum over the visible keys; `vmaxps` keeps the running maximum when a score is NaN
        // (the NaN then reaches every exponential through `x - max`).
        let mut mv = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < full {
            mv = _mm512_max_ps(_mm512_loadu_ps(p.add(i)), mv);
            i += 16;
        }
        if tail != 0 {
            let xv = _mm512_mask_loadu_ps(mv, tail, p.add(full));
            mv = _mm512_max_ps(xv, mv);
        }
        let m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < full {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), m));
            _mm512_storeu_ps(p.add(i), e);
            acc = _mm512_add_ps(acc, e);
            i += 16;
        }
        if tail != 0 {
            let xv = _mm512_maskz_loadu_ps(tail, p.add(full));
            let e = _mm512_maskz_mov_ps(tail, exp16(_mm512_sub_ps(xv, m)));
            _mm512_mask_storeu_ps(p.add(full), tail, e);
            acc = _mm512_add_ps(acc, e);
        }
        // Masked and padding keys.
        x[n..].fill(0.0);
        _mm512_reduce_add_ps(acc)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    #![allow(unsafe_op_in_unsafe_fn)]
    use std::arch::x86_64::*;
    // The names `fma_exp_lanes!` uses: this build's intrinsics.
    use std::arch::x86_64::{
        _mm256_add_ps as add, _mm256_fmadd_ps as fmadd, _mm256_fnmadd_ps as fnmadd,
        _mm256_max_ps as max, _mm256_min_ps as min, _mm256_mul_ps as mul, _mm256_set1_ps as set1,
    };

    /// `fma_exp_lanes!` on 8 lanes (the operations of `avx512::exp16` lane by lane), `2^n` built
    /// in the exponent bits (after the clamps `n` is in -126..=127, so `2^n` is a normal float
    /// and `y * 2^n` rounds as `vscalefps` does).
    #[target_feature(enable = "avx,avx2,fma")]
    #[inline]
    unsafe fn exp8(x: __m256) -> __m256 {
        fma_exp_lanes!(x, _mm256_round_ps, |y, n| {
            let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                23,
            ));
            _mm256_mul_ps(y, pow2)
        })
    }

    /// `avx512::exp_row` on AVX2: 16 keys a step as two 8-lane halves, so every lane sums the keys the
    /// 16-lane build's lane does, in the same order; the lanes are then added by halving (8 + 8,
    /// 4 + 4, 2 + 2, 1 + 1). The tail goes through a 16-value buffer (the keys past `n` are not
    /// in the maximum and add 0).
    #[target_feature(enable = "avx,avx2,fma")]
    pub unsafe fn exp_row(x: &mut [f32], n: usize) -> f32 {
        let p = x.as_mut_ptr();
        let full = n / 16 * 16;
        let rest = n - full;
        let mut tail = [f32::NEG_INFINITY; 16];
        tail[..rest].copy_from_slice(&x[full..n]);
        let t = tail.as_mut_ptr();
        // Maximum over the visible keys (`vmaxps` keeps the running maximum when a score is NaN).
        let mut m0 = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut m1 = m0;
        let mut i = 0;
        while i < full {
            m0 = _mm256_max_ps(_mm256_loadu_ps(p.add(i)), m0);
            m1 = _mm256_max_ps(_mm256_loadu_ps(p.add(i + 8)), m1);
            i += 16;
        }
        if rest != 0 {
            m0 = _mm256_max_ps(_mm256_loadu_ps(t), m0);
            m1 = _mm256_max_ps(_mm256_loadu_ps(t.add(8)), m1);
        }
        let mut lanes = [0f32; 16];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m0);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), m1);
        let m = _mm256_set1_ps(lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)));
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i < full {
            let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m));
            let e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), m));
            _mm256_storeu_ps(p.add(i), e0);
            _mm256_storeu_ps(p.add(i + 8), e1);
            a0 = _mm256_add_ps(a0, e0);
            a1 = _mm256_add_ps(a1, e1);
            i += 16;
        }
        if rest != 0 {
            let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(t), m));
            let e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(t.add(8)), m));
            _mm256_storeu_ps(t, e0);
            _mm256_storeu_ps(t.add(8), e1);
            // exp(-inf - max) is 0 for the padding (and NaN stays in the visible keys).
            tail[rest..].fill(0.0);
            x[full..n].copy_from_slice(&tail[..rest]);
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(tail.as_ptr()));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(tail.as_ptr().add(8)));
        }
        // Masked and padding keys.
        x[n..].fill(0.0);
        let s8 = _mm256_add_ps(a0, a1);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0x55>(s2, s2));
        _mm_cvtss_f32(s1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::{bits, noise as data};

    /// Head-major q, k, v noise for `(h, t, s, d)` from seeds `seed`, `seed + 1`, `seed + 2`.
    fn qkv((h, t, s, d): (usize, usize, usize, usize), seed: u32) -> [Vec<f32>; 3] {
        [
            data(h * t * d, seed, 4.0),
            data(h * s * d, seed + 1, 4.0),
            data(h * s * NR, seed + 2, 2.0),
        ]
    }

    /// The head-major call on `[q, k, v]` of `(h, t, s, d)`.
    fn head_major<'a>(
        [q, k, v]: [&'a [f32]; 3],
        (h, t, s, d): (usize, usize, usize, usize),
        scale: f32,
        causal: bool,
    ) -> Call<'a> {
        Call {
            q,
            k,
            v,
            h,
            t,
            s,
            d,
            scale,
            causal,
            token_major: false,
        }
    }

    /// Softmax attention in f64, the definition: `(context [H, T, NR], probs [H, T, S])`.
    fn reference(c: &Call) -> (Vec<f64>, Vec<f64>) {
        let Call { h, t, s, d, .. } = *c;
        let mut out = vec![0f64; h * t * NR];
        let mut probs = vec![0f64; h * t * s];
        for hi in 0..h {
            for ti in 0..t {
                let n = if c.causal { s - t + ti + 1 } else { s };
                let q = &c.q[(hi * t + ti) * d..(hi * t + ti + 1) * d];
                let sc: Vec<f64> = (0..n)
                    .map(|j| {
                        let k = &c.k[(hi * s + j) * d..(hi * s + j + 1) * d];
                        q.iter()
                            .zip(k)
                            .map(|(&a, &b)| (a * c.scale) as f64 * b as f64)
                            .sum()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    let p = ej / z;
                    probs[(hi * t + ti) * s + j] = p;
                    for (o, &vv) in out[(hi * t + ti) * NR..(hi * t + ti + 1) * NR]
                        .iter_mut()
                        .zip(&c.v[(hi * s + j) * NR..(hi * s + j + 1) * NR])
                    {
                        *o += p * vv as f64;
                    }
                }
            }
        }
        (out, probs)
    }

    fn run(c: &Call, parallel: bool, with_probs: bool) -> (Vec<f32>, Vec<f32>) {
        let mut out = vec![f32::NAN; c.h * c.t * NR];
        let mut probs = vec![f32::NAN; if with_probs { c.h * c.t * c.s } else { 0 }];
        let p = with_probs.then_some(&mut probs[..]);
        attention_with(c, &mut out, p, parallel).expect("fused attention");
        (out, probs)
    }

    /// Shapes around the tiles: rows not a multiple of the microtile or the block, keys not a
    /// multiple of 16 or of the panel, head_dim not 64, causal with past keys.
    #[test]
    fn matches_the_f64_definition() {
        if !xray_core::testing::require_cpu(&["avx2", "fma"]) {
            return;
        }
        for &(h, t, s, d, causal) in &[
            (2usize, 50usize, 77usize, 64usize, false),
            (1, 7, 7, 40, true),
            (3, 61, 130, 64, true),
            (1, 1, 1500, 64, false),
            (2, 100, 64, 16, false),
        ] {
            let [q, k, v] = qkv((h, t, s, d), 1);
            let c = head_major([&q, &k, &v], (h, t, s, d), (d as f32).powf(-0.5), causal);
            let (want_o, want_p) = reference(&c);
            for with_probs in [false, true] {
                let (o, p) = run(&c, true, with_probs);
                for (i, (&a, &b)) in o.iter().zip(&want_o).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 2e-6 * (1.0 + b.abs()),
                        "{h}x{t}x{s}x{d} causal {causal}: context {i}: {a} vs {b}"
                    );
                }
                if with_probs {
                    for (i, (&a, &b)) in p.iter().zip(&want_p).enumerate() {
                        assert!(
                            (a as f64 - b).abs() <= 1e-6 * (1.0 + b),
                            "{h}x{t}x{s}x{d} causal {causal}: prob {i}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    /// Every row is computed alone: the same bits on the pool or serially, and whatever query
    /// rows are computed with it (a row alone == that row of the whole block).
    #[test]
    fn bits_do_not_depend_on_the_split() {
        if !xray_core::testing::require_cpu(&["avx2", "fma"]) {
            return;
        }
        let (h, t, s, d) = (3usize, 100usize, 130usize, 64usize);
        let [q, k, v] = qkv((h, t, s, d), 4);
        let c = head_major([&q, &k, &v], (h, t, s, d), 0.125, false);
        let (par_o, par_p) = run(&c, true, true);
        let (ser_o, ser_p) = run(&c, false, true);
        assert_eq!(bits(&par_o), bits(&ser_o));
        assert_eq!(bits(&par_p), bits(&ser_p));
        let (par_o, _) = run(&c, true, false);
        let (ser_o, _) = run(&c, false, false);
        assert_eq!(bits(&par_o), bits(&ser_o));
        for ti in [0usize, 47, 48, 99] {
            let qi = &q[(2 * t + ti) * d..(2 * t + ti + 1) * d];
            let one = Call {
                q: qi,
                k: &k[2 * s * d..],
                v: &v[2 * s * NR..],
                h: 1,
                t: 1,
                ..c
            };
            let (o1, _) = run(&one, false, false);
            assert_eq!(
                bits(&o1),
                bits(&par_o[(2 * t + ti) * NR..(2 * t + ti + 1) * NR]),
                "row {ti}"
            );
        }
    }

    /// A NaN query gives a NaN row (probabilities, masked keys included, and context), as
    /// torch's softmax does; the other rows stay finite.
    #[test]
    fn nan_query_gives_a_nan_row() {
        if !xray_core::testing::require_cpu(&["avx2", "fma"]) {
            return;
        }
        let (h, t, s, d) = (1usize, 9usize, 20usize, 64usize);
        let mut q = data(h * t * d, 7, 1.0);
        q[3 * d + 5] = f32::NAN;
        let (k, v) = (data(h * s * d, 8, 1.0), data(h * s * NR, 9, 1.0));
        for causal in [false, true] {
            let c = head_major([&q, &k, &v], (h, t, s, d), 0.125, causal);
            let (o, p) = run(&c, false, true);
            for ti in 0..t {
                let (orow, prow) = (&o[ti * NR..(ti + 1) * NR], &p[ti * s..(ti + 1) * s]);
                if ti == 3 {
                    assert!(prow.iter().all(|x| x.is_nan()), "causal {causal}: {prow:?}");
                    assert!(orow.iter().all(|x| x.is_nan()));
                } else {
                    assert!(prow.iter().all(|x| x.is_finite()));
                    assert!((prow.iter().sum::<f32>() - 1.0).abs() < 1e-5);
                    assert!(orow.iter().all(|x| x.is_finite()));
                }
            }
        }
    }

    /// `[H, R, W]` head-major to `[R, H * W]` token-major.
    fn to_token_major(x: &[f32], h: usize, r: usize, w: usize) -> Vec<f32> {
        let mut y = vec![0f32; x.len()];
        for hi in 0..h {
            for ri in 0..r {
                y[ri * h * w + hi * w..ri * h * w + (hi + 1) * w]
                    .copy_from_slice(&x[(hi * r + ri) * w..(hi * r + ri + 1) * w]);
            }
        }
        y
    }

    /// Token-major operands (the encoder's projections as they are) give the head-major call's
    /// context bits, merged, and the same probabilities.
    #[test]
    fn token_major_is_the_merged_head_major_result() {
        if !xray_core::testing::require_cpu(&["avx2", "fma"]) {
            return;
        }
        for &(h, t, s, d, causal) in &[
            (3usize, 100usize, 130usize, 64usize, false),
            (2, 61, 77, 64, true),
        ] {
            let [q, k, v] = qkv((h, t, s, d), 10);
            let hm = head_major([&q, &k, &v], (h, t, s, d), 0.125, causal);
            let (qt, kt, vt) = (
                to_token_major(&q, h, t, d),
                to_token_major(&k, h, s, d),
                to_token_major(&v, h, s, NR),
            );
            let tm = Call {
                q: &qt,
                k: &kt,
                v: &vt,
                token_major: true,
                ..hm
            };
            let (ho, hp) = run(&hm, true, true);
            let (to, tp) = run(&tm, true, true);
            assert_eq!(
                bits(&to),
                bits(&to_token_major(&ho, h, t, NR)),
                "{h}x{t}x{s}"
            );
            assert_eq!(bits(&tp), bits(&hp));
        }
    }
}
