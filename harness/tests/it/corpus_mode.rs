//! Corpus mode end to end on the committed clips: `xray check --audio DIR --evidence-dir OUT`
//! (one process, one evidence file per clip, summary.json), `--shard K/N`, `xray summarize`
//! merging shards, and `xray gate` between corpus directories.

use crate::common;
use common::{assert_refused, assert_stdout, code, read_json, stderr, temp_paths, xray};

fn summary(dir: &std::path::Path) -> serde_json::Value {
    read_json(&dir.join("summary.json"))
}

#[test]
fn corpus_shards_summarize_and_gate() {
    let (tmp, [all, s1, s2]) = temp_paths(["all", "s1", "s2"]);
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
    assert_refused(&o, "--force");

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
    let m = read_json(&merged);
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
    assert_stdout(&o, 1, "absent from the new one");
    let o = g(&s2);
    assert_stdout(&o, 1, "audio.encoder.layer.1.out");
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

// ----------------------------------------------------------------------------------------------
// Issue 24: --evidence-dir replaces only X-Ray's own outputs, every clip's output is checked
// before the run, and a link among the clips that cannot be followed is refused by name.

/// `xray check --model whisper-rand-a ARGS`.
fn check_corpus(args: &[&str]) -> std::process::Output {
    let mut a = vec!["check", "--model", "fixtures/build/whisper-rand-a"];
    a.extend_from_slice(args);
    xray(&a)
}

/// An X-Ray corpus summary of one clip (its evidence `old.evidence.json`) in `dir`.
fn xray_corpus(dir: &std::path::Path, summary: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let e = common::whisper_evidence(false);
    e.save(&dir.join("old.evidence.json")).unwrap();
    if summary {
        let row = xray_compare::corpus::ClipSummary::of("old.wav", "old.evidence.json", &e, 1.0);
        let s = xray_compare::corpus::Summary::new("m", None, None, vec![row]);
        std::fs::write(dir.join("summary.json"), serde_json::to_string(&s).unwrap()).unwrap();
    }
}

/// Item 6: with `OUT/fox.evidence.json` and `OUT/stella.evidence.json` directories, `--force`
/// ran the corpus and both clips' evidence went to one fallback file. Refused before the run now.
#[test]
fn every_clip_output_is_checked_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    xray_corpus(&out, true);
    for clip in ["fox", "stella"] {
        std::fs::create_dir_all(out.join(format!("{clip}.evidence.json"))).unwrap();
    }
    let o = check_corpus(&[
        "--audio",
        "fixtures/audio",
        "--evidence-dir",
        out.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(".evidence.json") && !err.contains("clip 1/"),
        "{err}"
    );
    assert!(!err.contains("saved to"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Item 7 and item 13: `--force` replaced a foreign summary.json and left the earlier run's
/// evidence beside the new summary; X-Ray's own directory of a run killed before its summary was
/// refused even with --force. Now X-Ray's outputs are recognized by content: anything else is
/// refused by name, an unfinished run of X-Ray's is replaced with --force, and the earlier run's
/// evidence that this run did not write is removed.
#[test]
fn force_replaces_only_what_xray_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    let dir_arg = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let run = |dir: &std::path::Path, force: bool| {
        let d = dir_arg(dir);
        let mut a = vec![
            "--audio",
            "fixtures/audio/fox.wav",
            "--max-steps",
            "1",
            "--evidence-dir",
            d.as_str(),
        ];
        if force {
            a.push("--force");
        }
        check_corpus(&a)
    };
    // A foreign summary.json, and an X-Ray corpus with a foreign file beside it.
    let foreign = t("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("summary.json"), br#"{"my":"own summary"}"#).unwrap();
    let mixed = t("mixed");
    xray_corpus(&mixed, true);
    std::fs::write(mixed.join("notes.txt"), b"mine").unwrap();
    for (dir, name) in [(&foreign, "summary.json"), (&mixed, "notes.txt")] {
        for force in [false, true] {
            let o = run(dir, force);
            assert_eq!(code(&o), 2, "{}", stderr(&o));
            let err = stderr(&o);
            assert!(
                err.contains(&format!("holds {name}, which is not an output of X-Ray")),
                "{err}"
            );
            assert!(!err.contains("clip 1/"), "{err}");
        }
    }
    assert_eq!(
        std::fs::read(foreign.join("summary.json")).unwrap(),
        br#"{"my":"own summary"}"#
    );
    // A run killed before its summary: X-Ray's evidence only.
    let partial = t("partial");
    xray_corpus(&partial, false);
    let o = run(&partial, false);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unfinished") && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    let o = run(&partial, true);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("removed the earlier run's evidence not in this one: old.evidence.json"),
        "{}",
        stderr(&o)
    );
    let mut names: Vec<String> = std::fs::read_dir(&partial)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["fox.evidence.json", "summary.json", "summary.md"]);
    // And again over its own complete output, with --force.
    let o = run(&partial, true);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// Item 12: a dangling link and a link loop among the clips ran "1 clips" (skipped silently);
/// an empty or text .wav was already refused by name. Both are refused by name now.
#[test]
fn dangling_links_and_loops_among_the_clips_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let audio = tmp.path().join("audio");
    std::fs::create_dir_all(&audio).unwrap();
    std::os::unix::fs::symlink(
        common::root()
            .join("fixtures/audio/fox.wav")
            .canonicalize()
            .unwrap(),
        audio.join("fox.wav"),
    )
    .unwrap();
    std::os::unix::fs::symlink(audio.join("missing.wav"), audio.join("gone.wav")).unwrap();
    let out = tmp.path().join("out");
    let args = |audio: &std::path::Path| {
        check_corpus(&[
            "--audio",
            audio.to_str().unwrap(),
            "--evidence-dir",
            out.to_str().unwrap(),
        ])
    };
    let o = args(&audio);
    assert_refused(&o, "gone.wav: a dangling symbolic link");
    std::fs::remove_file(audio.join("gone.wav")).unwrap();
    std::os::unix::fs::symlink(audio.join("loop.wav"), audio.join("loop.wav")).unwrap();
    let o = args(&audio);
    assert_refused(&o, "loop.wav: a symbolic link that cannot be followed");
    assert!(!out.exists(), "nothing written");
}

// ----------------------------------------------------------------------------------------------
// Issue 23 item 4: a corpus run killed at any point resumes (`--resume`), re-checking only the
// clips without valid evidence, and never mixes evidence of another run.

/// A summary without its timing fields (`seconds`, `load_seconds`) and the `resumed` marks.
fn untimed(mut s: serde_json::Value) -> serde_json::Value {
    s.as_object_mut().unwrap().remove("load_seconds");
    for c in s["clips"].as_array_mut().unwrap() {
        let c = c.as_object_mut().unwrap();
        c.remove("seconds");
        c.remove("resumed");
    }
    s
}

/// The inode of a file (a rewrite, atomic by rename, gives a new one).
fn inode(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .ino()
}

#[test]
fn a_killed_corpus_run_resumes_to_the_summary_of_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, part) = (tmp.path().join("full"), tmp.path().join("part"));
    // `xray check` of the committed clips on whisper-rand-a, 4 steps, into `dir`; `extra` may
    // replace the model or the steps (the later of a repeated option is refused by clap, so
    // they are given here once).
    let args = |dir: &std::path::Path, extra: &[&str]| -> Vec<String> {
        let pick = |flag: &str, default: &str| -> String {
            extra
                .iter()
                .position(|a| *a == flag)
                .map_or(default.to_string(), |i| extra[i + 1].to_string())
        };
        let mut a: Vec<String> = vec![
            "check".into(),
            "--model".into(),
            pick("--model", "fixtures/build/whisper-rand-a"),
            "--audio".into(),
            "fixtures/audio".into(),
            "--max-steps".into(),
            pick("--max-steps", "4"),
            "--evidence-dir".into(),
            dir.to_str().unwrap().into(),
        ];
        let mut i = 0;
        while i < extra.len() {
            if extra[i] == "--model" || extra[i] == "--max-steps" {
                i += 2;
                continue;
            }
            a.push(extra[i].to_string());
            i += 1;
        }
        a
    };
    let run = |dir: &std::path::Path, extra: &[&str]| {
        let a = args(dir, extra);
        xray(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let o = run(&full, &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // The same run, killed (SIGKILL) as soon as its first clip's evidence is there.
    let log = std::fs::File::create(tmp.path().join("killed.log")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(common::root())
        .args(args(&part, &[]))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let first = part.join("fox.evidence.json");
    let t0 = std::time::Instant::now();
    while !first.exists() {
        assert!(
            t0.elapsed().as_secs() < 300,
            "no evidence after 300 s: {}",
            std::fs::read_to_string(tmp.path().join("killed.log")).unwrap_or_default()
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before its first evidence");
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !part.join("summary.json").exists(),
        "killed before its summary"
    );
    let missing = ["stella", "weather"]
        .iter()
        .filter(|c| !part.join(format!("{c}.evidence.json")).exists())
        .count();
    assert!(missing > 0, "the kill came after every clip was checked");
    let fox = inode(&first);

    // Without --resume (or --force) the unfinished run is refused; both together too.
    let o = run(&part, &[]);
    assert_refused(&o, "unfinished");
    let o = run(&part, &["--resume", "--force"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));

    // Evidence of another run is refused by name before anything runs: another policy or
    // option (settings) or another model (identity, as the gate checks it).
    let policy = tmp.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"defaults": {"f32": {"atol": 2e-4, "rtol": 1e-3, "max_outlier_fraction": 0.001, "max_rel_l2": 5e-5}}}"#,
    )
    .unwrap();
    for (extra, want) in [
        (
            vec!["--resume", "--policy", policy.to_str().unwrap()],
            "settings: policy_sha256",
        ),
        (
            vec!["--resume", "--max-steps", "2"],
            "settings: max_steps 2 vs earlier 4",
        ),
        (
            vec!["--resume", "--model", "fixtures/build/whisper-rand-b"],
            "weights sha256",
        ),
    ] {
        let o = run(&part, &extra);
        let err = stderr(&o);
        assert_eq!(code(&o), 2, "{extra:?}: {err}");
        assert!(
            err.contains("fox.evidence.json is evidence of another run") && err.contains(want),
            "{extra:?}: {err}"
        );
        assert!(!err.contains("clip 1/"), "{extra:?}: {err}");
        assert!(!part.join("summary.json").exists());
    }

    // Resumed: the kept clip is not checked again (its file untouched), the rest are, and the
    // summary is the uninterrupted run's but for timing.
    let o = run(&part, &["--resume"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("fox.wav: kept (its evidence is valid and of this run)"),
        "{err}"
    );
    assert_eq!(err.matches(": kept (").count(), 3 - missing, "{err}");
    assert_eq!(inode(&first), fox, "the kept evidence was rewritten");
    assert_eq!(untimed(summary(&part)), untimed(summary(&full)));
    assert_eq!(summary(&part)["clips"][0]["resumed"], true);
    for c in ["fox", "stella", "weather"] {
        let name = format!("{c}.evidence.json");
        assert_eq!(
            std::fs::read_to_string(part.join(&name)).unwrap(),
            std::fs::read_to_string(full.join(&name)).unwrap(),
            "{name}"
        );
    }

    // Evidence that does not load (its verdict edited against its checkpoints) is checked
    // again; valid evidence is kept.
    let stella = part.join("stella.evidence.json");
    let text = std::fs::read_to_string(&stella).unwrap();
    std::fs::write(
        &stella,
        text.replacen("\"verdict\": \"pass\"", "\"verdict\": \"diverged\"", 1),
    )
    .unwrap();
    let o = run(&part, &["--resume"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("stella.evidence.json") && err.contains("its clip is checked again"),
        "{err}"
    );
    assert_eq!(err.matches(": kept (").count(), 2, "{err}");
    assert_eq!(inode(&first), fox);
    assert_eq!(untimed(summary(&part)), untimed(summary(&full)));
    // A clip's evidence not in this corpus (another shard): refused, not removed.
    let o = run(&part, &["--resume", "--shard", "1/2"]);
    assert_refused(&o, "a clip this corpus does not have");
    assert!(part.join("stella.evidence.json").exists());
}
