//! `xray gate` refuses evidence that describes another run than its baseline: another clip or
//! other weights (exit 2 unless `--allow-different-input`), another family or contract (exit 2
//! always). It used to gate them: another clip passed, and Whisper against Granite reported
//! "regressions".

use crate::common;

use std::process::Command;

/// `xray gate --evidence NEW --baseline BASE EXTRA..` from this test's directory: the exit code
/// and stdout then stderr.
fn gate(new: &str, base: &str, extra: &[&str]) -> (i32, String) {
    let args = [&["gate", "--evidence", new, "--baseline", base], extra].concat();
    xray_in(Path::new("."), &args)
}

#[test]
fn gate_refuses_another_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let save = |name: &str, f: &dyn Fn(&mut xray_compare::evidence::Run)| {
        let mut e = common::whisper_evidence(false);
        f(&mut e.run);
        let p = dir.path().join(name);
        e.save(&p).expect("save");
        p.display().to_string()
    };
    let base = save("base.json", &|_| {});
    let same = save("same.json", &|_| {});
    let clip = save("clip.json", &|r| r.audio_sha256 = Some("00".repeat(32)));
    let family = save("family.json", &|r| r.family = "granite_nar".into());
    let old = save("old.json", &|r| r.contract_sha256 = None);

    let (c, out) = gate(&same, &base, &[]);
    assert_eq!(c, 0, "{out}");

    let (c, out) = gate(&clip, &base, &[]);
    assert_eq!(c, 2, "another clip must be refused: {out}");
    assert!(out.contains("audio sha256"), "{out}");
    assert!(out.contains("--allow-different-input"), "{out}");
    assert_eq!(out.lines().count(), 1, "one-line error: {out}");

    let (c, out) = gate(&clip, &base, &["--allow-different-input"]);
    assert_eq!(c, 0, "{out}");
    assert!(
        out.contains("different input (allowed): audio sha256"),
        "{out}"
    );

    for (bad, what) in [(&family, "family"), (&old, "contract")] {
        let (c, out) = gate(bad, &base, &["--allow-different-input"]);
        assert_eq!(c, 2, "{what} mismatch must be refused: {out}");
        assert!(out.contains(what), "{out}");
        assert!(!out.contains("regress"), "{out}");
    }
}

// ----------------------------------------------------------------------------------------------
// Issue 24: summaries, reports and gates derive what they report from the evidence.

use std::path::{Path, PathBuf};

use xray_compare::corpus::{ClipSummary, Summary};
use xray_compare::evidence::{Evidence, Verdict};
use xray_core::testing::strs;

/// `xray ARGS` from `cwd`: exit code and stdout + stderr.
/// [`xray_in`], which must be an input error (exit 2): what it wrote.
fn input_error(cwd: &Path, args: &[&str]) -> String {
    let (c, out) = xray_in(cwd, args);
    assert_eq!(c, 2, "{out}");
    out
}

