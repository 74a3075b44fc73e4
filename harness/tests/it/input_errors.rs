//! Issue 10 item 9 and "audio a user actually has", end to end through the CLI: argument ranges
//! refused by clap before anything runs, audio refused before the oracle starts, oracle input
//! errors and unexpected Python exceptions as one line (the traceback behind `-v`), and audio at
//! other rates / channel counts converted once with both engines fed the same samples.

use crate::common;
use common::{FOX, RAND};

use std::path::Path;
use std::process::{Command, Output};

use common::{copy_dir, dump_to, read_json, root, stderr, xray};

const FIXTURES: &[&str] = &[
    "fixtures/build/whisper-rand-a/config.json",
    "fixtures/build/granite-nar-tiny/config.json",
];

fn ready() -> bool {
    common::ready(FIXTURES)
}

/// Exit 2 and the error is the last stderr line, one line, with no Python traceback.
fn one_line_error(o: &Output) -> String {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(!e.contains("Traceback"), "traceback without -v: {e}");
    let last = e.lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with("xray: error: ")
            || last.starts_with("error: ")
            || last.starts_with("For more"),
        "{e}"
    );
    last
}

/// `xray oracle --model MODEL --audio FOX --out OUT`'s arguments.
fn oracle_args<'a>(model: &'a str, out: &'a Path) -> [&'a str; 7] {
    let out = out.to_str().unwrap();
    ["oracle", "--model", model, "--audio", FOX, "--out", out]
}

#[test]
fn argument_ranges_are_refused_before_anything_runs() {
    let out = tempfile::tempdir().unwrap();
    let o = out.path().join("d");
    let o = o.to_str().unwrap();
    // (subcommand, flag, refused value); `oracle` and `run` also get `--out`.
    let cases = [
        ("check", "--max-steps", "0"),
        ("check", "--threads", "0"),
        ("oracle", "--max-steps", "0"),
        ("oracle", "--threads", "0"),
        ("oracle", "--dtype", "float16"),
        ("run", "--max-steps", "0"),
    ];
    for (cmd, flag, value) in cases {
        let mut args = vec![cmd, "--model", RAND, "--audio", FOX];
        if cmd != "check" {
            args.extend(["--out", o]);
        }
        args.extend([flag, value]);
        let r = xray(&args);
        let e = stderr(&r);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains("invalid value"), "{args:?}: {e}");
        assert!(
            !e.contains("HF reference") && !e.contains("Traceback"),
            "{e}"
        );
    }
    assert!(!Path::new(o).exists());
}

#[test]
fn audio_the_runtime_refuses_is_refused_before_the_oracle_runs() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A directory is "a directory", not "does not exist" (for `check`, a directory of clips is a
    // corpus, which needs --evidence-dir).
    let d = dir.path().to_str().unwrap();
    for cmd in ["check", "oracle"] {
        let mut args = vec![cmd, "--model", RAND, "--audio", d];
        let out = dir.path().join("o");
        if cmd == "oracle" {
            args.extend(["--out", out.to_str().unwrap()]);
        }
        let r = xray(&args);
        let last = one_line_error(&r);
        let want = if cmd == "check" {
            "need --evidence-dir"
        } else {
            "is a directory"
        };
        assert!(last.contains(want), "{last}");
        assert!(!stderr(&r).contains("HF reference"), "{}", stderr(&r));
    }
    // A huge fmt chunk (wave.py used to raise from deep inside) and a rate nobody converts.
    let huge = dir.path().join("huge-fmt.wav");
    let mut b = b"RIFF\x24\x00\x00\x00WAVEfmt ".to_vec();
    b.extend_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    b.extend_from_slice(&[1, 0, 1, 0, 0x80, 0x3e, 0, 0, 0, 0x7d, 0, 0, 2, 0, 16, 0]);
    b.extend_from_slice(b"data\x04\x00\x00\x00\x01\x00\x02\x00");
    std::fs::write(&huge, b).unwrap();
    let r = xray(&["check", "--model", RAND, "--audio", huge.to_str().unwrap()]);
    let last = one_line_error(&r);
    assert!(last.contains("huge-fmt.wav"), "{last}");
    assert!(!stderr(&r).contains("HF reference"), "{}", stderr(&r));
}

