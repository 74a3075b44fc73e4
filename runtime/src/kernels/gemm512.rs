//! The `gemm` strategy's linear on AVX-512: `y[m, n] = x[m, k] W[n, k]^T + b` with W packed per
//! call into panels of [`NR`] output columns (`[k, NR]` each, zero-padded), and a register-tiled
//! [`MR`] x [`NR`] microkernel (24 accumulators, four 16-lane loads of the panel and six
//! broadcasts of x per step). Work is split into tasks of (panel, [`ROWS_PER_TASK`] rows) across
//! the kernels' pool.
//!
//! Each output element is `((b + s_0) + s_1) + ...`, `s_i` the fused multiply-add chain over the
//! `i`-th block of [`KC`] inputs started from zero: the order depends only on `k`, never on the
//! number of rows, the task split or the thread count, so the bits do not either (a row alone
//! equals the same row among many). Blocked, the chains are shorter than one chain over `k` (less
//! rounding on fc2's 1536-long sums), and a block of the panel (`KC x NR`, 32 KB) stays in L1
//! while the task's microtiles pass over it.
//!
//! Why not the `gemm` crate here: on an Intel Xeon (AVX-512) it ran the encoder's 1500 x 384 x 384
//! projections at 55-65 GFLOP/s where this kernel runs them at ~150 (docs/performance.md).
#![allow(unsafe_code)]

/// Rows of one microtile.
pub(crate) const MR: usize = 6;
/// Columns of one microtile and of one packed panel (four 16-lane registers).
pub(crate) const NR: usize = 64;
/// Inputs per summation block (and per L1-resident block of a panel).
const KC: usize = 128;
/// Rows per task (a multiple of [`MR`]).
const ROWS_PER_TASK: usize = 8 * MR;

/// Whether the packed GEMM ([`linear`], [`gemm`]) runs here: x86-64 with AVX-512F and FMA. On an
/// AVX2 CPU the linears and convolutions keep the `gemm` crate, which measured faster there
/// (AMD EPYC Zen 3: 180 GFLOP/s against this kernel's 154 on the encoder's projections,
/// docs/performance.md); the fused attention takes the microkernel on either ([`tile_available`]).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::wide()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether [`microkernel`] runs here: x86-64 with FMA and AVX-512F or AVX2 (its two builds
/// compute the same fused multiply-add chains: the same bits on either).
pub(crate) fn tile_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::wide() || x86::narrow()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// What the microkernel does with its `MR x NR` sums `s` at the end.
#[derive(Clone, Copy)]
pub(crate) enum Epilogue {
    /// `C = s`.
    Store,
    /// `C = C + s`.
    Add,
    /// `C = bias + s` (bias: `NR` values, one per column).
    Bias(*const f32),
    /// `C = bias + s` (bias: [`MR`] values, one per row).
    RowBias(*const f32),
}

/// The output's base pointer, shared by the tasks: each writes only its own (rows, panel) block.
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (see `linear`); the pointer outlives them.
unsafe impl Sync for OutPtr {}