fn xray_in(cwd: &Path, args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(cwd)
        .env_remove("XRAY_TRACEBACK")
        .args(args)
        .output()
        .expect("run xray");
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// The clean Whisper-shaped evidence of clip `i` (its own audio sha256), of weights `weights`.
fn clip_evidence(i: u32, weights: &str) -> Evidence {
    let mut e = common::whisper_evidence(false);
    e.run.audio_sha256 = Some(format!("{i:064x}"));
    e.run.weights_sha256 = Some(weights.repeat(32));
    e
}

/// A corpus directory as `xray check --evidence-dir` writes it: `CLIP.evidence.json` per clip
/// and summary.json (model path `model`).
fn corpus_dir(dir: &Path, model: &str, clips: &[(&str, &Evidence)]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let rows = clips
        .iter()
        .map(|(name, e)| {
            let file = format!("{name}.evidence.json");
            e.save(&dir.join(&file)).unwrap();
            ClipSummary::of(&format!("audio/{name}.wav"), &file, e, 1.0)
        })
        .collect();
    write_summary(dir, &Summary::new(model, None, Some(1.0), rows));
    dir.to_path_buf()
}

fn write_summary(dir: &Path, s: &Summary) {
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(s).unwrap(),
    )
    .unwrap();
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Item 4: a summary row that claims a pass without evidence, and evidence whose verdict was
/// edited to pass over failing checkpoints, used to summarize as "pass" (and `xray report`
/// printed "✅ pass" above "1 origin, 12 propagated"). Both are refused, exit 2, naming the file.
#[test]
fn summarize_and_report_derive_the_verdict_from_the_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (clip_evidence(1, "ab"), clip_evidence(2, "ab"));
    let dir = corpus_dir(&tmp.path().join("c"), "fx", &[("fox", &a), ("stella", &b)]);
    let (c, out) = xray_in(tmp.path(), &["summarize", "c"]);
    assert_eq!(c, 0, "{out}");
    assert!(out.contains("2 clips: 2 pass"), "{out}");

    // A third row: "pass", no evidence file.
    let mut v = crate::common::read_json(&dir.join("summary.json"));
    let mut row = v["clips"][0].clone();
    row["audio"] = "audio/weather.wav".into();
    row["evidence"] = "".into();
    v["clips"].as_array_mut().unwrap().push(row);
    std::fs::write(dir.join("summary.json"), v.to_string()).unwrap();
    let out = input_error(tmp.path(), &["summarize", "c"]);
    assert!(
        out.contains("c/summary.json") && out.contains("without an evidence file"),
        "{out}"
    );
    assert!(!out.contains("pass;"), "{out}");

    // The verdict of a diverged clip's evidence edited to "pass".
    let mut lying = common::whisper_evidence(true);
    assert_eq!(lying.verdict, Verdict::Diverged);
    lying.verdict = Verdict::Pass;
    lying.run.audio_sha256 = Some(format!("{:064x}", 3));
    let dir = corpus_dir(&tmp.path().join("l"), "fx", &[("fox", &a), ("box", &lying)]);
    let out = input_error(tmp.path(), &["summarize", "l"]);
    assert!(
        out.contains("l/box.evidence.json")
            && out.contains("verdict \"pass\" disagrees with its content (1 origin, 12 propagated"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "one-line error: {out}");
    let ev = dir.join("box.evidence.json");
    for args in [
        vec!["report", s(&ev)],
        vec!["report", s(&ev), "--markdown", "-"],
        vec!["gate", "--evidence", s(&ev), "--baseline", s(&ev)],
        vec!["gate", "--evidence", "l", "--baseline", "l"],
    ] {
        let (c, out) = xray_in(tmp.path(), &args);
        assert_eq!(c, 2, "{args:?}: {out}");
        assert!(
            out.contains("box.evidence.json") && out.contains("disagrees"),
            "{args:?}: {out}"
        );
        assert!(!out.contains("✅"), "{args:?}: {out}");
    }
}

/// Shards `dir/s1` (fox) and `dir/s2` (stella) of one model (weights sha256 `hex` repeated), their
/// `--model` spelled `models.0` and `models.1`.
fn two_shards(dir: &Path, models: (&str, &str), hex: &str) {
    corpus_dir(
        &dir.join("s1"),
        models.0,
        &[("fox", &clip_evidence(1, hex))],
    );
    corpus_dir(
        &dir.join("s2"),
        models.1,
        &[("stella", &clip_evidence(2, hex))],
    );
}

/// Item 5: shards are one corpus when their evidence is of one model (family, weights and
/// contract sha256), not when their `--model` strings are equal: other weights under the same
/// path are refused, the same model spelled `fx/` and `./fx/` merges, and one clip in two shards
/// (by content) is refused.
#[test]
fn shards_merge_by_model_content_not_by_path() {
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    two_shards(tmp.path(), ("fx/", "./fx/"), "78");
    corpus_dir(&t("other"), "fx/", &[("stella", &clip_evidence(2, "25"))]);
    corpus_dir(&t("again"), "fx/", &[("fox-copy", &clip_evidence(1, "78"))]);
    let (c, out) = xray_in(tmp.path(), &["summarize", "s1", "s2"]);
    assert_eq!(c, 0, "the same model spelled twice: {out}");
    assert!(out.contains("2 clips: 2 pass"), "{out}");
    let out = input_error(tmp.path(), &["summarize", "s1", "other"]);
    assert!(
        out.contains("other/stella.evidence.json")
            && out.contains("weights sha256 252525252525.. vs 787878787878.."),
        "{out}"
    );
    let out = input_error(tmp.path(), &["summarize", "s1", "again"]);
    assert!(out.contains("is also in s1/summary.json"), "{out}");
    // Within one summary too: a row pointing at another model's evidence.
    let mixed = t("mixed");
    corpus_dir(
        &mixed,
        "fx/",
        &[
            ("fox", &clip_evidence(1, "78")),
            ("stella", &clip_evidence(2, "25")),
        ],
    );
    let out = input_error(tmp.path(), &["summarize", "mixed"]);
    assert!(out.contains("another model"), "{out}");
}

/// Item 13: a summary with no clips exited 1 with "0 clips: ;", and a gate between two of them
/// passed ("0 checkpoints checked ... PASS"). Both are input errors now (exit 2, saying why), as
/// is gating evidence that observed no checkpoint.
#[test]
fn an_empty_corpus_or_gate_never_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    write_summary(&empty, &Summary::new("fx", None, None, vec![]));
    let out = input_error(tmp.path(), &["summarize", "empty"]);
    assert!(out.contains("no clips"), "{out}");
    let out = input_error(
        tmp.path(),
        &["gate", "--evidence", "empty", "--baseline", "empty"],
    );
    assert!(out.contains("no clips") && !out.contains("PASS"), "{out}");
    // Evidence that observed nothing (an unfinished run, verdict error, no checkpoints).
    let mut e = common::whisper_evidence(false);
    e.checkpoints.clear();
    e.verdict = Verdict::Error;
    let p = tmp.path().join("nothing.json");
    e.save(&p).unwrap();
    let out = input_error(
        tmp.path(),
        &["gate", "--evidence", s(&p), "--baseline", s(&p)],
    );
    assert!(
        out.contains("nothing to gate") && !out.contains("PASS"),
        "{out}"
    );
}

