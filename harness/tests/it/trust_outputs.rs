//! Issue 10, items 2, 4, 7 and part of 10, end to end through the CLI on the real fixtures:
//! output directories are never wiped, output paths are checked before the run, stats-only
//! comparison sees order and writes the same outputs as the full path, `--only` that matches
//! nothing is refused, and checkpoints that could not be compared are named.

use crate::common;
use common::{
    assert_refused, assert_schema_valid, code, compare_with, dump_to, on, read_json, root, s,
    stderr, xray,
};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::{ArrayD, IxDyn};
use serde_json::Value;
use xray_runtime::dump::{Dump, DumpWriter, Stats};

const MODEL: &str = "fixtures/build/whisper-rand-a";
const AUDIO: &str = "fixtures/audio/fox.wav";

/// A runtime dump of the random-init fixture (two decode steps; ~0.3 s).
fn run_dump(out: &Path, extra: &[&str]) -> Output {
    dump("run", out, &[&["--max-steps", "2"], extra].concat())
}

/// A temporary folder holding a runtime dump `r` ([`run_dump`]): the folder and the dump.
fn dumped() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("r");
    assert_eq!(code(&run_dump(&r, &[])), 0);
    (dir, r)
}

/// `xray CMD --model MODEL --audio AUDIO --out OUT EXTRA..` (`run` or `oracle`).
fn dump(cmd: &str, out: &Path, extra: &[&str]) -> Output {
    dump_to(cmd, MODEL, AUDIO, out, extra)
}

/// `xray check --model MODEL --audio AUDIO EXTRA..`.
fn check(extra: &[&str]) -> Output {
    on("check", MODEL, AUDIO, extra)
}

fn precious(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let f = dir.join("precious.txt");
    std::fs::write(&f, b"not X-Ray's").unwrap();
    f
}

// ----------------------------------------------------------------------------------------------
// Item 2: --out / --dumps never delete what X-Ray did not write.

#[test]
fn run_oracle_and_check_refuse_a_directory_that_is_not_a_dump() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("mine");
    let f = precious(&d);
    for force in [false, true] {
        let mut extra = vec![];
        if force {
            extra.push("--force");
        }
        let o = run_dump(&d, &extra);
        assert_eq!(code(&o), 2, "{}", stderr(&o));
        assert!(
            stderr(&o).contains("mine") && stderr(&o).contains("not an X-Ray dump"),
            "{}",
            stderr(&o)
        );
        assert!(f.exists());
        let o = dump("oracle", &d, &["--force"]);
        assert_refused(&o, "not an X-Ray dump");
        assert!(f.exists());
    }
    // check --dumps D writes D/reference and D/runtime: a foreign D/reference is refused before
    // anything runs.
    let g = precious(&dir.path().join("dumps/reference"));
    let o = check(&[
        "--max-steps",
        "1",
        "--evidence",
        s(&dir.path().join("e.json")),
        "--dumps",
        s(&dir.path().join("dumps")),
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("reference") && !stderr(&o).contains("running"),
        "{}",
        stderr(&o)
    );
    assert!(g.exists() && !dir.path().join("e.json").exists());
}

#[test]
fn run_replaces_its_own_dump_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("dump");
    let o = run_dump(&d, &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run_dump(&d, &[]);
    assert_refused(&o, "--force");
    let o = run_dump(&d, &["--force", "--only", "audio.encoder.*"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let l = Dump::load(&d).unwrap();
    assert!(l
        .manifest
        .checkpoints
        .iter()
        .all(|e| e.name.starts_with("audio.encoder.")));
    assert!(l.unlisted.is_empty(), "old files left: {:?}", l.unlisted);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "leftover siblings: {names:?}");
}

// ----------------------------------------------------------------------------------------------
// Item 7: output paths are checked before anything runs.

#[test]
fn bad_output_paths_are_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let under_file = file.join("e.json");
    let cases: Vec<(&str, PathBuf)> = vec![
        ("--evidence", under_file.clone()),
        ("--report", file.join("r.html")),
        ("--markdown", dir.path().to_path_buf()),
        ("--evidence", PathBuf::from("/proc/xray-evidence.json")),
    ];
    for (flag, p) in &cases {
        let t = std::time::Instant::now();
        let o = check(&[flag, s(p)]);
        assert_eq!(code(&o), 2, "{flag} {}: {}", p.display(), stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(flag.trim_start_matches('-')) && !err.contains("running"),
            "{err}"
        );
        assert!(t.elapsed().as_secs_f64() < 5.0, "took {:?}", t.elapsed());
    }
    // compare: checked before the dumps are even read.
    let o = xray(&[
        "compare",
        "/nonexistent/ref",
        "/nonexistent/got",
        "--report",
        s(&file.join("r.html")),
    ]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("--report") && stderr(&o).contains("a-file"),
        "{}",
        stderr(&o)
    );
    // Two outputs on one path.
    let p = dir.path().join("same");
    let o = check(&["--report", s(&p), "--markdown", s(&p)]);
    assert_refused(&o, "two outputs");
}

