//! Time the tiny.en encoder's kernels one by one on random data (a profiling aid, not a test):
//! `cargo run --release -p xray-runtime --example encoder_kernels -- [reps]` (env XRAY_THREADS).

use std::time::Instant;

use xray_runtime::graph::{Kernel, KernelCtx, Tensor};
use xray_runtime::kernels::{Attention, Gelu, Linear, MatmulStrategy};

/// Uniform noise in `[-1, 1)` (the top 24 bits of each word of the tests' xorshift stream).
fn rand_tensor(shape: &[usize], seed: u32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = xray_core::testing::xorshift(seed.into())
        .take(n)
        .map(|w| (w >> 40) as f32 / (1u32 << 23) as f32 - 1.0)
        .collect();
    ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), v).expect("shape")
}

/// On-CPU nanoseconds of the calling thread (/proc/thread-self/schedstat): unaffected by time
/// spent descheduled on a shared machine (single-thread runs only).
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn time(name: &str, reps: usize, k: &dyn Kernel, ins: &[&Tensor], ws: &[&Tensor]) {
    let f16: Vec<Option<&[u16]>> = vec![None; ws.len()];
    let ctx = KernelCtx {
        op: name,
        step: 0,
        weights_f16: &f16,
    };
    let mut best = f64::INFINITY;
    let mut all = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        let c0 = cpu_ns();
        let out = k.run(&ctx, ins, ws).expect("run");
        let dt = if std::env::var("CPU_TIME").is_ok() {
            (cpu_ns() - c0) as f64 * 1e-9
        } else {
            t0.elapsed().as_secs_f64()
        };
        std::hint::black_box(out);
        best = best.min(dt);
        all.push(dt);
    }
    all.sort_by(f64::total_cmp);
    println!(
        "{name:<24} min {:8.3} ms  median {:8.3} ms",
        best * 1e3,
        all[all.len() / 2] * 1e3
    );
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let (t, d, h, ffn) = (1500usize, 384usize, 6usize, 1536usize);
    let hd = d / h;
    let q = rand_tensor(&[h, t, hd], 1);
    let k = rand_tensor(&[h, t, hd], 2);
    let v = rand_tensor(&[h, t, hd], 3);
    let att = Attention::new((hd as f32).powf(-0.5), false, MatmulStrategy::Gemm);
    time("attention 6x1500x64", reps, &att, &[&q, &k, &v], &[]);
    let x = rand_tensor(&[t, d], 4);
    let w1 = rand_tensor(&[ffn, d], 5);
    let b1 = rand_tensor(&[ffn], 6);
    let lin = Linear::new(true, MatmulStrategy::Gemm);
    time("fc1 1500x384->1536", reps, &lin, &[&x], &[&w1, &b1]);
    let wq = rand_tensor(&[d, d], 7);
    let bq = rand_tensor(&[d], 8);
    time("q_proj 1500x384->384", reps, &lin, &[&x], &[&wq, &bq]);
    let x2 = rand_tensor(&[t, ffn], 9);
    let w2 = rand_tensor(&[d, ffn], 10);
    time("fc2 1500x1536->384", reps, &lin, &[&x2], &[&w2, &bq]);
    time("gelu 1500x1536", reps, &Gelu, &[&x2], &[]);
    gelu_small();
}

#[allow(dead_code)]
fn gelu_small() {
    let x = rand_tensor(&[16384], 11);
    let f16: Vec<Option<&[u16]>> = vec![];
    let ctx = KernelCtx {
        op: "g",
        step: 0,
        weights_f16: &f16,
    };
    let mut best = f64::INFINITY;
    for _ in 0..20 {
        let t0 = Instant::now();
        for _ in 0..100 {
            std::hint::black_box(Gelu.run(&ctx, &[&x], &[]).expect("gelu"));
        }
        best = best.min(t0.elapsed().as_secs_f64() / 100.0);
    }
    println!("gelu 16384 in L1: {:.2} ns/element", best * 1e9 / 16384.0);
}
