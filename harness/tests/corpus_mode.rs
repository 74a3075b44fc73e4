//! Corpus mode end to end on the committed clips: `xray check --audio DIR --evidence-dir OUT`
//! (one process, one evidence file per clip, summary.json), `--shard K/N`, `xray summarize`
//! merging shards, and `xray gate` between corpus directories.

mod common;
use common::{code, stderr, xray};

fn summary(dir: &std::path::Path) -> serde_json::Value {
    let p = dir.join("summary.json");
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

#[test]
fn corpus_shards_summarize_and_gate() {
    let tmp = tempfile::tempdir().unwrap();
    let (all, s1, s2) = (
        tmp.path().join("all"),
        tmp.path().join("s1"),
        tmp.path().join("s2"),
    );
    // `xray check` of the committed corpus (a directory of WAVs) with `extra` arguments.
    let corpus = |extra: &[&str]| {
        let mut args = vec![
            "check",
            "--model",
            "fixtures/build/whisper-rand-a",
            "--audio",
            "fixtures/audio",
        ];
        args.extend_from_slice(extra);
        xray(&args)
    };

    // The whole corpus, in one process.
    let o = corpus(&["--evidence-dir", all.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let s = summary(&all);
    assert_eq!(s["schema"], "xray.corpus-summary/v1");
    assert_eq!(s["counts"]["clips"], 3);
    assert_eq!(s["counts"]["verdicts"]["pass"], 3);
    assert_eq!(s["counts"]["token_mismatches"], 0);
    let clips = s["clips"].as_array().unwrap();
    for c in clips {
        assert!(all.join(c["evidence"].as_str().unwrap()).is_file(), "{c}");
        assert_eq!(c["tokens_equal"], true);
        let m = c["worst_margin"]["margin"].as_f64().unwrap();
        assert!(
            m > 0.0 && m <= 1.0,
            "a passing clip's worst margin is in (0, 1]: {m}"
        );
    }
    assert!(
        s["worst"]["margin"].as_f64().unwrap()
            >= clips[0]["worst_margin"]["margin"].as_f64().unwrap()
    );
    assert!(
        stderr(&o).contains("corpus: 3 clips: 3 pass"),
        "{}",
        stderr(&o)
    );
    // Again into the same directory: refused without --force (an earlier corpus run).
    let o = corpus(&["--evidence-dir", all.to_str().unwrap()]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));

    // Two shards; the second with a planted fault, so the merge has a divergence to report.
    let o = corpus(&["--shard", "1/2", "--evidence-dir", s1.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = corpus(&[
        "--shard",
        "2/2",
        "--inject",
        "layernorm_eps",
        "--evidence-dir",
        s2.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let (a, b) = (summary(&s1), summary(&s2));
    assert_eq!(
        a["clips"].as_array().unwrap().len() + b["clips"].as_array().unwrap().len(),
        3
    );
    assert_eq!(b["clips"][0]["origin"], "audio.encoder.layer.1.out@step0");

    let merged = tmp.path().join("merged.json");
    let o = xray(&[
        "summarize",
        s1.to_str().unwrap(),
        s2.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    assert_eq!(m["counts"]["clips"], 3);
    assert_eq!(m["counts"]["verdicts"]["pass"], 2);
    assert_eq!(m["counts"]["verdicts"]["diverged"], 1);
    assert!(String::from_utf8_lossy(&o.stdout).contains("audio.encoder.layer.1.out@step0"));
    // The same directory twice: a clip in two shards is refused.
    let o = xray(&["summarize", s1.to_str().unwrap(), s1.to_str().unwrap()]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));

    // Gate between corpus directories: the whole corpus against itself passes; a shard that
    // lacks clips of the baseline fails, naming them; a faulty shard fails.
    let g = |new: &std::path::Path| {
        xray(&[
            "gate",
            "--evidence",
            new.to_str().unwrap(),
            "--baseline",
            all.to_str().unwrap(),
        ])
    };
    let o = g(&all);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stdout));
    let o = g(&s1);
    assert_eq!(code(&o), 1);
    assert!(String::from_utf8_lossy(&o.stdout).contains("absent from the new one"));
    let o = g(&s2);
    assert_eq!(code(&o), 1);
    assert!(String::from_utf8_lossy(&o.stdout).contains("audio.encoder.layer.1.out"));
}

#[test]
fn corpus_inputs_are_checked_before_any_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let out = out.to_str().unwrap();
    let m = "fixtures/build/whisper-rand-a";
    for (args, want) in [
        (
            vec![
                "--audio",
                "fixtures/audio/fox.wav",
                "fixtures/audio/stella.wav",
            ],
            "need --evidence-dir",
        ),
        (
            vec![
                "--audio",
                "fixtures/audio/fox.wav",
                "fixtures/audio/fox.wav",
                "--evidence-dir",
                out,
            ],
            "would both write fox.evidence.json",
        ),
        (
            vec![
                "--audio",
                "fixtures/audio",
                "--shard",
                "3/2",
                "--evidence-dir",
                out,
            ],
            "1 <= K <= N",
        ),
        (
            vec![
                "--audio",
                "fixtures/audio",
                "fixtures/no-such.wav",
                "--evidence-dir",
                out,
            ],
            "no-such.wav",
        ),
        (
            vec![
                "--audio",
                "fixtures/audio",
                "--evidence-dir",
                out,
                "--report",
                "r.html",
            ],
            "--report is for one clip",
        ),
        (
            vec!["--audio", "fixtures", "--evidence-dir", out],
            "has no .wav files",
        ),
    ] {
        let mut a = vec!["check", "--model", m];
        a.extend(args);
        let o = xray(&a);
        assert_eq!(code(&o), 2, "{a:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{a:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("running the HF reference"), "{a:?}");
    }
    assert!(!std::path::Path::new(out).exists(), "nothing written");
}
