//! Time the Whisper encoder formula (log-mel -> memory) and a greedy decode, wall and on-CPU
//! (a profiling aid, not a test): `cargo run --release -p xray-runtime --example encoder_time --
//! MODEL_DIR WAV [reps]` (env XRAY_THREADS). On-CPU time is the process's (getrusage-like, from
//! /proc/self/stat), meaningful as a cost measure on a shared machine.

use std::path::Path;
use std::time::Instant;

use xray_runtime::audio::load_wav;
use xray_runtime::graph::RunCtx;
use xray_runtime::models::whisper::WhisperModel;

/// utime + stime of this process in seconds (/proc/self/stat, clock ticks of 1/100 s).
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = WhisperModel::load(Path::new(&args[1])).expect("model");
    let audio = load_wav(Path::new(&args[2]), 16000).expect("wav");
    let reps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10);
    let n = audio.samples.len().min(480_000);
    let mel = model
        .log_mel(&audio.samples[..n], &mut RunCtx::default())
        .expect("mel");
    model
        .encode_mel(mel.clone(), &mut RunCtx::default())
        .expect("warm-up");
    let (mut wall, mut cpu) = (vec![], vec![]);
    let (w0, c0) = (Instant::now(), cpu_s());
    for _ in 0..reps {
        let t0 = Instant::now();
        let m = model
            .encode_mel(mel.clone(), &mut RunCtx::default())
            .expect("encode");
        wall.push(t0.elapsed().as_secs_f64());
        std::hint::black_box(m);
    }
    cpu.push((cpu_s() - c0) / reps as f64);
    let total = w0.elapsed().as_secs_f64() / reps as f64;
    wall.sort_by(f64::total_cmp);
    println!(
        "encoder: wall min {:.1} median {:.1} mean {:.1} ms; on-CPU (all threads) mean {:.1} ms",
        wall[0] * 1e3,
        wall[wall.len() / 2] * 1e3,
        total * 1e3,
        cpu[0] * 1e3
    );
}
