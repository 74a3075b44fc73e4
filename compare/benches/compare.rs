//! Comparison throughput benchmark (`cargo bench -p xray --bench compare`): plain `std::time`,
//! one thread, prints GB/s for several tensor sizes.

use xray_compare::metrics::bench;

fn main() {
    for &n in &[1usize << 16, 1 << 20, 1 << 24] {
        let r = bench::run(n, if n < 1 << 20 { 200 } else { 10 });
        println!(
            "{:>9} f32 pairs: best {:>9.3} ms  {:>6.2} GB/s pair data  {:>6.2} GB/s one side",
            r.elements,
            r.best_seconds * 1e3,
            r.gbps_pairs,
            r.gbps_one_side
        );
    }
}