/// A GEMM's bias: none, one per output column (a linear's), or one per output row (a
/// channel-major convolution's).
#[derive(Clone, Copy)]
pub(crate) enum Bias<'a> {
    None,
    Cols(&'a [f32]),
    Rows(&'a [f32]),
}

/// `y = x W^T (+ b)`: x `[m, k]`, w `[n, k]`, b `[n]`, all row-major and contiguous. The caller
/// has checked [`available`]; the sizes are checked here.
pub(crate) fn linear(
    m: usize,
    k: usize,
    n: usize,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Result<Vec<f32>, String> {
    if w.len() != n * k {
        return Err(format!("linear {m}x{k}x{n}: weight size does not fit"));
    }
    // Column j of panel p is W's row p * NR + j, transposed 16 inputs at a time (a 16 x NR block
    // of the panel stays in L1 while the rows are read: half the time of one row at a time).
    let pack = |p: usize, dst: &mut [f32]| {
        for k0 in (0..k).step_by(16) {
            let kn = 16.min(k - k0);
            for j in 0..NR.min(n - p * NR) {
                let src = &w[(p * NR + j) * k + k0..(p * NR + j) * k + k0 + kn];
                for (i, &v) in src.iter().enumerate() {
                    dst[(k0 + i) * NR + j] = v;
                }
            }
        }
    };
    gemm(m, k, n, x, pack, bias.map_or(Bias::None, Bias::Cols))
}

/// `y = a B (+ bias)`: a `[m, k]` row-major and contiguous, B `[k, n]` given by `pack(p, dst)`,
/// which writes B's columns `p * NR ..` into the zeroed panel `dst` (`[k, NR]`, element
/// `(kk, j)` at `kk * NR + j`, columns past `n` left zero). Returns `y` `[m, n]` row-major.
pub(crate) fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    pack: impl Fn(usize, &mut [f32]) + Sync,
    bias: Bias,
) -> Result<Vec<f32>, String> {
    let fits = match bias {
        Bias::None => true,
        Bias::Cols(b) => b.len() == n,
        Bias::Rows(b) => b.len() == m,
    };
    if a.len() != m * k || !fits {
        return Err(format!("gemm {m}x{k}x{n}: operand sizes do not fit"));
    }
    if !available() {
        return Err("the packed GEMM needs AVX-512F and FMA".into());
    }
    if m == 0 || n == 0 || k == 0 {
        let mut y = vec![0f32; m * n];
        for (i, row) in y.chunks_exact_mut(n.max(1)).enumerate() {
            match bias {
                Bias::None => {}
                Bias::Cols(b) => row.copy_from_slice(b),
                Bias::Rows(b) => row.fill(b[i]),
            }
        }
        return Ok(y);
    }
    let np = n.div_ceil(NR);
    // The panels: `[np, k, NR]`.
    let mut wp = vec![0f32; np * k * NR];
    // A column bias padded to whole panels.
    let mut bp = vec![0f32; if let Bias::Cols(_) = bias { np * NR } else { 0 }];
    if let Bias::Cols(b) = bias {
        bp[..n].copy_from_slice(b);
    }
    let groups = m.div_ceil(ROWS_PER_TASK);
    // The output is written through `out` without a zero fill first: every element is stored by
    // its tile's first block (a microtile's epilogue or a partial tile's copy) before any read.
    let mut y: Vec<f32> = Vec::with_capacity(m * n);
    let out = OutPtr(y.as_mut_ptr());
    let run = |task: usize, wp: &[f32]| {
        let (p, g) = (task % np, task / np);
        let r0 = g * ROWS_PER_TASK;
        let r1 = (r0 + ROWS_PER_TASK).min(m);
        let tb = match bias {
            Bias::None => TileBias::None,
            Bias::Cols(_) => TileBias::Cols(&bp[p * NR..(p + 1) * NR]),
            Bias::Rows(b) => TileBias::Rows(b),
        };
        tile_rows(
            k,
            a,
            r0,
            r1,
            &wp[p * k * NR..(p + 1) * k * NR],
            tb,
            p * NR,
            NR.min(n - p * NR),
            n,
            &out,
        );
    };
    let work = m.saturating_mul(k).saturating_mul(n);
    match super::pool().filter(|_| super::threads() > 1 && work >= super::GEMM_PAR_MIN_WORK) {
        Some(pool) => pool.install(|| {
            use rayon::prelude::*;
            wp.par_chunks_mut(k * NR)
                .enumerate()
                .for_each(|(p, dst)| pack(p, dst));
            let wp = &wp;
            (0..np * groups)
                .into_par_iter()
                .with_max_len(1)
                .for_each(|t| run(t, wp));
        }),
        None => {
            for (p, dst) in wp.chunks_mut(k * NR).enumerate() {
                pack(p, dst);
            }
            (0..np * groups).for_each(|t| run(t, &wp));
        }
    }
    // SAFETY: the tasks cover every (row group, panel) block, and each stored all of its
    // elements (see above); the capacity is m * n.
    unsafe { y.set_len(m * n) };
    Ok(y)
}

/// The bias one task's tiles add: its panel's `NR` column values, or every row's value.
#[derive(Clone, Copy)]
enum TileBias<'a> {
    None,
    Cols(&'a [f32]),
    Rows(&'a [f32]),
}

/// Rows `r0..r1` of one panel's `cols` output columns (starting at column `c0` of the `ldy`-wide
/// output): whole microtiles in place, a last partial one (fewer than [`MR`] rows, or a partial
/// panel) through a padded copy, with the same order of operations.
#[allow(clippy::too_many_arguments)]
fn tile_rows(
    k: usize,
    x: &[f32],
    r0: usize,
    r1: usize,
    panel: &[f32],
    bias: TileBias,
    c0: usize,
    cols: usize,
    ldy: usize,
    out: &OutPtr,
) {
    // The first block's epilogue for the microtile at row t0 (`rb`: that tile's row biases).
    let first = |t0: usize, rb: &[f32]| match bias {
        TileBias::None => Epilogue::Store,
        TileBias::Cols(b) => Epilogue::Bias(b.as_ptr()),
        TileBias::Rows(_) => Epilogue::RowBias(rb[t0..].as_ptr()),
    };
    let row_bias: &[f32] = match bias {
        TileBias::Rows(b) => b,
        _ => &[],
    };
    let full = if cols == NR { (r1 - r0) / MR * MR } else { 0 };
    for k0 in (0..k).step_by(KC) {
        let kn = KC.min(k - k0);
        for t0 in (r0..r0 + full).step_by(MR) {
            let epi = if k0 == 0 {
                first(t0, row_bias)
            } else {
                Epilogue::Add
            };
            // SAFETY: rows t0..t0 + MR < m of x (k values each, from k0 + kn <= k), the panel's
            // rows k0..k0 + kn, output rows t0..t0 + MR, columns c0..c0 + NR <= ldy, and a row
            // bias's t0..t0 + MR <= m: all in bounds (m * k, k * NR, m * ldy, m). This task alone
            // writes that output block.
            unsafe {
                microkernel(
                    kn,
                    x.as_ptr().add(t0 * k + k0),
                    k,
                    panel.as_ptr().add(k0 * NR),
                    NR,
                    out.0.add(t0 * ldy + c0),
                    ldy,
                    epi,
                )
            };
        }
    }
    // The rest: padded rows in a scratch tile, one microtile at a time.
    let mut t0 = r0 + full;
    while t0 < r1 {
        let rows = MR.min(r1 - t0);
        let mut a = vec![0f32; MR * k];
        a[..rows * k].copy_from_slice(&x[t0 * k..(t0 + rows) * k]);
        let mut rb = [0f32; MR];
        if let TileBias::Rows(b) = bias {
            rb[..rows].copy_from_slice(&b[t0..t0 + rows]);
        }
        let mut c = [0f32; MR * NR];
        for k0 in (0..k).step_by(KC) {
            let kn = KC.min(k - k0);
            let epi = if k0 == 0 {
                first(0, &rb)
            } else {
                Epilogue::Add
            };
            // SAFETY: `a` holds MR rows of k, the panel k rows of NR, `c` MR rows of NR, `rb` MR.
            unsafe {
                microkernel(
                    kn,
                    a.as_ptr().add(k0),
                    k,
                    panel.as_ptr().add(k0 * NR),
                    NR,
                    c.as_mut_ptr(),
                    NR,
                    epi,
                )
            };
        }
        for (i, src) in c.chunks_exact(NR).take(rows).enumerate() {
            // SAFETY: row t0 + i < m, columns c0..c0 + cols <= ldy; this task's block (written
            // through the pointer: it may not be initialised yet).
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), out.0.add((t0 + i) * ldy + c0), cols)
            };
        }
        t0 += rows;
    }
}