#[test]
fn oracle_input_errors_are_one_line_and_the_traceback_is_behind_v() {
    let Some(dir) = common::ready_tempdir(FIXTURES) else {
        return;
    };
    let g = dir.path().join("granite");
    copy_dir(&root().join("fixtures/build/granite-nar-tiny"), &g);
    std::fs::remove_file(g.join("tokenizer.json")).unwrap();
    let out = dir.path().join("o");
    let args = oracle_args(g.to_str().unwrap(), &out);
    let r = xray(&args);
    let last = one_line_error(&r);
    assert!(last.contains("tokenizer.json is missing"), "{last}");
    let mut v = vec!["-v"];
    v.extend(args);
    let r = xray(&v);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains("Traceback"), "{}", stderr(&r));

    // pytorch_model.bin next to the safetensors: refused the same way as for Whisper.
    std::fs::write(g.join("pytorch_model.bin"), b"\x80\x04 not a pickle").unwrap();
    let last = one_line_error(&xray(&args));
    assert!(
        last.contains("pickle-format weights ['pytorch_model.bin']"),
        "{last}"
    );
}

#[test]
fn unexpected_python_exceptions_are_one_line_with_type_and_place() {
    let Some(dir) = common::ready_tempdir(FIXTURES) else {
        return;
    };
    // Whisper weights that are not safetensors: transformers raises from deep inside.
    let m = dir.path().join("m");
    copy_dir(&root().join(RAND), &m);
    std::fs::write(
        m.join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .unwrap();
    let r = dump_to(
        "oracle",
        m.to_str().unwrap(),
        FOX,
        &dir.path().join("o"),
        &[],
    );
    let last = one_line_error(&r);
    assert!(
        last.contains("oracle raised") && last.contains(" (at ") && last.contains("-v"),
        "{last}"
    );
}

#[test]
fn stereo_44k_audio_is_converted_once_and_both_engines_get_the_same_samples() {
    if !ready() || !xray_core::testing::require_tool("sox", "`make tools` installs it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("fox-44k-stereo.wav");
    let ok = Command::new("sox")
        .args([root().join(FOX).to_str().unwrap(), "-r", "44100", "-c", "2"])
        .arg(&wav)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let ev = dir.path().join("e.json");
    let dumps = dir.path().join("dumps");
    let r = xray(&[
        "check",
        "--model",
        RAND,
        "--audio",
        wav.to_str().unwrap(),
        "--evidence",
        ev.to_str().unwrap(),
        "--dumps",
        dumps.to_str().unwrap(),
        "--max-steps",
        "3",
    ]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let rf = read_json(&dumps.join("reference/manifest.json"));
    let rt = read_json(&dumps.join("runtime/manifest.json"));
    let (a, b) = (&rf["extra"]["audio"], &rt["extra"]["audio"]);
    assert_eq!(a["source_rate"], 44100);
    assert_eq!(a["source_channels"], 2);
    assert!(a["resampler"].as_str().unwrap().contains("rubato"));
    let sha = a["samples_sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64);
    assert_eq!(b["samples_sha256"], a["samples_sha256"]);
    // Hashed by Python from what it computed on.
    assert_eq!(a["oracle_samples_sha256"], a["samples_sha256"]);
    // audio_sha256 stays the FILE's sha256.
    use sha2_hex::file_sha256;
    assert_eq!(rf["audio_sha256"].as_str().unwrap(), file_sha256(&wav));
    let e = read_json(&ev);
    assert_eq!(e["verdict"], "pass");
    assert!(e["notes"].as_array().unwrap().iter().any(|n| n
        .as_str()
        .unwrap_or_default()
        .contains("audio converted once")));
}

mod sha2_hex {
    /// sha256 of a file with the system's sha256sum (the harness crate has no sha2 dependency).
    pub fn file_sha256(p: &std::path::Path) -> String {
        let o = std::process::Command::new("sha256sum")
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

/// Issue 24 item 13 (part): `--audio <(cat fox.wav)` failed ("Failed to read enough bytes")
/// because `xray check` read the file twice (once for the reference, once for the runtime) and a
/// pipe can be read once. The file is read once: hashed and decoded from the same bytes.
#[test]
fn audio_from_a_pipe_is_read_once() {
    use std::io::Write;
    use std::process::Stdio;
    if !ready() {
        return;
    }
    let wav = std::fs::read(root().join(FOX)).unwrap();
    let want_sha = xray_runtime::audio::load_wav(&root().join(FOX), 16000)
        .unwrap()
        .sha256;
    let dir = tempfile::tempdir().unwrap();
    let ev = dir.path().join("e.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(root())
        .env_remove("XRAY_TRACEBACK")
        .args([
            "check",
            "--model",
            RAND,
            "--audio",
            "/dev/stdin",
            "--max-steps",
            "2",
            "--no-drill",
            "--evidence",
            ev.to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // The pipe closes when the writer is dropped: a second read would see end of file.
        let _ = stdin.write_all(&wav);
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let e = read_json(&ev);
    assert_eq!(e["verdict"], "pass", "{err}");
    assert_eq!(e["run"]["audio_sha256"], want_sha.as_str(), "{}", e["run"]);
}

/// Issue 24 item 2: `decoder_layers: 1e9` in a config.json made `xray contract` and `xray oracle`
/// (and `xray compare` through a foreign dump's `extra.config`) abort on a 16 GB allocation in
/// core's contract resolver; `d_model: "64"` said "not a known dim". Each is one line, exit 2,
/// naming the file and the key and what it holds.
#[test]
fn hostile_config_numbers_are_one_line_errors_naming_the_key() {
    if !ready() {
        return;
    }
    let src = root().join(RAND);
    let base = read_json(&src.join("config.json"));
    let dir = tempfile::tempdir().unwrap();
    for (i, (key, value, says)) in [
        (
            "decoder_layers",
            serde_json::json!(1_000_000_000u64),
            "config.json key 'decoder_layers' is 1000000000, above 16777216",
        ),
        (
            "decoder_layers",
            serde_json::json!(100_000),
            "repeat 'decoder_layers' = decoder_layers = 100000 is above 1024",
        ),
        (
            "d_model",
            serde_json::json!("64"),
            r#"config.json key 'd_model' is a string "64", expected a non-negative integer"#,
        ),
        (
            "d_model",
            serde_json::json!(64.5),
            "config.json key 'd_model' is the number 64.5",
        ),
        (
            "d_model",
            serde_json::json!(null),
            "config.json key 'd_model' is null",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut config = base.clone();
        config[key] = value;
        let model = dir.path().join(format!("m{i}"));
        std::fs::create_dir(&model).unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap().path();
            if f.file_name().unwrap() != "config.json" {
                std::os::unix::fs::symlink(&f, model.join(f.file_name().unwrap())).unwrap();
            }
        }
        let cfg_path = model.join("config.json");
        std::fs::write(&cfg_path, config.to_string()).unwrap();
        let m = model.to_str().unwrap();
        let out = dir.path().join(format!("out{i}"));
        for args in [
            vec!["contract", "--model", m],
            oracle_args(m, &out).to_vec(),
        ] {
            let o = xray(&args);
            let err = stderr(&o);
            let last = one_line_error(&o);
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(
                last.contains(says) && last.contains(cfg_path.to_str().unwrap()),
                "{args:?}: {last}"
            );
            assert!(o.stdout.is_empty(), "{args:?} wrote a contract");
        }
        // A foreign dump recording this config: `xray compare` without --model reads it.
        let dump = dir.path().join(format!("dump{i}"));
        std::fs::create_dir(&dump).unwrap();
        let manifest = serde_json::json!({
            "schema": xray_core::dump::SCHEMA, "version": xray_core::dump::VERSION,
            "family": "whisper", "model_id": "foreign", "producer": "foreign",
            "weights_sha256": "w", "audio_sha256": "a", "stats_only": true, "checkpoints": [],
            "extra": {"config": config},
        });
        std::fs::write(dump.join("manifest.json"), manifest.to_string()).unwrap();
        let d = dump.to_str().unwrap();
        let o = xray(&["compare", d, d]);
        let last = one_line_error(&o);
        assert!(
            last.contains(says) && last.contains("extra.config") && last.contains(d),
            "{last}"
        );
    }
}
