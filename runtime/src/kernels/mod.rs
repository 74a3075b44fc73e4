//! f32 kernels, each an implementation of [`crate::graph::Kernel`].
//!
//! Two matmul strategies exist and each op says which one it uses ([`MatmulStrategy`]):
//! `gemm` (fast for many rows: the encoder, conv, the one-off cross-K/V projection; on AVX-512 the
//! packed 6 x 64 microkernel of `gemm512`, elsewhere the `gemm` crate's packed sgemm) and `row_stable` (every output element is one fixed-order dot product, so
//! a row's result does not depend on how many rows are computed with it: the decoder, where the
//! full-window formula must equal incremental decode bit for bit, and where a decode step is a
//! GEMV that streams the weights once instead of packing them).
//!
//! Threads: [`threads`] (env `XRAY_THREADS` or [`set_threads`], default: available cores), one
//! rayon pool for everything: the kernels' own splits and the gemm crate's (which runs its
//! parallel loops on the current rayon pool; [`sgemm`] enters this pool first). Work is split into
//! ranges of independent outputs (the GEMM's k blocking does not depend on the thread count), so
//! results never depend on the thread count.

pub mod activation;
pub mod add;
pub mod attention;
pub mod conv1d;
pub mod embedding;
pub(crate) mod flash;
pub mod gelu;
pub(crate) mod gemm512;
pub mod gqa;
pub mod kv_append;
pub mod layer_norm;
pub mod layout;
pub mod linear;
pub mod log_mel;
pub(crate) mod simd;

use std::sync::OnceLock;

pub use add::{Add, AddTable};
pub use attention::Attention;
pub use conv1d::Conv1d;
pub use embedding::Embedding;
pub use gelu::Gelu;
pub use kv_append::KvAppend;
pub use layer_norm::LayerNorm;
pub use layout::{ChannelToToken, MergeHeads, SplitHeads};
pub use linear::Linear;
pub use log_mel::LogMel;

use crate::graph::{Dim, Shape};

/// How a matmul-shaped kernel computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatmulStrategy {
    /// Packed, blocked GEMM (`gemm512` on AVX-512, else the `gemm` crate). Fast for many rows;
    /// with the `gemm` crate a row's rounding may depend on the blocking, so results are only
    /// reproducible for the same shapes (`gemm512`'s depend on `k` only).
    Gemm,
    /// One fixed-order dot product per output element: a row's result is the same whatever the
    /// number of rows computed with it (M = 1 decode step == row of an M = T full window).
    RowStable,
}

static THREADS: OnceLock<usize> = OnceLock::new();

/// Worker threads for the runtime's kernels: the count given to [`set_threads`], else env
/// `XRAY_THREADS` if set to a positive integer, else the available cores. Fixed at the first call.
pub fn threads() -> usize {
    keep_freed_buffers();
    *THREADS.get_or_init(|| {
        std::env::var("XRAY_THREADS")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
    })
}

/// Have the allocator keep freed blocks for reuse (once per process; glibc on Linux only).
///
/// Every op allocates its outputs and the executor frees them after their last reader: megabytes
/// per op (a tiny.en encoder fc1 output is 9 MB). glibc serves blocks above its mmap threshold
/// (128 KB to 32 MB, adaptive) with fresh `mmap`s and returns freed heap tops above its trim
/// threshold to the kernel, so each op paid a page fault per 4 KB page it wrote (a sixth of a
/// one-thread tiny.en encoder). With the threshold at its 32 MB maximum and trimming off, freed
/// op buffers are reused by the next ops and runs; the process keeps its high-water heap.
fn keep_freed_buffers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        #[allow(unsafe_code)]
        // SAFETY: mallopt only changes glibc's malloc tuning parameters; it is thread-safe and
        // valid at any time (blocks already allocated are unaffected).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    });
}

/// Fix the kernels' thread count (a CLI `--threads`). It must come before the first kernel runs
/// (the pool is built once); an error when `n` is 0 or a different count is already in use.
pub fn set_threads(n: usize) -> Result<(), String> {
    if n == 0 {
        return Err("the thread count must be at least 1".into());
    }
    let got = *THREADS.get_or_init(|| n);
    if got != n {
        return Err(format!(
            "the kernels already run with {got} threads (set before the first run)"
        ));
    }
    Ok(())
}

