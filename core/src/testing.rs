//! Honest skips: the one guard every X-Ray test uses when something it needs is not here.
//!
//! libtest cannot mark a test skipped at run time, so a guarded test that returns early is
//! reported `ok`. These guards make the skip visible and countable instead:
//!
//! - each skip prints one line to stderr, `SKIPPED <binary>::<test>: <what> is missing (<how>)`
//!   (written past libtest's output capture, so `cargo test` shows it);
//! - each skip appends that line to the ledger file named by `XRAY_SKIP_LEDGER` when it is set
//!   (`make test` points it at `target/test-skips.txt`, truncates it first and prints the count
//!   and the lines at the end: `.ci/skips`);
//! - under `XRAY_REQUIRE_FIXTURES` (set by `make test`, which builds every fixture first) a
//!   missing fixture or tool panics naming the same: a skip must not pass for a result there;
//! - [`require_cpu`] skips only when the CPU lacks a feature (`is_x86_feature_detected!`), so on a
//!   CPU that has it the test always runs; a CPU is not a fixture, so that skip is recorded and
//!   printed even under `XRAY_REQUIRE_FIXTURES`, never fatal.
//!
//! ```no_run
//! # fn t() {
//! let Some(model) = xray_core::testing::require_fixture("fixtures/build/whisper-rand-a") else {
//!     return;
//! };
//! # let _ = model; }
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

/// Set (to anything) by `make test`: a missing fixture fails the test instead of skipping it.
pub const REQUIRE_VAR: &str = "XRAY_REQUIRE_FIXTURES";
/// A file each skip appends its line to (absolute: tests run in their crate's directory).
pub const LEDGER_VAR: &str = "XRAY_SKIP_LEDGER";
/// What builds the fixtures.
pub const MAKE_FIXTURES: &str = "run `make fixtures`";

/// The repository root (core/..), which relative fixture paths are resolved against.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core/ has a parent")
        .to_path_buf()
}

/// Whether a missing fixture fails (`XRAY_REQUIRE_FIXTURES` is set).
pub fn required() -> bool {
    std::env::var_os(REQUIRE_VAR).is_some()
}

/// `path` (relative to the repository root unless absolute) when it exists; else `None` after
/// a skip line, or a panic under `XRAY_REQUIRE_FIXTURES`.
pub fn require_fixture(path: impl AsRef<Path>) -> Option<PathBuf> {
    let p = repo().join(path);
    require_all(std::slice::from_ref(&p), MAKE_FIXTURES).then_some(p)
}

/// Whether every path (relative to the repository root unless absolute) exists; else one skip
/// line naming all the missing ones and `how` to make them (or a panic under
/// `XRAY_REQUIRE_FIXTURES`).
pub fn require_all<P: AsRef<Path>>(paths: &[P], how: &str) -> bool {
    require_all_at(paths, how, required())
}

/// [`require_all`] with the requirement given instead of read from the environment.
pub fn require_all_at<P: AsRef<Path>>(paths: &[P], how: &str, required: bool) -> bool {
    let missing = missing(paths);
    require(&missing.join(", "), missing.is_empty(), how, required)
}

fn missing<P: AsRef<Path>>(paths: &[P]) -> Vec<String> {
    let root = repo();
    paths
        .iter()
        .map(|p| root.join(p))
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect()
}

/// A tool found on `PATH` (`tool --version` runs); else a skip line, or a panic under
/// `XRAY_REQUIRE_FIXTURES` (`make test` installs the tools it needs).
pub fn require_tool(tool: &str, how: &str) -> bool {
    let present = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok();
    require(tool, present, how, required())
}

/// The general guard: `true` when `present`; else `false` after printing and recording
/// `SKIPPED <test>: <what> is missing (<how>)`, or a panic naming the same when `required`.
pub fn require(what: &str, present: bool, how: &str, required: bool) -> bool {
    guard(what, present, how, required, ledger().as_deref())
}

fn guard(what: &str, present: bool, how: &str, required: bool, ledger: Option<&Path>) -> bool {
    if present {
        return true;
    }
    let body = format!("{}: {what} is missing ({how})", test_name());
    if required {
        panic!("{body}, and {REQUIRE_VAR} is set: a missing fixture fails here");
    }
    emit(&format!("SKIPPED {body}"), ledger);
    false
}

/// Whether the CPU has every one of `features` (names as `is_x86_feature_detected!` spells
/// them, from a fixed list: avx, avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq). `false`
/// (after a skip line and a ledger entry, never a panic) only when one is missing; an unknown
/// name panics.
pub fn require_cpu(features: &[&str]) -> bool {
    let lacking = lacking(features);
    if lacking.is_empty() {
        return true;
    }
    let line = format!(
        "SKIPPED {}: the CPU lacks {}",
        test_name(),
        lacking.join(", ")
    );
    emit(&line, ledger().as_deref());
    false
}

fn lacking<'a>(features: &[&'a str]) -> Vec<&'a str> {
    features.iter().copied().filter(|f| !cpu_has(f)).collect()
}

