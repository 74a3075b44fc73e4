//! Issue 10 item 1: the oracle's Python environment comes from the binary's own installation (or
//! an explicit XRAY_VENV / XRAY_ORACLE_PATH), never from the working directory. A folder that
//! plants a `.venv` with a `.pth` file and an `oracle/xray_oracle` package must not run any of it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("checkout root")
}

/// `xray` with `cwd` as the working directory and no explicit environment variables.
fn xray_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(cwd)
        .env_remove("XRAY_VENV")
        .env_remove("XRAY_ORACLE_PATH")
        .args(args)
        .output()
        .expect("run xray")
}

/// A hostile folder: `.venv/lib/python3.11/site-packages/x.pth` and `oracle/xray_oracle/__init__.py`
/// that each write a marker file when Python executes them. Returns the two marker paths.
fn plant(dir: &Path) -> (PathBuf, PathBuf) {
    let pth_marker = dir.join("PTH_RAN");
    let pkg_marker = dir.join("PACKAGE_RAN");
    let sp = dir.join(".venv/lib/python3.11/site-packages");
    std::fs::create_dir_all(&sp).unwrap();
    std::fs::write(dir.join(".venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    std::fs::write(
        sp.join("x.pth"),
        format!(
            "import pathlib; pathlib.Path({:?}).write_text('pth executed')\n",
            pth_marker.display().to_string()
        ),
    )
    .unwrap();
    let pkg = dir.join("oracle/xray_oracle");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("__init__.py"),
        format!(
            "import pathlib\npathlib.Path({:?}).write_text('planted package imported')\n\
             def run(*a, **k):\n    raise SystemExit('planted package ran')\n",
            pkg_marker.display().to_string()
        ),
    )
    .unwrap();
    (pth_marker, pkg_marker)
}

fn fixtures_ready() -> bool {
    let ok = root()
        .join("fixtures/build/whisper-rand-a/config.json")
        .is_file()
        && root().join(".venv").exists();
    if !ok && std::env::var_os("XRAY_REQUIRE_FIXTURES").is_some() {
        panic!("fixtures or .venv missing (run `make fixtures`)");
    }
    ok
}

#[test]
fn oracle_ignores_a_planted_venv_and_package_in_the_working_directory() {
    if !fixtures_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (pth, pkg) = plant(dir.path());
    let model = root().join("fixtures/build/whisper-rand-a");
    let audio = root().join("fixtures/audio/fox.wav");
    let out = dir.path().join("dump");
    let o = xray_in(
        dir.path(),
        &[
            "oracle",
            "--model",
            model.to_str().unwrap(),
            "--audio",
            audio.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--max-steps",
            "2",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!pth.exists(), "the planted .pth file ran: {err}");
    assert!(!pkg.exists(), "the planted xray_oracle package ran: {err}");
    assert_eq!(o.status.code(), Some(0), "{err}");
    // The real package wrote a real dump.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["producer"], "oracle");
    assert!(manifest["checkpoints"].as_array().unwrap().len() > 10);
}

#[test]
fn doctor_reports_the_installation_environment_not_the_working_directory() {
    if !fixtures_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (pth, pkg) = plant(dir.path());
    let o = xray_in(dir.path(), &["doctor"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!pth.exists(), "the planted .pth file ran: {text}");
    assert!(!pkg.exists(), "the planted xray_oracle package ran: {text}");
    assert_eq!(o.status.code(), Some(0), "{text}");
    let real_pkg = root().join("oracle/xray_oracle");
    assert!(
        text.contains(&real_pkg.display().to_string()),
        "doctor names the package it imported ({}): {text}",
        real_pkg.display()
    );
    assert!(!text.contains(&dir.path().display().to_string()), "{text}");
    for key in ["python", "torch", "transformers", "libpython"] {
        assert!(text.contains(key), "doctor reports {key}: {text}");
    }
    // `--version` says where the environment is, also from a hostile folder.
    let o = xray_in(dir.path(), &["--version"]);
    let v = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0));
    assert!(v.contains(&real_pkg.display().to_string()), "{v}");
    assert!(!v.contains(&dir.path().display().to_string()), "{v}");
    assert!(!pth.exists() && !pkg.exists());
}

#[test]
fn explicit_xray_venv_that_does_not_exist_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-venv");
    let o = Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(dir.path())
        .env("XRAY_VENV", &missing)
        .env_remove("XRAY_ORACLE_PATH")
        .arg("doctor")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("XRAY_VENV") && err.contains("no-such-venv"),
        "{err}"
    );
}
