//! `xray gate` refuses evidence that describes another run than its baseline: another clip or
//! other weights (exit 2 unless `--allow-different-input`), another family or contract (exit 2
//! always). It used to gate them: another clip passed, and Whisper against Granite reported
//! "regressions".

mod common;

use std::process::Command;

fn gate(new: &str, base: &str, extra: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_xray"))
        .args(["gate", "--evidence", new, "--baseline", base])
        .args(extra)
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