#[cfg(target_arch = "x86_64")]
fn cpu_has(feature: &str) -> bool {
    use std::arch::is_x86_feature_detected as has;
    match feature {
        "avx" => has!("avx"),
        "avx2" => has!("avx2"),
        "fma" => has!("fma"),
        "f16c" => has!("f16c"),
        "avx512f" => has!("avx512f"),
        "avx512bw" => has!("avx512bw"),
        "avx512vl" => has!("avx512vl"),
        "avx512dq" => has!("avx512dq"),
        other => panic!("require_cpu: unknown CPU feature {other:?}"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has(_feature: &str) -> bool {
    false
}

/// The ledger `XRAY_SKIP_LEDGER` names, if any.
fn ledger() -> Option<PathBuf> {
    std::env::var_os(LEDGER_VAR).map(PathBuf::from)
}

/// A skip for a reason that is neither a fixture nor a tool (so never fatal): prints and records
/// `SKIPPED <test>: <reason>`. Call it just before the test returns.
pub fn skip(reason: &str) {
    emit(
        &format!("SKIPPED {}: {reason}", test_name()),
        ledger().as_deref(),
    );
}

/// Print a skip line and append it to the ledger, if any.
/// Written to the stderr handle, not through `eprintln!`, which libtest captures (and shows only
/// for a failing test): the line is visible in `cargo test`'s output.
fn emit(line: &str, ledger: Option<&Path>) {
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Some(ledger) = ledger {
        record(ledger, line);
    }
}

/// Append one line (one `write` on an `O_APPEND` file, so test processes running at once do
/// not interleave). A ledger that cannot be written fails the test: the count would lie.
fn record(ledger: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger)
        .unwrap_or_else(|e| panic!("skip ledger {}: {e}", ledger.display()));
    f.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("skip ledger {}: {e}", ledger.display()));
}

/// `<binary>::<test>`: the test binary without cargo's hash, and libtest's thread name.
fn test_name() -> String {
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => s,
        })
        .unwrap_or_else(|| "?".into());
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    format!("{bin}::{test}")
}

/// Deterministic pseudo-random 64-bit words (xorshift64 seeded from `seed`, never stuck at 0):
/// the noise of numeric tests, the same on every machine.
pub fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::iter::repeat_with(move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    })
}

// The `xray` binary from an end-to-end test of an engine (any crate of the workspace): run in
// the repository root, its evidence read as JSON.

/// target/<profile>/xray, beside the running test's deps/ directory (`cargo test --workspace`
/// builds it there).
pub fn xray_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .join("xray")
}

/// `bin ARGS` run in the repository root (where relative fixture paths resolve).
pub fn run_in_repo(bin: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin)
        .current_dir(repo())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()))
}

/// A finished command's stderr, as text.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// `xray oracle --model MODEL --audio AUDIO --out OUT EXTRA..`, which must succeed: the HF
/// reference's dump at `out`.
pub fn xray_oracle(model: &str, audio: &str, out: &Path, extra: &[&str]) {
    let out = out.to_str().expect("a UTF-8 dump path");
    let args = [
        &["oracle", "--model", model, "--audio", audio, "--out", out],
        extra,
    ]
    .concat();
    let o = run_in_repo(&xray_bin(), &args);
    assert!(o.status.success(), "xray oracle: {}", stderr(&o));
}

/// `xray compare REF GOT --evidence DIR/TAG.evidence.json ARGS..`, which must exit 0 (pass) or 1
/// (a divergence; a dump xray could not read exits 2): the evidence.
pub fn xray_compare(
    reference: &Path,
    got: &Path,
    dir: &Path,
    tag: &str,
    args: &[&str],
) -> serde_json::Value {
    let ev = dir.join(format!("{tag}.evidence.json"));
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    let (r, g, e) = (path(reference), path(got), path(&ev));
    let all = [
        &["compare", r.as_str(), g.as_str(), "--evidence", e.as_str()],
        args,
    ]
    .concat();
    let o = run_in_repo(&xray_bin(), &all);
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "xray compare ({tag}): {}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(&ev).unwrap_or_else(|e| panic!("{}: {e}", ev.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", ev.display()))
}

/// The evidence's checkpoint `name` at `step` (a panic naming it when there is none).
pub fn evidence_checkpoint<'a>(
    e: &'a serde_json::Value,
    name: &str,
    step: u64,
) -> &'a serde_json::Value {
    e["checkpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name && c["step"] == step)
        .unwrap_or_else(|| panic!("{name}@step{step} not in the evidence"))
}

/// The string `key` of each element of the JSON array `v` (a panic on anything else).
pub fn strs<'a>(v: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| {
            x[key]
                .as_str()
                .unwrap_or_else(|| panic!("{x}: no string {key}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_paths_pass_and_relative_ones_resolve_at_the_root() {
        assert!(require_all_at(&["core/Cargo.toml"], MAKE_FIXTURES, true));
        assert!(require_fixture("core/src/testing.rs").is_some_and(|p| p.is_file()));
    }

    #[test]
    #[should_panic(expected = "is missing (run `make fixtures`), and XRAY_REQUIRE_FIXTURES is set")]
    fn a_missing_fixture_fails_when_required() {
        require_all_at(&["fixtures/build/no-such-fixture"], MAKE_FIXTURES, true);
    }

    /// A skip (through a ledger of its own, not the suite's: this one is not a real skip) is one
    /// line naming the binary, the test, the path and what makes it, and one ledger line each.
    #[test]
    fn a_missing_fixture_skips_and_is_recorded_once() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("skips.txt");
        let gone = missing(&["fixtures/build/no-such-fixture", "core/Cargo.toml"]);
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert!(!guard(&gone[0], false, MAKE_FIXTURES, false, Some(&ledger)));
        assert!(guard("x", true, MAKE_FIXTURES, true, Some(&ledger)));
        assert!(!guard("y", false, "z", false, Some(&ledger)));
        let text = std::fs::read_to_string(&ledger).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let test = "xray_core::testing::tests::a_missing_fixture_skips_and_is_recorded_once";
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0],
            format!(
                "SKIPPED {test}: {} is missing (run `make fixtures`)",
                gone[0]
            )
        );
        assert!(gone[0].ends_with("fixtures/build/no-such-fixture"));
        assert_eq!(lines[1], format!("SKIPPED {test}: y is missing (z)"));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_cpu_guard_agrees_with_the_detector() {
        assert_eq!(
            lacking(&["avx2", "fma"]).is_empty(),
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        );
    }
}
