//! This core's f32 FMA ceiling: 12 independent 8-lane (AVX2) or 16-lane (AVX-512) fused
//! multiply-add chains, enough to cover the FMA latency on every x86 core X-Ray runs on, timed
//! over 400 M lane-FMAs, best of five. The ceiling the encoder's GFLOP/s is read against
//! (docs/performance.md). Run one copy per core to see two cores:
//! `cargo run --release -p xray-runtime --example fma_peak`.

// The intrinsics are unsafe; each build is called only after its CPU feature is detected.
#![allow(unsafe_code)]

/// `$name(n)`: seconds for `n` rounds of 12 independent FMAs on the build's vector type, written
/// once over the short names each build imports (`set1`, `zero`, `fmadd`).
#[cfg(target_arch = "x86_64")]
macro_rules! fma_rounds {
    ($name:ident, $features:literal) => {
        #[target_feature(enable = $features)]
        pub unsafe fn $name(n: u64) -> f64 {
            let (x, y) = (set1(0.999_999), set1(1e-7));
            let mut a = [zero(); 12];
            for (i, v) in a.iter_mut().enumerate() {
                *v = set1(i as f32);
            }
            let t = std::time::Instant::now();
            for _ in 0..n {
                for v in a.iter_mut() {
                    *v = fmadd(*v, x, y);
                }
            }
            let s = t.elapsed().as_secs_f64();
            std::hint::black_box(a);
            s
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        _mm256_fmadd_ps as fmadd, _mm256_set1_ps as set1, _mm256_setzero_ps as zero,
    };
    fma_rounds!(rounds, "avx,avx2,fma");
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::{
        _mm512_fmadd_ps as fmadd, _mm512_set1_ps as set1, _mm512_setzero_ps as zero,
    };
    fma_rounds!(rounds, "avx512f,fma");
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let lane_fmas: u64 = 400_000_000;
    let best = |lanes: u64, run: &dyn Fn(u64) -> f64| {
        let n = lane_fmas / (12 * lanes);
        let s = (0..5).map(|_| run(n)).fold(f64::INFINITY, f64::min);
        (n * 12 * lanes * 2) as f64 / s / 1e9
    };
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the features were detected above.
        let g = best(8, &|n| unsafe { avx2::rounds(n) });
        println!("f32 FMA peak, one core, AVX2 (8 lanes): {g:.1} GFLOP/s");
    }
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was detected above.
        let g = best(16, &|n| unsafe { avx512::rounds(n) });
        println!("f32 FMA peak, one core, AVX-512 (16 lanes): {g:.1} GFLOP/s");
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("fma_peak measures x86-64 cores only");
}
