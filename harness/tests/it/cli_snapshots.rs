//! The CLI as a user sees it: for each command, its exit code, stdout and stderr, snapshotted
//! (`cargo insta review` to accept a change) with the repository root, temporary directories,
//! hashes and timings filtered (common::snapshot_settings). Covers `--help`, `list`, `compare` on
//! the committed dump, and the main input-error paths (exit 2, one line, nothing written).

use crate::common;

use common::{code, copy_dir, root, xray};

/// `$ xray ARGS`, the exit code, stdout and stderr as one text.
fn transcript(args: &[&str]) -> String {
    let o = xray(args);
    format!(
        "$ xray {}\nexit: {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        code(&o),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

macro_rules! cli_snapshot {
    ($name:literal, $args:expr) => {{
        let t = transcript($args);
        common::snapshot_settings().bind(|| insta::assert_snapshot!($name, t));
    }};
}

/// The committed reference dump (fixtures/dumps/make_dumps.sh).
const DUMP: &str = "fixtures/dumps/whisper-rand-a.fox";

/// A fixture built by `make fixtures`, or `None` (skip with a notice); a missing one fails the
/// test when `XRAY_REQUIRE_FIXTURES` is set (`make test`).
fn fixture(rel: &str) -> Option<String> {
    xray_core::testing::require_fixture(rel).map(|_| rel.to_string())
}

#[test]
fn help() {
    cli_snapshot!("cli_help", &["--help"]);
}

#[test]
fn no_command_is_a_usage_error() {
    cli_snapshot!("cli_no_command", &[]);
}

#[test]
fn unknown_command_is_a_usage_error() {
    cli_snapshot!("cli_unknown_command", &["frobnicate"]);
}

#[test]
fn list_whisper_checkpoints() {
    let Some(model) = fixture("fixtures/build/whisper-rand-a") else {
        return;
    };
    cli_snapshot!("cli_list_whisper", &["list", "--model", &model]);
}

#[test]
fn list_a_directory_that_is_not_a_model() {
    cli_snapshot!(
        "cli_list_not_a_model",
        &["list", "--model", "fixtures/audio"]
    );
}

#[test]
fn compare_the_committed_dump_with_itself() {
    cli_snapshot!("cli_compare_same_dump", &["compare", DUMP, DUMP]);
}

#[test]
fn compare_with_a_missing_dump() {
    cli_snapshot!(
        "cli_compare_missing_dump",
        &["compare", DUMP, "fixtures/dumps/no-such-dump"]
    );
}

#[test]
fn compare_with_a_tampered_dump() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("tampered");
    copy_dir(&root().join(DUMP), &d);
    let victim = d.join("audio.encoder.memory@step0.npy");
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&victim, &bytes).unwrap();
    cli_snapshot!(
        "cli_compare_tampered_dump",
        &["compare", DUMP, d.to_str().unwrap()]
    );
}

#[test]
fn compare_refuses_an_output_under_a_file_before_comparing() {
    cli_snapshot!(
        "cli_compare_output_under_a_file",
        &[
            "compare",
            DUMP,
            DUMP,
            "--evidence",
            "fixtures/audio/fox.wav/evidence.json"
        ]
    );
}

#[test]
fn report_of_a_missing_evidence_file() {
    cli_snapshot!("cli_report_missing", &["report", "no-such-evidence.json"]);
}

#[test]
fn gate_of_a_file_that_is_not_evidence() {
    let manifest = format!("{DUMP}/manifest.json");
    cli_snapshot!(
        "cli_gate_not_evidence",
        &["gate", "--evidence", &manifest, "--baseline", &manifest]
    );
}

#[test]
fn check_with_a_missing_audio_file() {
    let Some(model) = fixture("fixtures/build/whisper-rand-a") else {
        return;
    };
    cli_snapshot!(
        "cli_check_missing_audio",
        &[
            "check",
            "--model",
            &model,
            "--audio",
            "fixtures/audio/no-such.wav"
        ]
    );
}