/// Below this many multiply-adds an op runs on the calling thread.
pub(crate) const PAR_MIN_WORK: usize = 1 << 16;

/// Work chunks per thread in [`par_ranges`] / [`par_rows`] (dynamic balance).
const CHUNKS_PER_THREAD: usize = 4;

/// The kernels' thread pool ([`threads`] workers), separate from rayon's global pool.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static P: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    P.get_or_init(|| {
        let n = threads();
        if n <= 1 {
            return None;
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("xray-kernel-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Run `f` on a worker of the kernels' pool (or here when there is no pool). A formula runs this
/// way: its parallel ops then split work from inside the pool (work stealing), instead of each op
/// handing a job to the pool from outside and sleeping until it is done, which costs a thread
/// wake-up round trip per op (tens of microseconds, comparable to a decode-step projection).
pub(crate) fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// Run `f(range)` over `0..n` split into contiguous ranges, a few per thread of the pool (when
/// `n * cost_per_item` is large enough). Returns the per-range results in range order. Each range
/// is computed whole by one thread, so results do not depend on scheduling.
pub(crate) fn par_ranges<R: Send>(
    n: usize,
    cost_per_item: usize,
    f: impl Fn(std::ops::Range<usize>) -> R + Sync + Send,
) -> Vec<R> {
    use rayon::prelude::*;
    let nt = threads().min(n.max(1));
    let Some(pool) = pool().filter(|_| nt > 1 && n.saturating_mul(cost_per_item) >= PAR_MIN_WORK)
    else {
        return vec![f(0..n)];
    };
    // A few chunks per thread: a thread that loses its core to another process does not hold
    // the op back (the others take its remaining chunks).
    let parts = (nt * CHUNKS_PER_THREAD).min(n);
    let chunk = n.div_ceil(parts);
    let ranges: Vec<std::ops::Range<usize>> = (0..n.div_ceil(chunk))
        .map(|i| (i * chunk)..((i + 1) * chunk).min(n))
        .collect();
    pool.install(|| ranges.into_par_iter().with_max_len(1).map(&f).collect())
}

/// Run `f(first_row, rows)` over a row-major buffer split into contiguous groups of rows of
/// `row_len`, a few per thread of the pool (when the work is large enough).
pub(crate) fn par_rows(
    out: &mut [f32],
    row_len: usize,
    cost_per_row: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    use rayon::prelude::*;
    let n = out.len().checked_div(row_len).unwrap_or(0);
    let nt = threads().min(n.max(1));
    let Some(pool) = pool().filter(|_| nt > 1 && n.saturating_mul(cost_per_row) >= PAR_MIN_WORK)
    else {
        f(0, out);
        return;
    };
    let rows_per = n.div_ceil(nt * CHUNKS_PER_THREAD);
    pool.install(|| {
        out.par_chunks_mut(rows_per * row_len)
            .with_max_len(1)
            .enumerate()
            .for_each(|(i, c)| f(i * rows_per, c))
    });
}

/// How [`par_init_rows`] fills each row of a fresh buffer.
pub(crate) enum RowInit<'a> {
    /// Every row is a copy of this slice (a linear's bias rows).
    Repeat(&'a [f32]),
    /// Row `r` is `v[r]` in every element (a channel-major bias).
    Splat(&'a [f32]),
}

/// A fresh `rows x row_len` buffer filled as `init` says, the rows split across the pool like
/// [`par_rows`] (no zero fill first: each element is written once). The callers have checked
/// the lengths; the asserts guard the unchecked length set at the end.
#[allow(unsafe_code)] // writes into the spare capacity, then sets the length it filled.
pub(crate) fn par_init_rows(rows: usize, row_len: usize, init: RowInit<'_>) -> Vec<f32> {
    use std::mem::MaybeUninit;
    let len = rows * row_len;
    let mut y: Vec<f32> = Vec::with_capacity(len);
    let fill = |r0: usize, part: &mut [MaybeUninit<f32>]| {
        for (i, row) in part.chunks_exact_mut(row_len).enumerate() {
            match init {
                RowInit::Repeat(v) => {
                    for (o, &x) in row.iter_mut().zip(v) {
                        o.write(x);
                    }
                }
                RowInit::Splat(v) => {
                    let x = v[r0 + i];
                    for o in row.iter_mut() {
                        o.write(x);
                    }
                }
            }
        }
    };
    if let RowInit::Repeat(v) = init {
        assert_eq!(v.len(), row_len, "a repeated row must be row_len long");
    }
    if let RowInit::Splat(v) = init {
        assert!(v.len() >= rows, "a splat needs one value per row");
    }
    if row_len > 0 {
        let spare = &mut y.spare_capacity_mut()[..len];
        let nt = threads().min(rows.max(1));
        match pool().filter(|_| nt > 1 && len >= PAR_MIN_WORK * 4) {
            Some(pool) => {
                use rayon::prelude::*;
                let rows_per = rows.div_ceil(nt * CHUNKS_PER_THREAD);
                pool.install(|| {
                    spare
                        .par_chunks_mut(rows_per * row_len)
                        .with_max_len(1)
                        .enumerate()
                        .for_each(|(i, c)| fill(i * rows_per, c))
                });
            }
            None => fill(0, spare),
        }
    }
    // SAFETY: `fill` wrote every element of the first `len` (whole rows of `row_len`; the
    // asserts above make every write in bounds of its source).
    unsafe { y.set_len(len) };
    y
}

/// `f(a[i], b[i])` of two equal-length slices into a fresh vector, in chunks across the pool
/// (elementwise: any split gives the same bits; no copy of `a` first).
#[allow(unsafe_code)] // writes into the spare capacity, then sets the length it filled.
pub(crate) fn par_zip_map(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    use std::mem::MaybeUninit;
    const CHUNK: usize = 1 << 14;
    let n = a.len().min(b.len());
    let mut y: Vec<f32> = Vec::with_capacity(n);
    let fill = |i: usize, dst: &mut [MaybeUninit<f32>]| {
        let (a, b) = (&a[i * CHUNK..], &b[i * CHUNK..]);
        for ((o, &x), &z) in dst.iter_mut().zip(a).zip(b) {
            o.write(f(x, z));
        }
    };
    let spare = &mut y.spare_capacity_mut()[..n];
    match pool().filter(|_| threads() > 1 && n >= PAR_MIN_WORK * 4) {
        Some(pool) => {
            use rayon::prelude::*;
            pool.install(|| {
                spare
                    .par_chunks_mut(CHUNK)
                    .enumerate()
                    .for_each(|(i, c)| fill(i, c))
            });
        }
        None => {
            for (i, c) in spare.chunks_mut(CHUNK).enumerate() {
                fill(i, c);
            }
        }
    }
    // SAFETY: every chunk of the first `n` elements was written by `fill` (a and b hold at
    // least `n` values).
    unsafe { y.set_len(n) };
    y
}

/// The SIMD level the runtime's own kernels dispatch to on this CPU: "avx512" (AVX-512F + FMA:
/// the fused attention, the GEMV and elementwise kernels' widest builds), "avx2" (AVX2 + FMA), or
/// "scalar".
pub fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = std::arch::is_x86_feature_detected!("fma");
        if fma && std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if fma && std::arch::is_x86_feature_detected!("avx2") {
            return "avx2";
        }
    }
    "scalar"
}

/// The GEMM path the encoder's linears and convolutions take on this CPU (the fused attention
/// takes the same microkernel where it runs: [`flash`]).
pub fn gemm_path() -> &'static str {
    match isa() {
        "avx512" => "linear and conv: packed 6x64 microkernel, AVX-512 build (kernels::gemm512)",
        "avx2" => "linear and conv: gemm crate 0.19, AVX2 + FMA (x86-v3) kernels; attention: packed 6x64 microkernel, AVX2 build (kernels::gemm512)",
        _ => "gemm crate 0.19, portable kernels",
    }
}