/// `C[MR x NR] (epilogue) A[MR x k] B[k x NR]`: A's rows `lda` apart, B's rows `ldb` apart (NR
/// contiguous values each), C's rows `ldc` apart. Each sum is one chain of fused multiply-adds in
/// `k` order from zero (its bits depend only on its own row of A and column of B, and not on the
/// build: the AVX-512 one holds the tile in 24 16-lane registers, the AVX2 one passes over it as
/// four `MR x 16` strips of 12 8-lane registers, each lane the same chain).
///
/// # Safety
/// [`tile_available`] must hold; `a + (MR - 1) * lda + k`, `b + (k - 1) * ldb + NR` and
/// `c + (MR - 1) * ldc + NR` (and a bias's `NR` values) must be in bounds, `k >= 1`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn microkernel(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    epi: Epilogue,
) {
    #[cfg(target_arch = "x86_64")]
    if x86::wide() {
        x86::avx512::microkernel(k, a, lda, b, ldb, c, ldc, epi)
    } else {
        x86::avx2::microkernel(k, a, lda, b, ldb, c, ldc, epi)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, a, lda, b, ldb, c, ldc, epi);
        unreachable!("available() is false off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{Epilogue, MR, NR};

    /// AVX-512F and FMA: the 16-lane build.
    pub(crate) fn wide() -> bool {
        static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *F.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"))
    }

    /// AVX2 and FMA: the 8-lane build.
    pub(crate) fn narrow() -> bool {
        static F: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *F.get_or_init(|| {
            is_x86_feature_detected!("avx")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
        })
    }

    /// [`super::microkernel`], written once for both builds: each module expands it over the
    /// short names it imports (`setzero`, `loadu`, `set1`, `fmadd`, `add`, `storeu`: `_mm512_*` in
    /// `avx512`, `_mm256_*` in `avx2`), so an expansion is that build's intrinsics in the order
    /// written here, under the build's `#[target_feature]`. `microkernel!(#[target_feature(..)]
    /// lanes = W, strip = S, regs = [0, 1, ..])`: `pub unsafe fn microkernel` passing over the tile
    /// as `NR / S` strips of `S` columns, each with its `MR x S / W` accumulators of `W` lanes in
    /// registers over the whole `k` (the panel's `S` columns read as `S / W` loads per input,
    /// `regs` their indices), then the epilogue.
    macro_rules! microkernel {
        (#[$feature:meta] lanes = $w:literal, strip = $s:literal, regs = [$($j:literal),+]) => {
            #[$feature]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn microkernel(
                k: usize,
                a: *const f32,
                lda: usize,
                b: *const f32,
                ldb: usize,
                c: *mut f32,
                ldc: usize,
                epi: Epilogue,
            ) {
                for strip in 0..NR / $s {
                    let mut acc = [[setzero(); $s / $w]; MR];
                    let mut ap = a;
                    let mut bp = b.add($s * strip);
                    for _ in 0..k {
                        let bv = [$(loadu(bp.add($w * $j))),+];
                        for (r, acc_r) in acc.iter_mut().enumerate() {
                            let av = set1(*ap.add(r * lda));
                            $(acc_r[$j] = fmadd(av, bv[$j], acc_r[$j]);)+
                        }
                        ap = ap.add(1);
                        bp = bp.add(ldb);
                    }
                    for (r, acc_r) in acc.iter().enumerate() {
                        for (j, v) in acc_r.iter().enumerate() {
                            let col = $s * strip + $w * j;
                            let dst = c.add(r * ldc + col);
                            let v = match epi {
                                Epilogue::Store => *v,
                                Epilogue::Add => add(loadu(dst), *v),
                                Epilogue::Bias(bias) => add(loadu(bias.add(col)), *v),
                                Epilogue::RowBias(bias) => add(set1(*bias.add(r)), *v),
                            };
                            storeu(dst, v);
                        }
                    }
                }
            }
        };
    }

    /// The 16-lane build: the whole tile in 24 registers (one strip, four loads per input).
    pub(crate) mod avx512 {
        #![allow(unsafe_op_in_unsafe_fn)]
        use super::{Epilogue, MR, NR};
        use std::arch::x86_64::{
            _mm512_add_ps as add, _mm512_fmadd_ps as fmadd, _mm512_loadu_ps as loadu,
            _mm512_set1_ps as set1, _mm512_setzero_ps as setzero, _mm512_storeu_ps as storeu,
        };
        microkernel! {
            #[target_feature(enable = "avx512f,fma")] lanes = 16, strip = 64, regs = [0, 1, 2, 3]
        }
    }

    /// The 8-lane build: the tile as four `MR x 16` strips, each with its 12 accumulators in
    /// registers over the whole `k` (AVX2 has 16), the panel's 16 columns read as two loads per
    /// input.
    pub(crate) mod avx2 {
        #![allow(unsafe_op_in_unsafe_fn)]
        use super::{Epilogue, MR, NR};
        use std::arch::x86_64::{
            _mm256_add_ps as add, _mm256_fmadd_ps as fmadd, _mm256_loadu_ps as loadu,
            _mm256_set1_ps as set1, _mm256_setzero_ps as setzero, _mm256_storeu_ps as storeu,
        };
        microkernel! {
            #[target_feature(enable = "avx,avx2,fma")] lanes = 8, strip = 16, regs = [0, 1]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        crate::kernels::noise(n, seed, 1.0)
    }

    /// Against an f64 reference, on shapes around the tiles (rows not a multiple of the microtile
    /// or the task, columns not a multiple of the panel, k across summation blocks); and a row
    /// alone equals the same row among many, bit for bit.
    #[test]
    fn matches_f64_and_rows_are_independent() {
        if !xray_core::testing::require_cpu(&["avx512f", "fma"]) {
            return;
        }
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 130, 65),
            (49, 384, 384),
            (100, 300, 130),
            (13, 1536, 64),
        ] {
            let x = data(m * k, 1);
            let w = data(n * k, 2);
            let b = data(n, 3);
            let y = linear(m, k, n, &x, &w, Some(&b)).expect("linear");
            for i in 0..m {
                for j in 0..n {
                    let r: f64 = b[j] as f64
                        + (0..k)
                            .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                            .sum::<f64>();
                    let got = y[i * n + j] as f64;
                    assert!(
                        (got - r).abs() <= 1e-5 * (1.0 + r.abs()),
                        "{m}x{k}x{n} [{i},{j}]: {got} vs {r}"
                    );
                }
            }
            let last = m - 1;
            let alone = linear(1, k, n, &x[last * k..], &w, Some(&b)).expect("linear");
            assert_eq!(
                alone,
                y[last * n..].to_vec(),
                "{m}x{k}x{n}: a row alone differs"
            );
            let nobias = linear(m, k, n, &x, &w, None).expect("linear");
            assert!(nobias
                .iter()
                .zip(&y)
                .zip(b.iter().cycle())
                .all(|((a, c), bb)| (c - a - bb).abs() < 1e-5));
        }
    }

    /// The AVX2 build of the microkernel gives the AVX-512 build's bits, every epilogue (runs
    /// where the CPU has both).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn both_builds_give_the_same_bits() {
        if !xray_core::testing::require_cpu(&["avx512f", "avx2", "fma"]) {
            return;
        }
        let k = 300;
        let a = data(MR * k, 4);
        let b = data(k * NR, 5);
        let bias = data(NR, 6);
        let rows = data(MR, 7);
        for epi in [
            Epilogue::Store,
            Epilogue::Add,
            Epilogue::Bias(bias.as_ptr()),
            Epilogue::RowBias(rows.as_ptr()),
        ] {
            let mut wide = data(MR * NR, 8);
            let mut narrow = wide.clone();
            // SAFETY: the CPU has both (checked above); a holds MR rows of k, b k rows of NR, the
            // outputs MR rows of NR, the biases NR and MR values.
            unsafe {
                x86::avx512::microkernel(
                    k,
                    a.as_ptr(),
                    k,
                    b.as_ptr(),
                    NR,
                    wide.as_mut_ptr(),
                    NR,
                    epi,
                );
                x86::avx2::microkernel(
                    k,
                    a.as_ptr(),
                    k,
                    b.as_ptr(),
                    NR,
                    narrow.as_mut_ptr(),
                    NR,
                    epi,
                );
            }
            assert!(
                wide.iter()
                    .zip(&narrow)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "the two builds differ"
            );
        }
    }
}
