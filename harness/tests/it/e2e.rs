//! End to end through the CLI on the real fixtures: `xray check` (runtime + oracle in one
//! process), `xray compare` offline against the committed reference dump (no Python), the
//! refusal of tampered dumps, `xray list`, and exit codes.

use crate::common;
use common::{
    assert_refused, check, checkpoint, code, compare_with, copy_dir, dump_to, on, read_json, root,
    stderr, xray,
};
use common::{FOX, RAND};

use std::path::Path;

#[test]
fn check_passes_on_real_tiny_en_with_equal_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("r.html");
    let report = ["--report", html.to_str().unwrap()];
    let e = check(
        "fixtures/whisper-tiny-en",
        "fixtures/audio/fox.wav",
        &report,
        0,
    );
    assert_eq!(e["verdict"], "pass");
    assert_eq!(e["capture_neutral"], true);
    assert_eq!(e["transcript"]["tokens_equal"], true);
    assert!(e["transcript"]["reference"]
        .as_str()
        .unwrap()
        .contains("lazy dog"));
    let n = e["checkpoints"].as_array().unwrap().len();
    assert!(n > 200, "{n} checkpoints");
    assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
}

#[test]
fn planted_fault_is_localized_with_isolation() {
    let fault = [
        "--inject",
        "layernorm_eps@encoder.layer.2.mlp_norm",
        "--isolate",
    ];
    let e = check(
        "fixtures/build/whisper-rand-b",
        "fixtures/audio/stella.wav",
        &fault,
        1,
    );
    assert_eq!(e["verdict"], "diverged");
    assert_eq!(
        e["first_divergence"]["checkpoint"],
        "audio.encoder.layer.2.out"
    );
    assert_eq!(e["run"]["isolated"], true);
    // Isolation: downstream checkpoints fed with the reference are locally clean.
    let later = checkpoint(&e, "audio.encoder.memory");
    assert_eq!(later["status"], "propagated");
    assert!(
        later["local_metrics"]["max_abs"].as_f64().unwrap() < 1e-4,
        "{}",
        later["local_metrics"]
    );
}