/// The body of [`Kernel::with_param_fault`](crate::graph::Kernel::with_param_fault) for an
/// attention kernel (a `Clone` struct with `scale: f32` and `causal: bool` fields), written once:
/// [`ParamFault::AttnScale`](crate::faults::ParamFault::AttnScale) replaces the scale ("replaced
/// by this factor"), [`ParamFault::Causal`](crate::faults::ParamFault::Causal) the causal flag,
/// each further `pattern => field: value` seam its field; any other fault is `None`.
macro_rules! attention_faults {
    ($self:ident, $fault:expr $(, $pat:pat => $field:ident: $val:expr)* $(,)?) => {
        match $fault {
            $crate::faults::ParamFault::AttnScale(f) => Some(Box::new(Self {
                scale: *f,
                ..$self.clone()
            })),
            $crate::faults::ParamFault::Causal(c) => Some(Box::new(Self {
                causal: *c,
                ..$self.clone()
            })),
            $($pat => Some(Box::new(Self {
                $field: $val,
                ..$self.clone()
            })),)*
            _ => None,
        }
    };
}
pub(crate) use attention_faults;

/// Below this many multiply-adds a GEMM runs on one thread.
const GEMM_PAR_MIN_WORK: usize = 1 << 20;

/// `C[m, n] = beta * C + A · B` with arbitrary strides (the gemm crate's sgemm), split across the
/// kernels' pool when large. The caller has checked that every index stays inside the slices;
/// this re-checks the extents and refuses.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    sa: (usize, usize),
    b: &[f32],
    sb: (usize, usize),
    beta: f32,
    c: &mut [f32],
    sc: (usize, usize),
) -> Result<(), String> {
    let par = threads() > 1 && m.saturating_mul(k).saturating_mul(n) >= GEMM_PAR_MIN_WORK;
    if par {
        in_pool(|| sgemm_with(m, k, n, a, sa, b, sb, beta, c, sc, threads()))
    } else {
        sgemm_with(m, k, n, a, sa, b, sb, beta, c, sc, 1)
    }
}