/// Item 13: `summarize --out` stored working-directory-relative evidence paths, so the merged
/// folder could not be read from elsewhere. Paths are relative to the summary file now, and
/// resolved against it when read.
#[test]
fn a_merged_summary_reads_back_from_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    two_shards(tmp.path(), ("fx", "fx"), "ab");
    std::fs::create_dir_all(t("merged")).unwrap();
    let (c, out) = xray_in(
        tmp.path(),
        &["summarize", "s1", "./s2/", "--out", "merged/summary.json"],
    );
    assert_eq!(c, 0, "{out}");
    let m = common::read_json(&t("merged/summary.json"));
    let paths: Vec<&str> = strs(&m["clips"], "evidence");
    assert_eq!(
        paths,
        ["../s1/fox.evidence.json", "../s2/stella.evidence.json"]
    );
    // Read from another working directory (the repository root), by absolute path.
    let merged = t("merged");
    let (c, out) = xray_in(&common::root(), &["summarize", s(&merged)]);
    assert_eq!(c, 0, "{out}");
    assert!(out.contains("2 clips: 2 pass"), "{out}");
    let (c, out) = xray_in(
        &common::root(),
        &["gate", "--evidence", s(&merged), "--baseline", s(&t("s1"))],
    );
    // The merged corpus holds the baseline's clip (pass) and one more (informational).
    assert_eq!(c, 0, "{out}");
    assert!(
        out.contains("stella.evidence.json: not in the baseline corpus"),
        "{out}"
    );
}

// ----------------------------------------------------------------------------------------------
// Property tests: the summary-row parser and the gate's inputs on arbitrary and mutated JSON
// never panic, name the file when they refuse, and what they accept reads back the same and
// gates against itself as a pass.

mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use xray_compare::corpus::{gate_corpus, Corpus};
    use xray_compare::gate::{gate, GateOptions};

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("JSON numbers are finite", |f| f.is_finite())
                .prop_map(Value::from),
            prop::sample::select(vec![
                "pass",
                "diverged",
                "error",
                "origin",
                "propagated",
                "fail",
                "missing",
                "unobserved",
                "not_comparable",
                "",
                "xray.evidence/v1",
                "xray.corpus-summary/v1",
                "../fox.evidence.json",
                "/nonexistent",
                "a`<img src=x>|",
            ])
            .prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::from),
            Just(json!([])),
            Just(json!({})),
            Just(json!([{}])),
        ]
    }

    #[derive(Debug, Clone)]
    enum Edit {
        /// Replace the node picked by the index (modulo the node count).
        Replace(usize, Value),
        /// Remove the picked node from its object or array.
        Remove(usize),
        /// Duplicate the picked array element (or object member, under a new key).
        Duplicate(usize),
    }

    fn edits() -> impl Strategy<Value = Vec<Edit>> {
        proptest::collection::vec(
            prop_oneof![
                (any::<usize>(), leaf()).prop_map(|(i, v)| Edit::Replace(i, v)),
                any::<usize>().prop_map(Edit::Remove),
                any::<usize>().prop_map(Edit::Duplicate),
            ],
            1..4,
        )
    }

    /// Every node's JSON pointer (the root last).
    fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    pointers(
                        x,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    )
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    pointers(x, format!("{at}/{i}"), out)
                }
            }
            _ => {}
        }
        out.push(at);
    }

    /// Members that decide verdicts, identities and paths: with `focus`, edits pick among them.
    const KEYS: &[&str] = &[
        "verdict",
        "status",
        "name",
        "step",
        "evidence",
        "audio",
        "clips",
        "checkpoints",
        "schema",
        "weights_sha256",
        "contract_sha256",
        "family",
        "tokens_equal",
        "capture_neutral",
        "error",
        "run",
        "metrics",
        "rel_l2",
        "max_abs",
        "transcript",
    ];

    fn apply(v: &mut Value, edits: &[Edit], focus: bool) {
        for e in edits {
            let mut all = Vec::new();
            pointers(v, String::new(), &mut all);
            let keyed: Vec<String> = all
                .iter()
                .filter(|p| KEYS.iter().any(|k| p.ends_with(&format!("/{k}"))))
                .cloned()
                .collect();
            let pool = if focus && !keyed.is_empty() {
                keyed
            } else {
                all
            };
            let i = match e {
                Edit::Replace(i, _) | Edit::Remove(i) | Edit::Duplicate(i) => *i,
            };
            let p = pool[i % pool.len()].clone();
            match e {
                Edit::Replace(_, x) => {
                    if let Some(n) = v.pointer_mut(&p) {
                        *n = x.clone();
                    }
                }
                Edit::Remove(_) | Edit::Duplicate(_) => {
                    let Some((parent, last)) = p.rsplit_once('/') else {
                        continue;
                    };
                    let key = last.replace("~1", "/").replace("~0", "~");
                    match v.pointer_mut(parent) {
                        Some(Value::Object(m)) => {
                            if matches!(e, Edit::Remove(_)) {
                                m.remove(&key);
                            } else if let Some(x) = m.get(&key).cloned() {
                                m.insert(format!("{key}_"), x);
                            }
                        }
                        Some(Value::Array(a)) => {
                            if let Ok(k) = key.parse::<usize>() {
                                if k < a.len() {
                                    if matches!(e, Edit::Remove(_)) {
                                        a.remove(k);
                                    } else {
                                        let x = a[k].clone();
                                        a.insert(k, x);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// The text of a mutated document: the JSON edited, or its bytes cut or flipped.
    fn text_of(
        v: &Value,
        edits: &[Edit],
        focus: bool,
        cut: Option<usize>,
        flip: Option<(usize, u8)>,
    ) -> String {
        let mut v = v.clone();
        apply(&mut v, edits, focus);
        let mut b = serde_json::to_string_pretty(&v).unwrap().into_bytes();
        if let Some((i, x)) = flip {
            let n = b.len();
            b[i % n] = x;
        }
        if let Some(c) = cut {
            let n = b.len();
            b.truncate(c % (n + 1));
        }
        String::from_utf8_lossy(&b).to_string()
    }

    fn evidence_bases() -> Vec<Value> {
        vec![
            serde_json::to_value(common::whisper_evidence(false)).unwrap(),
            serde_json::to_value(common::whisper_evidence(true)).unwrap(),
            serde_json::to_value(common::tiny_evidence()).unwrap(),
        ]
    }

    fn summary_base() -> Value {
        let rows = vec![
            ClipSummary::of(
                "audio/fox.wav",
                "fox.evidence.json",
                &clip_evidence(1, "ab"),
                1.0,
            ),
            ClipSummary::of(
                "audio/box.wav",
                "box.evidence.json",
                &common::whisper_evidence(true),
                2.0,
            ),
            ClipSummary::failed("audio/long.wav", "longer than the window", 0.5),
        ];
        serde_json::to_value(Summary::new("fx", Some("1/2".into()), Some(3.0), rows)).unwrap()
    }

    /// Unescaped pipes of a Markdown table row (its cell borders).
    fn borders(line: &str) -> usize {
        line.matches('|').count() - line.matches("\\|").count()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        /// Evidence, as the gate and the reports read it.
        #[test]
        fn evidence_is_refused_naming_the_file_or_read_back_consistently(
            base in 0usize..3,
            edits in edits(),
            focus in any::<bool>(),
            cut in proptest::option::weighted(0.1, any::<usize>()),
            flip in proptest::option::weighted(0.1, (any::<usize>(), any::<u8>())),
        ) {
            let bases = evidence_bases();
            let text = text_of(&bases[base], &edits, focus, cut, flip);
            let path = "fuzz/e.evidence.json";
            match Evidence::from_json(&text, path) {
                Err(e) => prop_assert!(e.to_string().starts_with(path), "{e}"),
                Ok(e) => {
                    prop_assert_eq!(e.verdict, e.effective_verdict());
                    let back = Evidence::from_json(&e.to_json().unwrap(), path);
                    prop_assert!(back.as_ref().is_ok_and(|b| *b == e), "{back:?}");
                    prop_assert_eq!(ClipSummary::of("a", "e", &e, 0.0).verdict, e.verdict);
                    // Against itself: refused (nothing observed, an identity not recorded) or a
                    // pass; against the original in both directions, no panic.
                    if let Ok(r) = gate(&e, &e, &GateOptions::default()) {
                        prop_assert!(r.passed(), "{:?}", r.failures().collect::<Vec<_>>());
                    }
                    let orig: Evidence = serde_json::from_value(bases[base].clone()).unwrap();
                    let _ = gate(&e, &orig, &GateOptions::default());
                    let _ = gate(&orig, &e, &GateOptions { allow_different_input: true, ..Default::default() });
                    let _ = xray_compare::report::markdown(&e);
                }
            }
        }

        /// A corpus summary's rows.
        #[test]
        fn summary_rows_are_refused_naming_the_file_or_read_back_consistently(
            edits in edits(),
            focus in any::<bool>(),
            cut in proptest::option::weighted(0.1, any::<usize>()),
            flip in proptest::option::weighted(0.1, (any::<usize>(), any::<u8>())),
        ) {
            let text = text_of(&summary_base(), &edits, focus, cut, flip);
            let path = "fuzz/summary.json";
            match Summary::from_json(&text, path) {
                Err(e) => prop_assert!(e.to_string().starts_with(path), "{e}"),
                Ok(s) => {
                    prop_assert!(!s.clips.is_empty());
                    prop_assert!(s.clips.iter().all(|c| !c.evidence.is_empty() || c.verdict == Verdict::Error));
                    let again = Summary::new(&s.model, s.shard.clone(), s.load_seconds, s.clips.clone());
                    let text = serde_json::to_string(&again).unwrap();
                    let back = Summary::from_json(&text, path);
                    prop_assert!(back.as_ref().is_ok_and(|b| *b == again), "{back:?}");
                    for line in again.markdown().lines().filter(|l| l.starts_with('|')) {
                        prop_assert_eq!(borders(line), 7, "{}", line);
                    }
                }
            }
        }

        /// Random text is refused by both parsers, naming the file.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            for r in [
                Evidence::from_json(&text, "fuzz/x").map(|_| ()),
                Summary::from_json(&text, "fuzz/x").map(|_| ()),
            ] {
                if let Err(e) = r {
                    prop_assert!(e.to_string().starts_with("fuzz/x"), "{e}");
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

        /// A corpus directory whose summary.json is mutated: loaded (rows derived from the
        /// evidence) and gated against itself as a pass, or refused naming a file of it.
        #[test]
        fn corpus_gate_inputs_are_refused_or_gated_consistently(edits in edits(), focus in any::<bool>()) {
            let tmp = tempfile::tempdir().unwrap();
            let dir = corpus_dir(
                &tmp.path().join("c"),
                "fx",
                &[("fox", &clip_evidence(1, "ab")), ("stella", &clip_evidence(2, "ab"))],
            );
            let mut v = crate::common::read_json(&dir.join("summary.json"));
            apply(&mut v, &edits, focus);
            std::fs::write(dir.join("summary.json"), v.to_string()).unwrap();
            match Corpus::load(&dir) {
                Err(e) => prop_assert!(e.to_string().contains(s(&dir)), "{e}"),
                Ok(c) => {
                    prop_assert_eq!(c.summary.clips.len(), c.evidence.len());
                    for (row, ev) in c.summary.clips.iter().zip(&c.evidence) {
                        match ev {
                            Some((_, e)) => prop_assert_eq!(row.verdict, e.effective_verdict()),
                            None => prop_assert_eq!(row.verdict, Verdict::Error),
                        }
                    }
                    if let Ok(r) = gate_corpus(&c, &c, &GateOptions::default()) {
                        // Only a clip that could not be checked fails against itself.
                        let unchecked = c.evidence.iter().any(|e| e.is_none());
                        prop_assert_eq!(r.passed(), !unchecked, "{:?}", r.failures().collect::<Vec<_>>());
                    }
                }
            }
        }
    }
}
