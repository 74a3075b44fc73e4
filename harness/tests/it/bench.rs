//! `xray bench` end to end on the small random-init fixture: every anchor key the issue names is in
//! the JSON, the thread count given is the one used, and an absent CTranslate2 anchor is reported
//! with its reason (null ratios), never silently dropped. No timing is asserted (only that the
//! measurements exist and are positive).

use crate::common;
use common::{FOX, RAND};

use common::{code, stderr, xray};

fn ready() -> bool {
    common::ready(&["fixtures/build/whisper-rand-a/config.json"])
}

fn positive(v: &serde_json::Value, key: &str) -> f64 {
    let x = v
        .pointer(key)
        .and_then(|x| x.as_f64())
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v:#}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    x
}

/// `xray bench --model RAND --audio FOX --reps 1 --threads 1 --json EXTRA..`: exit 0 asserted,
/// the process output and its JSON.
fn bench(extra: &[&str]) -> (std::process::Output, serde_json::Value) {
    let mut args = vec![
        "bench",
        "--model",
        RAND,
        "--audio",
        FOX,
        "--reps",
        "1",
        "--threads",
        "1",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = xray(&args);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = serde_json::from_slice(&o.stdout).expect("bench JSON");
    (o, v)
}

#[test]
fn bench_json_has_every_anchor_and_says_why_ct2_is_absent() {
    if !ready() {
        return;
    }
    let (o, v) = bench(&[]);
    assert_eq!(v["threads"], 1, "{v:#}");
    assert!(
        v["cpu_model"].as_str().is_some_and(|s| !s.is_empty()),
        "{v:#}"
    );
    for k in [
        "/encoder_ratio",
        "/encoder_ratio_eager",
        "/decode_step_ratio",
        "/encoder_seconds/runtime",
        "/encoder_seconds/torch",
        "/encoder_seconds/torch_eager",
        "/decode_step_seconds/runtime",
        "/decode_step_seconds/torch",
        "/peak_rss_bytes",
    ] {
        positive(&v, k);
    }
    assert!(v["capture_overhead"].is_number(), "{v:#}");
    // Either the ctranslate2 package is absent (CI installs only oracle/requirements.txt) or
    // rand-a has no CTranslate2 conversion with the same weights: both must be said.
    let why = v["ct2_absent"].as_str().unwrap_or_default();
    assert!(why.to_lowercase().contains("ctranslate2"), "{v:#}");
    for k in ["encoder_ratio_ct2", "decode_step_ratio_ct2"] {
        assert!(v.get(k).is_some_and(|x| x.is_null()), "{k}: {v:#}");
    }
    assert!(
        stderr(&o).contains("no CTranslate2 anchor"),
        "{}",
        stderr(&o)
    );
    assert!(
        v["corpus"].is_null(),
        "no --corpus, no corpus timing: {v:#}"
    );
}

/// `--corpus`: one `xray check` process over the clips against one process for the first clip,
/// both timed; the clip count comes from the corpus run's summary.json.
#[test]
fn bench_corpus_times_one_process_against_one_per_clip() {
    if !ready() {
        return;
    }
    let (_, v) = bench(&["--corpus", FOX, "fixtures/audio/weather.wav"]);
    assert_eq!(v["corpus"]["clips"], 2, "{v:#}");
    assert_eq!(v["corpus"]["single_clip"], FOX, "{v:#}");
    for k in [
        "/corpus/single_check_seconds",
        "/corpus/corpus_wall_seconds",
        "/corpus/corpus_per_clip_seconds",
        "/corpus/corpus_load_seconds",
        "/corpus/per_clip_speedup",
    ] {
        positive(&v, k);
    }
    let per = positive(&v, "/corpus/corpus_per_clip_seconds");
    let wall = positive(&v, "/corpus/corpus_wall_seconds");
    assert!((per * 2.0 - wall).abs() < 1e-9 * wall.max(1.0), "{v:#}");
}

#[test]
fn bench_refuses_zero_threads() {
    let o = xray(&["bench", "--model", RAND, "--audio", FOX, "--threads", "0"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}