#[test]
fn offline_compare_against_committed_reference_dump() {
    let refdir = root().join("fixtures/dumps/whisper-rand-a.fox");
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let teacher = teacher(&refdir);
    let o = dump_to("run", RAND, FOX, &got, &["--teacher", &teacher]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let ev = dir.path().join("e.json");
    let o = compare_with(&refdir, &got, &["--evidence", ev.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(read_json(&ev)["verdict"], "pass");

    // A flipped byte in a copy of the reference is refused, naming the file; then a truncated
    // file too.
    let bad = dir.path().join("bad");
    copy_dir(&refdir, &bad);
    let f = bad.join("audio.encoder.memory@step0.npy");
    let mut b = std::fs::read(&f).unwrap();
    let tampers: [fn(&mut Vec<u8>); 2] = [
        |b| {
            let i = b.len() - 3;
            b[i] ^= 0x40;
        },
        |b| b.truncate(b.len() - 8),
    ];
    for tamper in tampers {
        tamper(&mut b);
        std::fs::write(&f, &b).unwrap();
        let o = compare_with(&bad, &got, &[]);
        assert_eq!(code(&o), 2);
        assert!(
            stderr(&o).contains("audio.encoder.memory@step0.npy"),
            "{}",
            stderr(&o)
        );
    }
}

fn teacher(refdir: &Path) -> String {
    read_json(&refdir.join("manifest.json"))["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn bad_inputs_exit_2_with_a_clear_message() {
    for (model, audio, says) in [
        (
            "fixtures/whisper-tiny-en",
            "fixtures/build/audio/long-35s.wav",
            "35.00 s",
        ),
        ("fixtures/nope", "fixtures/audio/fox.wav", "fixtures/nope"),
    ] {
        let o = on("check", model, audio, &[]);
        assert_refused(&o, says);
    }
}

#[test]
fn list_shows_producers_layouts_and_consumers() {
    let o = xray(&["list", "--model", "fixtures/build/whisper-rand-a"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s
        .lines()
        .find(|l| l.starts_with("audio.decoder.layer.1.cross_k "))
        .unwrap();
    assert!(
        line.contains("head_major") && line.contains("decoder.layer.1.cross_attn"),
        "{line}"
    );
}

#[test]
fn selftest_localizes_every_whisper_fault() {
    let o = xray(&["selftest", "--family", "whisper"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(code(&o), 0, "{out}\n{}", stderr(&o));
    assert!(out.contains(" 0 failed"), "{out}");
}

#[test]
fn granite_data_dependent_shape_divergence_and_teacher_forcing() {
    let dir = tempfile::tempdir().unwrap();
    let ev = dir.path().join("e.json");
    let base = [
        "check",
        "--model",
        "fixtures/build/granite-nar-tiny",
        "--audio",
        "fixtures/audio/fox.wav",
        "--inject",
        "bpe_head_sign_flip",
    ];
    let mut args = base.to_vec();
    args.extend(["--evidence", ev.to_str().unwrap()]);
    let o = xray(&args);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let e = read_json(&ev);
    assert_eq!(e["first_divergence"]["checkpoint"], "enc.ctc_bpe_logits");
    let status = |n: &str| checkpoint(&e, n)["status"].clone();
    assert_eq!(status("proj.out"), "pass");
    assert_eq!(status("dec.flat_embeds"), "alignment_fault");
    assert_eq!(status("dec.text_logits"), "alignment_fault");
    // Teacher forcing feeds the reference hypothesis: the decoder is compared again.
    args.push("--teacher-force");
    let o = xray(&args);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let e = read_json(&ev);
    let status = |n: &str| checkpoint(&e, n)["status"].clone();
    assert_eq!(e["first_divergence"]["checkpoint"], "enc.ctc_bpe_logits");
    assert_eq!(status("dec.text_logits"), "pass");
    assert_eq!(e["transcript"]["tokens_equal"], true);
}

#[test]
fn stats_only_dumps_bisect_without_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let run = |out: &Path, extra: &[&str]| {
        let o = dump_to(
            "run",
            RAND,
            FOX,
            out,
            &[&["--max-steps", "2", "--stats-only"], extra].concat(),
        );
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    };
    run(&a, &[]);
    run(&b, &["--inject", "layernorm_eps"]);
    // No tensors on disk, only the manifest.
    assert_eq!(std::fs::read_dir(&a).unwrap().count(), 1);
    let o = xray(&["compare", a.to_str().unwrap(), a.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = xray(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("first divergence: audio.encoder.layer.1.out@step0"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn calibrated_mode_gates_at_the_reference_noise_floor() {
    let calibrate = ["--max-steps", "3", "--calibrate"];
    let e = check(
        "fixtures/build/whisper-rand-a",
        "fixtures/audio/fox.wav",
        &calibrate,
        0,
    );
    for c in e["checkpoints"].as_array().unwrap() {
        assert_eq!(
            c["tolerance"]["source"], "calibrated:10x noise floor",
            "{}",
            c["name"]
        );
        assert!(c["tolerance"]["max_rel_l2"].as_f64().unwrap() > 0.0);
    }
}

// ----------------------------------------------------------------------------------------------
// Issue 23 item 3: the reference cache (`xray check --reference-cache DIR`).

/// `xray` (or `bin`) from the repository root with `env` set.
fn xray_with(bin: &Path, args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    let mut c = std::process::Command::new(bin);
    c.current_dir(root())
        .env_remove("XRAY_TRACEBACK")
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run xray")
}

/// `check --model whisper-rand-a --audio fox --max-steps STEPS --evidence EV EXTRA..`.
fn fox_check<'a>(steps: &'a str, ev: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "check",
        "--model",
        RAND,
        "--audio",
        FOX,
        "--max-steps",
        steps,
        "--evidence",
        ev.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    a
}

/// [`fox_check`] with `--reference-cache CACHE`.
fn cached_check<'a>(steps: &'a str, cache: &'a Path, ev: &'a Path) -> Vec<&'a str> {
    fox_check(steps, ev, &["--reference-cache", cache.to_str().unwrap()])
}

/// Evidence without `run.reference_cache` (what differs between a cold and a warm check).
fn without_cache_record(mut e: serde_json::Value) -> serde_json::Value {
    e["run"].as_object_mut().unwrap().remove("reference_cache");
    e
}

/// The names in a directory, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

/// A cold check fills the cache; a warm one reads it without the oracle: with an oracle package
/// that fails (and leaves a mark) when imported, the warm check passes, the mark is absent, and
/// its evidence is the cold one's but for `run.reference_cache.hit`. The same package makes a
/// check without the cache fail with the mark (the probe can fail), and cannot fill the cache
/// (a package other than the one xray was built from is refused before Python starts).
#[test]
fn a_warm_reference_cache_check_never_starts_the_oracle() {
    let bin = Path::new(env!("CARGO_BIN_EXE_xray"));
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    let cache = t("cache");
    let o = xray(&cached_check("3", &cache, &t("cold.json")));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not in the reference cache"),
        "{}",
        stderr(&o)
    );
    let cold = read_json(&t("cold.json"));
    let rc = &cold["run"]["reference_cache"];
    assert_eq!(rc["hit"], false, "{rc}");
    let key = rc["key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 64);
    assert_eq!(rc["dir"], cache.to_str().unwrap());
    // One entry, complete, nothing temporary left.
    assert_eq!(names(&cache), std::slice::from_ref(&key));
    assert_eq!(names(&cache.join(&key)), ["dump", "entry.json"]);
    common::assert_schema_valid(&cold);

    // An oracle package that marks its import and fails.
    let poison = t("poison");
    std::fs::create_dir_all(poison.join("xray_oracle")).unwrap();
    std::fs::write(
        poison.join("xray_oracle/__init__.py"),
        "import pathlib\npathlib.Path(__file__).parent.parent.joinpath('imported').write_text('yes')\nraise ImportError('poisoned oracle package imported')\n",
    )
    .unwrap();
    let mark = poison.join("imported");
    let env = [("XRAY_ORACLE_PATH", poison.as_path())];
    // The probe bites: a check that runs the oracle imports the package and fails.
    let x = t("x.json");
    let o = xray_with(bin, &fox_check("3", &x, &[]), &env);
    assert_refused(&o, "poisoned");
    assert!(mark.exists(), "the poisoned package was imported");
    std::fs::remove_file(&mark).unwrap();

    // Warm: passes without importing it.
    let o = xray_with(bin, &cached_check("3", &cache, &t("warm.json")), &env);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!mark.exists(), "a warm check imported the oracle package");
    let err = stderr(&o);
    assert!(err.contains("from the reference cache"), "{err}");
    assert!(!err.contains("running the HF reference"), "{err}");
    let warm = read_json(&t("warm.json"));
    assert_eq!(warm["run"]["reference_cache"]["hit"], true);
    assert_eq!(warm["run"]["reference_cache"]["key"], key.as_str());
    assert_eq!(without_cache_record(warm), without_cache_record(cold));

    // A miss with that package: refused before Python starts, nothing stored.
    let o = xray_with(bin, &cached_check("2", &cache, &t("miss.json")), &env);
    assert_refused(&o, "is not the one this xray was built from");
    assert!(!mark.exists());
    assert_eq!(names(&cache), [key]);
}

/// A cache entry that does not verify is an error naming the file (exit 2, no evidence), never a
/// pass and never a silent recomputation; X-Ray leaves the entry where it is.
#[test]
fn a_tampered_reference_cache_entry_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    let cache = t("cache");
    let o = xray(&cached_check("2", &cache, &t("cold.json")));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let key = names(&cache).remove(0);
    let entry = cache.join(&key);
    let sha = |p: &Path| {
        use std::process::Command;
        let o = Command::new("sha256sum").arg(p).output().unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    type Tamper<'a> = Box<dyn Fn(&Path) + 'a>;
    let npy: String = names(&entry.join("dump"))
        .into_iter()
        .find(|n| n.ends_with(".npy"))
        .unwrap();
    let cases: Vec<(&str, Tamper<'_>, String)> = vec![
        (
            "a tensor's byte",
            Box::new({
                let npy = npy.clone();
                move |e: &Path| {
                    let p = e.join("dump").join(&npy);
                    let mut b = std::fs::read(&p).unwrap();
                    let n = b.len() - 1;
                    b[n] ^= 1;
                    std::fs::write(&p, b).unwrap();
                }
            }),
            npy.clone(),
        ),
        (
            "the manifest's transcript",
            Box::new(|e: &Path| {
                let p = e.join("dump/manifest.json");
                let mut m = read_json(&p);
                m["transcript"] = " something else".into();
                std::fs::write(&p, serde_json::to_string_pretty(&m).unwrap()).unwrap();
            }),
            "dump/manifest.json".into(),
        ),
        (
            "the manifest's audio, its sha256 forged in entry.json",
            Box::new(move |e: &Path| {
                let p = e.join("dump/manifest.json");
                let mut m = read_json(&p);
                m["audio_sha256"] = "00".repeat(32).into();
                std::fs::write(&p, serde_json::to_string_pretty(&m).unwrap()).unwrap();
                let ep = e.join("entry.json");
                let mut en = read_json(&ep);
                en["manifest_sha256"] = sha(&p).into();
                std::fs::write(&ep, serde_json::to_string_pretty(&en).unwrap()).unwrap();
            }),
            "dump/manifest.json: audio_sha256".into(),
        ),
        (
            "the key's material",
            Box::new(|e: &Path| {
                let p = e.join("entry.json");
                let mut en = read_json(&p);
                en["material"]["threads"] = 2.into();
                std::fs::write(&p, serde_json::to_string_pretty(&en).unwrap()).unwrap();
            }),
            "entry.json".into(),
        ),
        (
            "a stray file",
            Box::new(|e: &Path| std::fs::write(e.join("notes.txt"), b"mine").unwrap()),
            "notes.txt".into(),
        ),
    ];
    for (what, tamper, named) in cases {
        let c = t(&format!("c-{}", what.len()));
        copy_dir(&entry.join("dump"), &c.join(&key).join("dump"));
        std::fs::copy(entry.join("entry.json"), c.join(&key).join("entry.json")).unwrap();
        tamper(&c.join(&key));
        let before = names(&c.join(&key));
        let ev = t("tampered.json");
        let o = xray(&cached_check("2", &c, &ev));
        let err = stderr(&o);
        assert_eq!(code(&o), 2, "{what}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("xray: error: reference cache entry")
                && last.contains(&named)
                && last.contains("corrupt or tampered"),
            "{what}: {err}"
        );
        assert_eq!(err.matches("error").count(), 1, "{what}: one line: {err}");
        assert!(!err.contains("running the HF reference"), "{what}: {err}");
        assert!(!ev.exists(), "{what}: no evidence from a bad entry");
        assert_eq!(
            names(&c.join(&key)),
            before,
            "{what}: the entry is left alone"
        );
    }
}

/// The Python-free `xray` (`make test-nopy` builds `xray-nopy` beside this one) accepts the
/// cache the oracle build filled, with the same evidence, and refuses a miss or a check without
/// a cache with one line, exit 2.
#[test]
fn the_python_free_build_checks_from_the_cache_and_refuses_a_miss() {
    let nopy = Path::new(env!("CARGO_BIN_EXE_xray")).with_file_name("xray-nopy");
    if !xray_core::testing::require_all(&[&nopy], "run `make test-nopy`") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = |n: &str| tmp.path().join(n);
    let cache = t("cache");
    let o = xray(&cached_check("3", &cache, &t("cold.json")));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let run = |args: &[&str]| {
        std::process::Command::new(&nopy)
            .current_dir(root())
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("PYTHONHOME")
            .env_remove("PYTHONPATH")
            .args(args)
            .output()
            .expect("run xray-nopy")
    };
    let o = run(&cached_check("3", &cache, &t("warm.json")));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (cold, warm) = (read_json(&t("cold.json")), read_json(&t("warm.json")));
    assert_eq!(warm["run"]["reference_cache"]["hit"], true);
    assert_eq!(without_cache_record(warm), without_cache_record(cold));
    let o = run(&[
        "gate",
        "--evidence",
        t("warm.json").to_str().unwrap(),
        "--baseline",
        t("cold.json").to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stdout));
    // A miss: one line naming the cache, the key and the versions it keyed by.
    let o = run(&cached_check("2", &cache, &t("miss.json")));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let err = stderr(&o);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "xray: error: reference cache miss: {} holds no reference",
            cache.display()
        )) && last.contains("oracle/requirements.txt pins"),
        "{err}"
    );
    assert_eq!(err.matches("error").count(), 1, "{err}");
    assert!(!t("miss.json").exists());
    // No cache at all: refused before the model loads.
    let x = t("x.json");
    let o = run(&fox_check("3", &x, &[]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("built without the oracle") && stderr(&o).contains("--reference-cache"),
        "{}",
        stderr(&o)
    );
}
