//! The clean-run corpus (issue 10): the clean runtime against the HF reference over every
//! (model, clip) pair of `fixtures/build/corpus/` that fits gives zero divergences, and on the
//! real tiny.en zero token mismatches.
//!
//! One process, one oracle: each model is loaded once and every clip runs through
//! [`check_corpus`] (what `xray check --evidence-dir` runs), so a pair costs a fraction of a
//! separate `xray check`. That process is a child of the test binary, started for this test alone
//! ([`common::own_process`]): the embedded interpreter never starts in the process the other
//! modules' tests share. Margins are `xray_compare::corpus::margins`, as in summary.json.
//!
//! - `cargo test` (and `make test`): the random-init fixtures (whisper-rand-a, whisper-rand-b,
//!   granite-nar-tiny), every clip that fits.
//! - `XRAY_CORPUS=full` (`make corpus`): also the real Whisper tiny.en.
//! - `XRAY_CORPUS_TABLE=FILE`: writes the table (pairs run, worst margin per metric and family).
//!
//! The margin of a checkpoint is `metric / tolerance` for each criterion that decides it
//! (`rel_l2 / max_rel_l2`, outlier fraction / `max_outlier_fraction`, `kl_max / max_kl` on
//! logits): a pass needs every margin `<= 1`, and the worst margin says how close the clean runtime
//! comes to a false alarm.
//!
//! Without the corpus (no `make fixtures`) the test is skipped, unless `XRAY_REQUIRE_FIXTURES` is
//! set, as in the other fixture tests.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use xray_compare::corpus::{margins, Margin};
use xray_compare::evidence::{CheckpointEvidence, Verdict};
use xray_harness::check::{check_corpus, CheckOptions};

use crate::common;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One clip of `corpus.json`.
#[derive(Debug, Clone, serde::Deserialize)]
struct Clip {
    file: String,
    seconds: f64,
    effect: String,
}

/// Results of one model over the corpus.
#[derive(Debug, Default)]
struct FamilyResult {
    pairs: usize,
    skipped: usize,
    checkpoints: usize,
    seconds: f64,
    failures: Vec<String>,
    token_mismatches: Vec<String>,
    /// Worst margin per criterion (`xray_compare::corpus::margins`), with its clip.
    worst: BTreeMap<String, (String, Margin)>,
}

fn offer(r: &mut FamilyResult, clip: &str, c: &CheckpointEvidence) {
    for m in margins(c) {
        let w = r
            .worst
            .entry(m.criterion.clone())
            .or_insert_with(|| (clip.to_string(), m.clone()));
        if m.margin > w.1.margin {
            *w = (clip.to_string(), m);
        }
    }
}

/// Longest clip (seconds) a model takes: Whisper's window is `max_source_positions` encoder
/// positions of two 10 ms mel frames; Granite NAR has no window.
fn window_seconds(model_dir: &Path) -> f64 {
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(model_dir.join("config.json")).expect("config.json"),
    )
    .expect("config.json parses");
    match cfg["max_source_positions"].as_u64() {
        Some(p) => p as f64 * 2.0 * 0.01,
        None => f64::INFINITY,
    }
}

