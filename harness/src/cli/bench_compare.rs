//! `xray bench-compare [--elements N] [--iterations K]`: comparison throughput on one core.

use std::process::ExitCode;

use anyhow::bail;
use xray_compare::metrics::bench;

/// Arguments of `xray bench-compare`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// f32 elements per tensor.
    #[arg(long, default_value_t = 16 << 20)]
    pub elements: usize,
    /// Timed iterations (the best one is reported).
    #[arg(long, default_value_t = 5)]
    pub iterations: usize,
}

/// Runs the benchmark and prints GB/s.
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if a.elements == 0 || a.elements > 1 << 31 {
        bail!("--elements must be in 1..=2^31");
    }
    let r = bench::run(a.elements, a.iterations);
    super::say(&format!(
        "compare: {} f32 pairs, best of {}: {:.3} ms, {:.2} GB/s of pair data (8 B/pair), {:.2} GB/s of one side, {:.0} M pairs/s\n",
        r.elements,
        r.iterations,
        r.best_seconds * 1e3,
        r.gbps_pairs,
        r.gbps_one_side,
        r.elements as f64 / r.best_seconds / 1e6
    ))?;
    let shape = [6, 1500, 64];
    super::say(&format!(
        "explain (signature search) on a noisy {shape:?} tensor: {:.1} ms\n",
        1e3 * bench::explain_seconds(&shape)
    ))?;
    Ok(ExitCode::SUCCESS)
}