/// [`sgemm`] on `nthreads` threads of the gemm crate (1: on the calling thread, for callers that
/// split the work themselves).
#[allow(clippy::too_many_arguments)]
#[allow(unsafe_code)] // gemm::gemm takes raw pointers; the extents are checked first.
pub(crate) fn sgemm_with(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: &mut [f32],
    (rsc, csc): (usize, usize),
    nthreads: usize,
) -> Result<(), String> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let last = |r: usize, rs: usize, cc: usize, cs: usize| {
        (r.saturating_sub(1)) * rs + (cc.saturating_sub(1)) * cs
    };
    if k > 0 && (last(m, rsa, k, csa) >= a.len() || last(k, rsb, n, csb) >= b.len()) {
        return Err(format!("sgemm operands too small for {m}x{k}x{n}"));
    }
    if last(m, rsc, n, csc) >= c.len() {
        return Err(format!("sgemm output too small for {m}x{n}"));
    }
    if k == 0 {
        // An empty sum: C = beta * C (the gemm crate is not asked about k = 0).
        for i in 0..m {
            for j in 0..n {
                let v = &mut c[i * rsc + j * csc];
                *v = if beta == 0.0 { 0.0 } else { beta * *v };
            }
        }
        return Ok(());
    }
    let isz = |x: usize| x as isize;
    let par = if nthreads > 1 {
        gemm::Parallelism::Rayon(nthreads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: every element address touched is below the extents checked above; the gemm crate
    // computes dst = alpha * dst + beta * lhs · rhs (dst read only when read_dst), so C's old
    // value is scaled by the caller's `beta` (`alpha` here) and the product by 1.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            isz(csc),
            isz(rsc),
            beta != 0.0,
            a.as_ptr(),
            isz(csa),
            isz(rsa),
            b.as_ptr(),
            isz(csb),
            isz(rsb),
            beta,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}

/// A fixed dim or an error naming what was expected.
pub(crate) fn fixed(d: &Dim, what: &str) -> Result<usize, String> {
    match d {
        Dim::Fixed(n) => Ok(*n),
        Dim::Sym(s) => Err(format!(
            "{what} must be fixed by the config, got symbol '{s}'"
        )),
    }
}

/// Check an input's rank.
pub(crate) fn rank(s: &Shape, r: usize, what: &str) -> Result<(), String> {
    if s.len() != r {
        return Err(format!(
            "{what} must have rank {r}, got {}",
            crate::graph::fmt_shape(s)
        ));
    }
    Ok(())
}

/// Dims must agree (equal symbols or equal numbers).
pub(crate) fn same_dim(a: &Dim, b: &Dim, what: &str) -> Result<(), String> {
    if a != b {
        return Err(format!("{what}: {a} != {b}"));
    }
    Ok(())
}

/// Shape of a run-time tensor, as a Vec, checked for rank.
pub(crate) fn dims(t: &crate::graph::Tensor, r: usize, what: &str) -> Result<Vec<usize>, String> {
    if t.ndim() != r {
        return Err(format!(
            "{what} must have rank {r}, got shape {:?}",
            t.shape()
        ));
    }
    Ok(t.shape().to_vec())
}

/// Contiguous data of a tensor (tensors are stored in standard layout by the executor).
pub(crate) fn data<'a>(t: &'a crate::graph::Tensor, what: &str) -> Result<&'a [f32], String> {
    t.as_slice()
        .ok_or_else(|| format!("{what} is not contiguous"))
}

