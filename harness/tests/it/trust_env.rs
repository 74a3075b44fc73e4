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
fn xray_in<S: AsRef<std::ffi::OsStr>>(cwd: &Path, args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(cwd)
        .env_remove("XRAY_VENV")
        .env_remove("XRAY_ORACLE_PATH")
        .args(args)
        .output()
        .expect("run xray")
}

/// `oracle --model <rand-a> --audio <fox> --out OUT EXTRA..` (absolute paths: the working
/// directory is a test's own folder).
fn oracle_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let model = root().join("fixtures/build/whisper-rand-a");
    let audio = root().join("fixtures/audio/fox.wav");
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let (model, audio, out) = (path(&model), path(&audio), path(out));
    let head = [
        "oracle", "--model", &model, "--audio", &audio, "--out", &out,
    ];
    head.iter().chain(extra).map(|a| a.to_string()).collect()
}

/// A hostile folder: `.venv/lib/python3.11/site-packages/x.pth` and `oracle/xray_oracle/__init__.py`
/// that each write a marker file when Python executes them. Returns the two marker paths.
fn plant(dir: &Path) -> (PathBuf, PathBuf) {
    let pth_marker = dir.join("PTH_RAN");
    let pkg_marker = dir.join("PACKAGE_RAN");
    let sp = dir.join(".venv/lib/python3.11/site-packages");
    std::fs::create_dir_all(&sp).unwrap();
    std::fs::write(dir.join(".venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    plant_script(&sp.join("x.pth"), &pth_marker, "pth executed", "");
    plant_script(
        &dir.join("oracle/xray_oracle/__init__.py"),
        &pkg_marker,
        "planted package imported",
        "def run(*a, **k):\n    raise SystemExit('planted package ran')\n",
    );
    (pth_marker, pkg_marker)
}

/// `file` (its folder created) holding Python that writes `text` to `marker` when it runs, on
/// one line (as a `.pth` file runs a line), then `extra`.
fn plant_script(file: &Path, marker: &Path, text: &str, extra: &str) {
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(
        file,
        format!(
            "import pathlib; pathlib.Path({:?}).write_text({text:?})\n{extra}",
            marker.display().to_string()
        ),
    )
    .unwrap();
}

fn fixtures_ready() -> bool {
    xray_core::testing::require_all(
        &["fixtures/build/whisper-rand-a/config.json", ".venv"],
        xray_core::testing::MAKE_FIXTURES,
    )
}

/// For a test with the fixtures ([`fixtures_ready`]): a temporary folder [`plant`]ed, and its two
/// markers.
fn planted() -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    if !fixtures_ready() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (pth, pkg) = plant(dir.path());
    Some((dir, pth, pkg))
}

#[test]
fn oracle_ignores_a_planted_venv_and_package_in_the_working_directory() {
    let Some((dir, pth, pkg)) = planted() else {
        return;
    };
    let out = dir.path().join("dump");
    let o = xray_in(dir.path(), &oracle_args(&out, &["--max-steps", "2"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!pth.exists(), "the planted .pth file ran: {err}");
    assert!(!pkg.exists(), "the planted xray_oracle package ran: {err}");
    assert_eq!(o.status.code(), Some(0), "{err}");
    // The real package wrote a real dump.
    let manifest = crate::common::read_json(&out.join("manifest.json"));
    assert_eq!(manifest["producer"], "oracle");
    assert!(manifest["checkpoints"].as_array().unwrap().len() > 10);
}

#[test]
fn doctor_reports_the_installation_environment_not_the_working_directory() {
    let Some((dir, pth, pkg)) = planted() else {
        return;
    };
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

/// A folder holding a hostile `xray_oracle` package at its top (what an empty
/// `XRAY_ORACLE_PATH` resolves to from there): importing it writes `marker`.
fn plant_top_level_package(dir: &Path, marker: &Path) {
    plant_script(
        &dir.join("xray_oracle/__init__.py"),
        marker,
        "empty XRAY_ORACLE_PATH imported the working directory",
        "",
    );
}

/// Issue 24 item 1: `XRAY_ORACLE_PATH=` (set but empty) resolved to the working directory and
/// `xray doctor` imported and ran the package planted there. Every variable X-Ray reads is now
/// refused when set but empty, naming it, before anything runs.
#[test]
fn set_but_empty_environment_variables_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("PLANTED_RAN");
    plant_top_level_package(dir.path(), &marker);
    let run = |var: &str, args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_xray"));
        c.current_dir(dir.path())
            .env_remove("XRAY_VENV")
            .env_remove("XRAY_ORACLE_PATH")
            .env_remove("XRAY_THREADS")
            .env(var, "")
            .args(args);
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        (o.status.code(), err)
    };
    for var in ["XRAY_ORACLE_PATH", "XRAY_VENV"] {
        let (code, err) = run(var, &["doctor"]);
        assert!(!marker.exists(), "{var}=: the planted package ran: {err}");
        assert_eq!(code, Some(2), "{var}=: {err}");
        assert!(err.contains(&format!("{var} is set but empty")), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let model = root().join("fixtures/build/whisper-rand-a");
    let (code, err) = run(
        "XRAY_THREADS",
        &["list", "--model", model.to_str().unwrap()],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("XRAY_THREADS=\"\" is not a positive integer"),
        "{err}"
    );
    // `xray --version` describes the environment without starting Python: the refusal is named.
    let o = Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(dir.path())
        .env_remove("XRAY_VENV")
        .env("XRAY_ORACLE_PATH", "")
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(v.contains("XRAY_ORACLE_PATH is set but empty"), "{v}");
    assert!(!marker.exists());
}

/// A foreign Python tree: `sitecustomize.py`, `usercustomize.py`, a startup file and a `numpy`
/// package, each writing a marker when Python executes it; and a user base whose site-packages
/// holds a `.pth` that does the same. Returns (the PYTHONPATH dir, the PYTHONUSERBASE dir,
/// the markers).
fn plant_foreign_python(dir: &Path) -> (PathBuf, PathBuf, Vec<PathBuf>) {
    let foreign = dir.join("foreign");
    let userbase = dir.join("userbase");
    let mut markers = vec![];
    let mut write = |file: PathBuf, marker_name: &str, extra: &str| {
        let marker = dir.join(marker_name);
        plant_script(&file, &marker, "ran", extra);
        markers.push(marker);
    };
    write(foreign.join("sitecustomize.py"), "SITECUSTOMIZE_RAN", "");
    write(foreign.join("usercustomize.py"), "USERCUSTOMIZE_RAN", "");
    write(foreign.join("startup.py"), "STARTUP_RAN", "");
    write(
        foreign.join("numpy/__init__.py"),
        "FOREIGN_NUMPY_IMPORTED",
        "__version__ = '0.0.foreign'\n",
    );
    for minor in 8..=14 {
        write(
            userbase.join(format!("lib/python3.{minor}/site-packages/evil.pth")),
            &format!("USER_SITE_PTH_RAN_3{minor}"),
            "",
        );
    }
    (foreign, userbase, markers)
}

/// Issue 24 item 3: with `PYTHONPATH` naming a foreign numpy, `xray check` panicked (`Failed to
/// access NumPy array API capsule`, exit 101) after the foreign `sitecustomize.py` ran;
/// `PYTHONHOME=/nonexistent` was a 30-line fatal error. The embedded interpreter is isolated
/// (`python -I`): PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE and the user site are
/// ignored; the venv is the only source.
#[test]
fn python_environment_variables_do_not_reach_the_embedded_interpreter() {
    if !fixtures_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (foreign, userbase, markers) = plant_foreign_python(dir.path());
    let with_env = |args: &[String]| {
        Command::new(env!("CARGO_BIN_EXE_xray"))
            .current_dir(dir.path())
            .env_remove("XRAY_VENV")
            .env_remove("XRAY_ORACLE_PATH")
            .env_remove("PYTHONNOUSERSITE")
            .env("PYTHONPATH", &foreign)
            .env("PYTHONHOME", "/nonexistent")
            .env("PYTHONUSERBASE", &userbase)
            .env("PYTHONSTARTUP", foreign.join("startup.py"))
            .env("PYTHONINSPECT", "1")
            .args(args)
            .output()
            .unwrap()
    };
    let out = dir.path().join("dump");
    let o = with_env(&oracle_args(&out, &["--max-steps", "2"]));
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    for m in &markers {
        assert!(!m.exists(), "{} ran: {err}", m.display());
    }
    assert!(
        !err.contains("panicked") && !err.contains("Fatal Python error"),
        "{err}"
    );
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.join("manifest.json").is_file());
    // doctor: the venv's numpy, and no foreign entry on sys.path.
    let o = with_env(&["doctor".to_string()]);
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(!text.contains(&foreign.display().to_string()), "{text}");
    assert!(!text.contains(&userbase.display().to_string()), "{text}");
    assert!(!text.contains("0.0.foreign"), "{text}");
    for m in &markers {
        assert!(!m.exists(), "{} ran: {text}", m.display());
    }
}

/// Issue 24 item 3: a numpy in the venv that lacks the C array API (broken, foreign, another
/// ABI) is one line naming it, exit 2, not the numpy crate's panic.
#[test]
fn a_broken_numpy_in_the_venv_is_one_line_not_a_panic() {
    if !fixtures_ready() {
        return;
    }
    // The interpreter's own site-packages come before the venv's: a numpy there would shadow
    // the broken one planted here.
    let python = std::env::var_os("PYO3_PYTHON").unwrap_or_else(|| "python3".into());
    let system_numpy = Command::new(python)
        .args(["-I", "-c", "import numpy"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if system_numpy {
        xray_core::testing::skip("the interpreter itself has numpy, which shadows the venv's");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let sp = venv.join("lib/python3.11/site-packages");
    for pkg in ["numpy", "torch", "transformers"] {
        std::fs::create_dir_all(sp.join(pkg)).unwrap();
        std::fs::write(sp.join(pkg).join("__init__.py"), "__version__ = '0.0'\n").unwrap();
    }
    std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    let out = dir.path().join("dump");
    let o = Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(dir.path())
        .env("XRAY_VENV", &venv)
        .env_remove("XRAY_ORACLE_PATH")
        .args(oracle_args(&out, &[]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(2), "{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("xray: error: oracle environment: numpy from ")
            && last.contains("does not provide the NumPy C array API"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