#[test]
fn missing_output_folders_are_created() {
    let (dir, r) = dumped();
    let ev = dir.path().join("new/deeper/e.json");
    let md = dir.path().join("new/other/r.md");
    let o = compare_with(&r, &r, &["--evidence", s(&ev), "--markdown", s(&md)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(ev.exists() && md.exists());
}

#[test]
fn a_write_that_fails_after_the_run_keeps_the_rest() {
    let (dir, r) = dumped();
    // A file name longer than the file system allows: the folder is fine before the run, the
    // write itself fails afterwards.
    let long = dir.path().join(format!("{}.html", "x".repeat(300)));
    let (ev, md) = (dir.path().join("e.json"), dir.path().join("r.md"));
    let o = compare_with(
        &r,
        &r,
        &[
            "--evidence",
            s(&ev),
            "--report",
            s(&long),
            "--markdown",
            s(&md),
        ],
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("could not write the report") && stderr(&o).contains("xxxx.html"),
        "{}",
        stderr(&o)
    );
    assert_eq!(read_json(&ev)["verdict"], "pass");
    assert!(
        md.exists(),
        "the Markdown after the failed report was not written"
    );
    // Evidence that cannot be written where asked is saved elsewhere, and said so.
    let long_ev = dir.path().join(format!("{}.json", "e".repeat(300)));
    let o = compare_with(&r, &r, &["--evidence", s(&long_ev)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let err = stderr(&o);
    let saved = err
        .lines()
        .find_map(|l| l.strip_prefix("xray: the evidence was saved to "))
        .and_then(|l| l.strip_suffix(" instead"))
        .unwrap_or_else(|| panic!("{err}"));
    assert_eq!(read_json(Path::new(saved))["verdict"], "pass");
    let _ = std::fs::remove_file(saved);
}

#[test]
fn report_checks_its_outputs_and_writes_what_it_can() {
    let (dir, r) = dumped();
    let ev = dir.path().join("e.json");
    assert_eq!(code(&compare_with(&r, &r, &["--evidence", s(&ev)])), 0);
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let o = xray(&["report", s(&ev), "--html", s(&file.join("r.html"))]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--html") && stderr(&o).contains("a-file"),
        "{}",
        stderr(&o)
    );
    let long = dir.path().join(format!("{}.html", "x".repeat(300)));
    let md = dir.path().join("r.md");
    let o = xray(&["report", s(&ev), "--html", s(&long), "--markdown", s(&md)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(md.exists(), "{}", stderr(&o));
}

#[test]
fn the_default_reports_folder_is_checked_too() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("reports"), b"a file, not a folder").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(cwd.path())
        .args([
            "check",
            "--model",
            s(&root().join(MODEL)),
            "--audio",
            s(&root().join(AUDIO)),
        ])
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--evidence")
            && stderr(&o).contains("reports")
            && !stderr(&o).contains("running"),
        "{}",
        stderr(&o)
    );
}

// ----------------------------------------------------------------------------------------------
// Item 10: --only that matches nothing; unlisted files; not-compared checkpoints named.

#[test]
fn only_that_matches_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_dump(
        &dir.path().join("d"),
        &["--only", "audio.encoder.*", "--only", "no.such.*"],
    );
    assert_refused(&o, "'no.such.*'");
    assert!(!dir.path().join("d").exists());
    let o = run_dump(
        &dir.path().join("d"),
        &["--stats-only", "--only", "no.such.*"],
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = dump("oracle", &dir.path().join("o"), &["--only", "no.such.*"]);
    assert_refused(&o, "'no.such.*'");
}

#[test]
fn compare_names_missing_checkpoints_and_unlisted_files() {
    let dir = tempfile::tempdir().unwrap();
    let (r, g) = (dir.path().join("r"), dir.path().join("g"));
    assert_eq!(code(&run_dump(&r, &[])), 0);
    assert_eq!(
        code(&run_dump(
            &g,
            &["--only", "audio.encoder.*", "--only", "audio.frontend.*"]
        )),
        0
    );
    std::fs::write(g.join("stray@step0.npy"), b"x").unwrap();
    let ev = dir.path().join("e.json");
    // A partial dump: what it lacks is unobserved (named in the coverage), not a failure.
    let o = compare_with(&r, &g, &["--evidence", s(&ev)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("unobserved: audio.decoder."), "{err}");
    assert!(err.contains("stray@step0.npy"), "{err}");
    let e = read_json(&ev);
    assert!(
        e["coverage"]["unobserved_names"]
            .to_string()
            .contains("audio.decoder.layer.0..1.*"),
        "{}",
        e["coverage"]
    );
    assert!(e["notes"].to_string().contains("stray@step0.npy"));
    assert_schema_valid(&e);
    // --require-all: absence is a failure, named.
    let o = compare_with(&r, &g, &["--evidence", s(&ev), "--require-all"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("not compared:") && err.contains("missing: audio.decoder."),
        "{err}"
    );
    let e = read_json(&ev);
    assert!(e["notes"].to_string().contains("missing: audio.decoder."));
    assert_schema_valid(&e);
}

// ----------------------------------------------------------------------------------------------
// Item 4: stats-only comparison.

/// A tensor-to-tensor transformation of a dump's content.
type Transform = dyn Fn(&ArrayD<f32>) -> ArrayD<f32>;

/// Writes a stats-only copy of `full` with every tensor passed through `f`.
fn stats_copy(full: &Dump, out: &Path, f: &Transform) {
    let mut m = full.manifest.clone();
    m.checkpoints.clear();
    m.stats_only = true;
    let mut w = DumpWriter::new(m);
    for e in &full.manifest.checkpoints {
        let t = full.get(&e.name, e.step).unwrap();
        w.add(&e.name, e.step, e.layout, &f(t));
    }
    w.write(out).unwrap();
}

fn flat_map(t: &ArrayD<f32>, f: impl Fn(Vec<f32>) -> Vec<f32>) -> ArrayD<f32> {
    let v = f(t.as_standard_layout().iter().copied().collect());
    ArrayD::from_shape_vec(IxDyn(t.shape()), v).unwrap()
}

#[test]
fn stats_only_compare_sees_order_and_writes_every_output() {
    let (dir, r) = dumped();
    let full = Dump::load(&r).unwrap();
    // Clean f32-sized noise (relative 1e-6 per element, rel_l2 ~ 6e-7) passes.
    let noise = dir.path().join("noise");
    stats_copy(&full, &noise, &|t| {
        flat_map(t, |v| {
            v.into_iter()
                .enumerate()
                .map(|(k, x)| {
                    let h = (k as u32).wrapping_mul(2_654_435_761) >> 8;
                    x * (1.0 + 2e-6 * (h as f32 / (1u32 << 24) as f32 - 0.5))
                })
                .collect()
        })
    });
    let dir_s = |n: &str| dir.path().join(n);
    let ev = dir_s("e.json");
    let (html, md) = (dir_s("r.html"), dir_s("r.md"));
    let args = |got: &Path| {
        vec![
            "compare".to_string(),
            s(&r).into(),
            s(got).into(),
            "--evidence".into(),
            s(&ev).into(),
            "--report".into(),
            s(&html).into(),
            "--markdown".into(),
            s(&md).into(),
        ]
    };
    let run = |got: &Path, extra: &[&str]| {
        let mut a = args(got);
        a.extend(extra.iter().map(|x| x.to_string()));
        let a: Vec<&str> = a.iter().map(|x| x.as_str()).collect();
        xray(&a)
    };
    let o = run(&noise, &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let e = read_json(&ev);
    assert_eq!(e["verdict"], "pass");
    assert!(html.exists() && md.exists());
    assert_schema_valid(&e);
    // The same noise fails under a policy that asks for more: --policy is honoured.
    let pol = dir_s("p.json");
    std::fs::write(
        &pol,
        r#"{"schema": "xray.policy/v1", "rules": [{"match": "*", "max_rel_l2": 1e-9}]}"#,
    )
    .unwrap();
    let o = run(&noise, &["--policy", s(&pol)]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    // Every tensor reversed, shifted by one element, or (2-D) transposed in place: the same values
    // and the same mean/rms/min/max, another order. Each fails, and the failing compare replaces
    // the "pass" evidence, report and Markdown left at those paths.
    let transforms: Vec<(&str, Box<Transform>)> = vec![
        (
            "reversed",
            Box::new(|t| {
                flat_map(t, |mut v| {
                    v.reverse();
                    v
                })
            }),
        ),
        (
            "shifted",
            Box::new(|t| {
                flat_map(t, |mut v| {
                    v.rotate_right(1);
                    v
                })
            }),
        ),
        (
            "transposed",
            Box::new(|t| {
                if t.ndim() == 2 {
                    let v: Vec<f32> = t.t().iter().copied().collect();
                    ArrayD::from_shape_vec(IxDyn(t.shape()), v).unwrap()
                } else {
                    t.clone()
                }
            }),
        ),
    ];
    for (label, f) in &transforms {
        let got = dir_s(label);
        stats_copy(&full, &got, f.as_ref());
        let before = std::fs::read_to_string(&md).unwrap();
        let o = run(&got, &[]);
        assert_eq!(code(&o), 1, "{label}: {}", stderr(&o));
        let e = read_json(&ev);
        assert_eq!(e["verdict"], "diverged", "{label}");
        assert_schema_valid(&e);
        let fd = &e["first_divergence"];
        assert!(fd.is_object(), "{label}: no origin");
        assert!(stderr(&o).contains("first divergence"), "{}", stderr(&o));
        assert_ne!(
            std::fs::read_to_string(&md).unwrap(),
            before,
            "{label}: markdown not rewritten"
        );
        // Localized: exactly one origin, everything else pass or propagated.
        let statuses: Vec<String> = e["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["status"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            statuses.iter().filter(|s| *s == "origin").count(),
            1,
            "{label}: {statuses:?}"
        );
    }
}

#[test]
fn rust_and_python_stats_agree_on_the_same_array() {
    let py = root().join(".venv/bin/python");
    if !py.exists() {
        panic!("{} missing (make venv)", py.display());
    }
    let dir = tempfile::tempdir().unwrap();
    let shape = [3usize, 17, 29];
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n)
        .map(|i| ((i as f32) * 0.731).sin() * (1.0 + (i % 7) as f32))
        .collect();
    v[5] = f32::NAN;
    v[77] = f32::INFINITY;
    let t = ArrayD::from_shape_vec(IxDyn(&shape), v.clone()).unwrap();
    let f = dir.path().join("a.npy");
    std::fs::write(&f, xray_runtime::dump::npy_bytes(&t).unwrap()).unwrap();
    let o = Command::new(&py)
        .env("PYTHONPATH", root().join("oracle"))
        .args([
            "-c",
            "import json,sys\nfrom xray_oracle.dump import parse_npy, tensor_stats, content_sha256\n\
             a = parse_npy(open(sys.argv[1],'rb').read(), sys.argv[1])\n\
             print(json.dumps({'stats': tensor_stats(a), 'sha': content_sha256(a)}))",
            s(&f),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ps: Stats = serde_json::from_value(p["stats"].clone()).unwrap();
    let rs = Stats::of(&v);
    assert_eq!((ps.count, ps.nan, ps.inf), (rs.count, rs.nan, rs.inf));
    for (a, b) in [
        (ps.min, rs.min),
        (ps.max, rs.max),
        (ps.mean, rs.mean),
        (ps.rms, rs.rms),
    ] {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
    }
    let (pk, rk) = (ps.sketch.unwrap(), rs.sketch.unwrap());
    assert_eq!(pk.len(), rk.len());
    let scale = rk.iter().fold(0f64, |m, x| m.max(x.abs()));
    for (a, b) in pk.iter().zip(&rk) {
        assert!((a - b).abs() <= 1e-12 * scale, "sketch {a} vs {b}");
    }
    assert_eq!(
        p["sha"].as_str().unwrap(),
        xray_runtime::dump::content_sha256(&v)
    );
}

// ----------------------------------------------------------------------------------------------
// Issue 24 item 8: an output that is an input is refused before anything runs, whether given
// as the same path, another spelling, a symbolic link or a hard link.

/// `xray ARGS` (from the repository root): it must exit 2 naming `want`, and leave `kept` with
/// the bytes it had.
fn refused(args: &[&str], want: &str, kept: &Path) {
    let before = std::fs::read(kept).unwrap();
    let o = xray(args);
    assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(want) && err.contains("an input of this command"),
        "{args:?}: {err}"
    );
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    assert_eq!(
        std::fs::read(kept).unwrap(),
        before,
        "{args:?} replaced its input"
    );
}

#[test]
fn an_output_that_is_an_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let (ev, base) = (d("e.json"), d("b.json"));
    common::whisper_evidence(false).save(&ev).unwrap();
    common::whisper_evidence(false).save(&base).unwrap();
    std::os::unix::fs::symlink(&ev, d("link.json")).unwrap();
    std::fs::hard_link(&ev, d("hard.json")).unwrap();
    let dotted = format!("{}/./e.json", dir.path().display());

    // report: its evidence as --html or --markdown, by any name.
    for out in [
        s(&ev),
        dotted.as_str(),
        s(&d("link.json")),
        s(&d("hard.json")),
    ] {
        refused(&["report", s(&ev), "--html", out], "--html", &ev);
        refused(&["report", s(&ev), "--markdown", out], "--markdown", &ev);
    }
    // gate: --junit onto either input.
    for out in [s(&ev), s(&base), s(&d("hard.json"))] {
        refused(
            &[
                "gate",
                "--evidence",
                s(&ev),
                "--baseline",
                s(&base),
                "--junit",
                out,
            ],
            "--junit",
            &ev,
        );
    }
    // A --junit that is a directory is refused before the gate reads anything.
    let o = xray(&[
        "gate",
        "--evidence",
        "/nonexistent/new.json",
        "--baseline",
        "/nonexistent/old.json",
        "--junit",
        s(dir.path()),
    ]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("--junit") && stderr(&o).contains("is a directory"),
        "{}",
        stderr(&o)
    );

    // summarize: into one of the corpus directories' own files.
    let c1 = d("c1");
    std::fs::create_dir_all(&c1).unwrap();
    let e = common::whisper_evidence(false);
    e.save(&c1.join("fox.evidence.json")).unwrap();
    let row = xray_compare::corpus::ClipSummary::of("fox.wav", "fox.evidence.json", &e, 1.0);
    let sum = xray_compare::corpus::Summary::new("m", None, None, vec![row]);
    std::fs::write(
        c1.join("summary.json"),
        serde_json::to_string(&sum).unwrap(),
    )
    .unwrap();
    let fox = c1.join("fox.evidence.json");
    refused(&["summarize", s(&c1), "--out", s(&fox)], "--out", &fox);
    refused(
        &[
            "summarize",
            s(&c1),
            "--markdown",
            s(&c1.join("summary.json")),
        ],
        "--markdown",
        &c1.join("summary.json"),
    );

    // weights: its JSON onto the table it reads (refused before the table is read).
    let table = d("other.safetensors");
    std::fs::write(&table, b"not read").unwrap();
    refused(
        &["weights", s(&table), s(&table), "--json", s(&table)],
        "--json",
        &table,
    );

    // compare: onto a file of a dump it reads.
    let (_k, r) = dumped();
    let manifest = r.join("manifest.json");
    refused(
        &["compare", s(&r), s(&r), "--evidence", s(&manifest)],
        "--evidence",
        &manifest,
    );

    // check: onto its audio (a hard link of the clip), before the oracle starts.
    let clip = d("clip.wav");
    std::fs::copy(root().join(AUDIO), &clip).unwrap();
    std::fs::hard_link(&clip, d("clip-link.wav")).unwrap();
    let o = on(
        "check",
        MODEL,
        s(&clip),
        &["--report", s(&d("clip-link.wav"))],
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the audio") && !stderr(&o).contains("running"),
        "{}",
        stderr(&o)
    );
}

// ----------------------------------------------------------------------------------------------
// Issue 24 item 13: where the tokens part, said as it is.

/// A reference dump with fewer steps than the dump under test used to read "tokens part at step
/// 3 (reference -, ...)" and blame "a near tie"; against a stats-only dump the step was "?".
#[test]
fn a_shorter_reference_is_named_and_a_stats_only_parting_has_its_step() {
    let (_dir, [r3, g, gs]) = common::temp_paths(["r3", "g", "gs"]);
    assert_eq!(code(&dump("oracle", &r3, &["--max-steps", "3"])), 0);
    assert_eq!(code(&dump("run", &g, &["--max-steps", "6"])), 0);
    assert_eq!(
        code(&dump("run", &gs, &["--max-steps", "6", "--stats-only"])),
        0
    );
    for got in [&g, &gs] {
        let o = compare_with(&r3, got, &[]);
        assert_eq!(code(&o), 1, "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("tokens part at step 3: the reference's tokens end there")
                && err.contains("the reference's tokens end at step 3 where the candidate's go on"),
            "{err}"
        );
        for wrong in ["near tie", "step ?", "reference -"] {
            assert!(!err.contains(wrong), "{wrong:?} in {err}");
        }
    }
}