/// The weight roles of an op whose bias is optional: `weight`, then `bias` when it has one.
pub(crate) fn weight_roles_with_bias(bias: bool) -> Vec<&'static str> {
    if bias {
        vec!["weight", "bias"]
    } else {
        vec!["weight"]
    }
}

/// The bias weight's declared shape (`weights[1]`) is `[n]`, one per output feature.
pub(crate) fn bias_shape(weights: &[Vec<usize>], n: usize) -> Result<(), String> {
    if weights[1] != [n] {
        return Err(format!("bias must be [{n}], got {:?}", weights[1]));
    }
    Ok(())
}

/// The bias weight's values (`weights[1]`): `n` of them, one per output feature.
pub(crate) fn bias<'a>(
    weights: &[&'a crate::graph::Tensor],
    n: usize,
) -> Result<&'a [f32], String> {
    let b = data(weights[1], "bias")?;
    if b.len() != n {
        return Err(format!("bias has {} elements, expected {n}", b.len()));
    }
    Ok(b)
}

/// Build an output tensor from a shape and a buffer.
pub(crate) fn tensor(shape: &[usize], v: Vec<f32>) -> Result<crate::graph::Tensor, String> {
    ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), v).map_err(|e| e.to_string())
}

/// The bits of each value (the kernels' tests compare results bit for bit).
#[cfg(test)]
pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The kernels' test data: `n` values of a xorshift32 stream from `seed`, spread over
/// `[-amp / 2, amp / 2]`, the same on every machine.
#[cfg(test)]
pub(crate) fn noise(n: usize, seed: u32, amp: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32 - 0.5) * amp
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{par_init_rows, RowInit};

    /// Every element written, in its row, at sizes below and above the parallel threshold.
    #[test]
    fn par_init_rows_fills_every_row() {
        for (rows, len) in [(0usize, 5usize), (3, 7), (1500, 384), (384, 3000)] {
            let rep: Vec<f32> = (0..len).map(|i| i as f32 + 0.5).collect();
            let got = par_init_rows(rows, len, RowInit::Repeat(&rep));
            assert_eq!(got.len(), rows * len);
            assert!(
                got.chunks_exact(len).all(|r| r == rep.as_slice()),
                "repeat {rows}x{len}"
            );
            let col: Vec<f32> = (0..rows).map(|r| -(r as f32)).collect();
            let got = par_init_rows(rows, len, RowInit::Splat(&col));
            for (r, row) in got.chunks_exact(len).enumerate() {
                assert!(
                    row.iter().all(|&v| v == col[r]),
                    "splat {rows}x{len} row {r}"
                );
            }
        }
    }
}