fn run_model(name: &str, dir: &Path, clips: &[Clip], corpus: &Path) -> FamilyResult {
    let t0 = Instant::now();
    let window = window_seconds(dir);
    let mut r = FamilyResult::default();
    let (fit, skip): (Vec<&Clip>, Vec<&Clip>) = clips.iter().partition(|c| c.seconds <= window);
    r.skipped = skip.len();
    let paths: Vec<PathBuf> = fit.iter().map(|c| corpus.join(&c.file)).collect();
    let opts = CheckOptions {
        model: dir.to_path_buf(),
        ..Default::default()
    };
    check_corpus(&opts, &paths, &|_| {}, None, &mut |path, out, _| {
        let clip = fit
            .iter()
            .find(|c| corpus.join(&c.file) == path)
            .expect("a clip of the corpus");
        let out = out
            .unwrap_or_else(|e| panic!("{name} on {}: {e:#}", clip.file))
            .expect("no clip is kept without --resume");
        let ev = &out.evidence;
        r.pairs += 1;
        r.checkpoints += ev.checkpoints.len();
        for c in &ev.checkpoints {
            offer(&mut r, &clip.file, c);
            if c.status != xray_compare::localize::Status::Pass {
                r.failures.push(format!(
                    "{name} on {} ({}): {}@step{} {:?}",
                    clip.file, clip.effect, c.name, c.step, c.status
                ));
            }
        }
        if ev.verdict != Verdict::Pass && ev.checkpoints.iter().all(|c| c.metrics.is_some()) {
            r.failures.push(format!(
                "{name} on {}: verdict {:?} (capture neutral {:?})",
                clip.file, ev.verdict, ev.capture_neutral
            ));
        }
        if let Some(t) = &ev.transcript {
            if !t.tokens_equal {
                r.token_mismatches.push(format!(
                    "{name} on {}: reference {:?} runtime {:?}",
                    clip.file, t.reference, t.runtime
                ));
            }
        }
        eprintln!(
            "corpus: {name} {} ({:.1} s, {}): {:?}",
            clip.file, clip.seconds, clip.effect, ev.verdict
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    r.seconds = t0.elapsed().as_secs_f64();
    r
}

fn table(results: &[(String, FamilyResult)]) -> String {
    let mut s = String::from(
        "| model | pairs | skipped (too long) | checkpoints | divergent | token mismatches | time |\n|---|---|---|---|---|---|---|\n",
    );
    for (name, r) in results {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {:.0} s |",
            r.pairs,
            r.skipped,
            r.checkpoints,
            r.failures.len(),
            r.token_mismatches.len(),
            r.seconds
        );
    }
    s.push_str("\n| model | criterion | worst margin | value | tolerance | where |\n|---|---|---|---|---|---|\n");
    for (name, r) in results {
        for (k, (clip, w)) in &r.worst {
            let _ = writeln!(
                s,
                "| {name} | {k} | {:.3} | {:.3e} | {:.1e} | {clip}: {} |",
                w.margin, w.value, w.bound, w.checkpoint
            );
        }
    }
    s
}

#[test]
fn clean_runtime_passes_the_whole_corpus() {
    let root = root();
    let corpus = root.join("fixtures/build/corpus");
    let manifest = corpus.join("corpus.json");
    if xray_core::testing::require_fixture(&manifest).is_none() {
        return;
    }
    // The interpreter, torch and the runtime start in this process (check_corpus): in a child
    // process of its own, not beside the tests that spawn `xray` (common::own_process says why).
    if !common::own_process() {
        return;
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).expect("corpus.json"))
            .expect("corpus.json parses");
    let clips: Vec<Clip> = serde_json::from_value(v["clips"].clone()).expect("clips");
    assert!(clips.len() >= 30, "{} clips", clips.len());
    let full = std::env::var("XRAY_CORPUS").is_ok_and(|v| v == "full");
    let mut models = vec![
        ("whisper-rand-a", root.join("fixtures/build/whisper-rand-a")),
        ("whisper-rand-b", root.join("fixtures/build/whisper-rand-b")),
        (
            "granite-nar-tiny",
            root.join("fixtures/build/granite-nar-tiny"),
        ),
    ];
    if full {
        models.push(("whisper-tiny-en", root.join("fixtures/whisper-tiny-en")));
    }
    let mut results = Vec::new();
    for (name, dir) in models {
        results.push((name.to_string(), run_model(name, &dir, &clips, &corpus)));
    }
    let t = table(&results);
    eprintln!("{t}");
    if let Ok(p) = std::env::var("XRAY_CORPUS_TABLE") {
        let p = root.join(p);
        std::fs::write(&p, &t).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        eprintln!("corpus table: {}", p.display());
    }
    let failures: Vec<&String> = results.iter().flat_map(|(_, r)| &r.failures).collect();
    assert!(
        failures.is_empty(),
        "divergences on the clean runtime:\n{failures:#?}"
    );
    let tiny: Vec<&String> = results
        .iter()
        .filter(|(n, _)| n == "whisper-tiny-en")
        .flat_map(|(_, r)| &r.token_mismatches)
        .collect();
    assert!(tiny.is_empty(), "token mismatches on tiny.en:\n{tiny:#?}");
    assert!(results.iter().all(|(_, r)| r.pairs > 0));
}
