//! f32 kernels, each an implementation of [`crate::graph::Kernel`].
//!
//! Two matmul strategies exist and each op says which one it uses ([`MatmulStrategy`]):
//! `gemm` (matrixmultiply's packed sgemm, fast for many rows: the encoder, conv, the one-off
//! cross-K/V projection) and `row_stable` (every output element is one fixed-order dot product, so
//! a row's result does not depend on how many rows are computed with it: the decoder, where the
//! full-window formula must equal incremental decode bit for bit, and where a decode step is a
//! GEMV that streams the weights once instead of packing them).
//!
//! Threads: [`threads`] (env `XRAY_THREADS`, default: available cores). Work is split into
//! contiguous ranges of independent outputs, so results never depend on the thread count.

pub mod activation;
pub mod add;
pub mod attention;
pub mod conv1d;
pub mod embedding;
pub mod gelu;
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
    /// Packed, blocked sgemm (matrixmultiply). Fast for many rows; a row's rounding may depend on
    /// the blocking, so results are only reproducible for the same shapes.
    Gemm,
    /// One fixed-order dot product per output element: a row's result is the same whatever the
    /// number of rows computed with it (M = 1 decode step == row of an M = T full window).
    RowStable,
}

/// Worker threads for the runtime's kernels: env `XRAY_THREADS` if set to a positive integer,
/// else the available cores. Read once per process. When `XRAY_THREADS` is set and
/// `MATMUL_NUM_THREADS` is not, matrixmultiply's sgemm is given the same count (see
/// [`init_threads`]).
pub fn threads() -> usize {
    static T: OnceLock<usize> = OnceLock::new();
    *T.get_or_init(|| {
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

/// Make matrixmultiply's sgemm use [`threads`] threads. It reads `MATMUL_NUM_THREADS` once, on its
/// first call, so this must run before any sgemm; model loaders call it. Only sets the variable
/// when `XRAY_THREADS` is set and `MATMUL_NUM_THREADS` is not (an explicit setting wins).
pub fn init_threads() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("XRAY_THREADS").is_some()
            && std::env::var_os("MATMUL_NUM_THREADS").is_none()
        {
            // Why set_var: matrixmultiply has no API for its thread count. This runs once, at
            // model load, before the first sgemm reads the variable.
            std::env::set_var("MATMUL_NUM_THREADS", threads().to_string());
        }
    });
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

/// `C[m, n] = beta * C + A · B` with arbitrary strides (matrixmultiply sgemm). The caller has
/// checked that every index stays inside the slices; this re-checks the extents and refuses.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
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
    // SAFETY: every element address touched by sgemm is below the extents checked above.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            rsc as isize,
            csc as isize,
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

/// Build an output tensor from a shape and a buffer.
pub(crate) fn tensor(shape: &[usize], v: Vec<f32>) -> Result<crate::graph::Tensor, String> {
    ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), v).map_err(|e| e.to_string())
}
