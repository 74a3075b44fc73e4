//! X-Ray oracle: the HuggingFace transformers reference, run in-process through pyo3.
//!
//! The Python package `xray_oracle` (in `oracle/xray_oracle/`) loads the model with
//! `from_pretrained(local_files_only=True)` (never `trust_remote_code`, never a pickle), runs
//! transformers' own feature extractor and `generate`, and captures the checkpoints the family's
//! contract names with forward hooks. This crate finds the project's `.venv` without the user
//! activating anything, holds the interpreter once per run, and copies the arrays out into
//! ndarray before it lets go of the interpreter. A Python exception becomes
//! [`OracleError::Python`] carrying the formatted traceback.

// Unsafe code only in `interpreter` (starting the embedded interpreter isolated, through the C
// API's PyConfig); everything else is safe.
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use xray_core::Step;

use numpy::PyReadonlyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict, PyList, PyTuple};
use xray_core::capture::Captured;
use xray_core::dump::{content_sha256, DumpWriter, Entry, Manifest, Stats};
use xray_core::ops::{is_point, PointSelect};
use xray_core::Layout;

mod replay;
pub use replay::{ReplayRequest, Replayed};
/// The request type lives in `xray-core` (no Python): the reference cache keys it in an `xray`
/// built without the oracle too.
pub use xray_core::reference::OracleRequest;

/// Oracle errors.
#[derive(Debug, thiserror::Error)]
pub enum OracleError {
    /// The Python environment is missing or incomplete.
    #[error("oracle environment: {reason}. Fix: {fix}")]
    Environment {
        /// What is missing.
        reason: String,
        /// The command that fixes it.
        fix: String,
    },
    /// A known input error the oracle refused on purpose (`OracleInputError` and its
    /// subclasses): one line naming the file and the fix.
    #[error("{message}")]
    Input {
        /// The exception's message (one line).
        message: String,
        /// `traceback.format_exception` output (shown with `xray -v`).
        traceback: String,
    },
    /// An unexpected Python exception: one line (type, message, where) on display; the full
    /// traceback is kept for `xray -v` / `XRAY_TRACEBACK=1`.
    #[error("oracle raised {summary} (run with -v or XRAY_TRACEBACK=1 for the Python traceback)")]
    Python {
        /// `Type: message (at file:line in function)`.
        summary: String,
        /// `traceback.format_exception` output.
        traceback: String,
    },
    /// The oracle returned something that does not fit the contract.
    #[error("oracle returned bad data: {0}")]
    Data(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, OracleError>;

impl OracleError {
    /// The full Python traceback, when the error came from a Python exception.
    pub fn traceback(&self) -> Option<&str> {
        match self {
            OracleError::Input { traceback, .. } | OracleError::Python { traceback, .. } => {
                Some(traceback)
            }
            _ => None,
        }
    }
}

/// Collapse a message to one line (tracebacks and multi-line messages stay behind `-v`).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn py_err(py: Python<'_>, e: PyErr) -> OracleError {
    let tb = (|| -> PyResult<String> {
        let tbm = py.import("traceback")?;
        // pyo3 keeps the traceback beside the value: pass it explicitly.
        let lines = tbm.call_method1(
            "format_exception",
            (e.get_type(py), e.value(py), e.traceback(py)),
        )?;
        let parts: Vec<String> = lines.extract()?;
        Ok(parts.concat())
    })()
    .unwrap_or_else(|_| e.to_string());
    let value = e.value(py);
    let message = value
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| e.to_string());
    // Input errors: the oracle's own `OracleInputError` (every input refusal subclasses it).
    let is_input = py
        .import("xray_oracle.errors")
        .and_then(|m| m.getattr("OracleInputError"))
        .map(|cls| value.is_instance(&cls).unwrap_or(false))
        .unwrap_or(false);
    if is_input {
        return OracleError::Input {
            message: one_line(&message),
            traceback: tb,
        };
    }
    let ty = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    // Where: the innermost frame of the traceback.
    let place = (|| -> PyResult<String> {
        let tbm = py.import("traceback")?;
        let Some(tbo) = e.traceback(py) else {
            return Ok(String::new());
        };
        let frames = tbm.call_method1("extract_tb", (tbo,))?;
        let n: usize = frames.len()?;
        if n == 0 {
            return Ok(String::new());
        }
        let last = frames.get_item(n - 1)?;
        let file: String = last.getattr("filename")?.extract()?;
        let line: usize = last.getattr("lineno")?.extract()?;
        let func: String = last.getattr("name")?.extract()?;
        Ok(format!(" (at {file}:{line} in {func})"))
    })()
    .unwrap_or_default();
    OracleError::Python {
        summary: format!("{ty}: {}{place}", one_line(&message)),
        traceback: tb,
    }
}

/// Where the oracle's Python lives, and why it was taken from there.
#[derive(Debug, Clone)]
pub struct Oracle {
    /// The venv directory.
    pub venv: PathBuf,
    /// The venv's site-packages.
    pub site_packages: PathBuf,
    /// The directory that contains the `xray_oracle` package.
    pub package_root: PathBuf,
    /// Why this venv: `XRAY_VENV`, or the X-Ray checkout it belongs to.
    pub venv_source: String,
    /// Why this package root: `XRAY_ORACLE_PATH`, or the X-Ray checkout it belongs to.
    pub package_source: String,
}

/// What the reference produced.
#[derive(Debug, Clone, Default)]
pub struct OracleRun {
    /// Token sequence (Whisper: prefix + generated incl. EOS; NAR: final ids).
    pub tokens: Vec<i64>,
    /// Transcript.
    pub transcript: String,
    /// Captured checkpoints in capture order, then the op-level points the request asked for
    /// (names `{module}:{in|out}`, `xray_core::ops::is_point`), in firing order.
    pub checkpoints: Vec<Captured>,
    /// python, torch, transformers, numpy versions.
    pub tools: BTreeMap<String, String>,
    /// sha256 of the weights file.
    pub weights_sha256: String,
    /// sha256 of the audio file.
    pub audio_sha256: String,
    /// Family extras (e.g. `hypothesis`).
    pub extra: BTreeMap<String, serde_json::Value>,
    /// A stats-only run's checkpoints ([`OracleRequest::stats_only`]): manifest entries with
    /// `stats` and `content_sha256`, no tensor, in the contract's order.
    pub summaries: Vec<Entry>,
}

impl OracleRun {
    /// A dump writer holding this run (`producer = oracle`).
    pub fn to_dump(&self, family: &str, model_id: &str) -> DumpWriter {
        let mut w = DumpWriter::new(Manifest {
            schema: xray_core::dump::SCHEMA.into(),
            version: xray_core::dump::VERSION,
            family: family.into(),
            model_id: model_id.into(),
            producer: "oracle".into(),
            weights_sha256: self.weights_sha256.clone(),
            audio_sha256: self.audio_sha256.clone(),
            tools: self.tools.clone(),
            tokens: self.tokens.clone(),
            transcript: self.transcript.clone(),
            stats_only: false,
            checkpoints: Vec::new(),
            extra: self.extra.clone(),
            engine_weights: None,
        });
        for c in &self.checkpoints {
            w.add(&c.name, c.step, c.layout, &c.data);
        }
        w
    }
}

/// The X-Ray checkout an executable or source directory belongs to: the nearest ancestor that
/// holds both `oracle/xray_oracle/__init__.py` and `core/contracts` (the installation's own
/// files, never the working directory's).
fn checkout_of(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|a| {
            a.join("oracle/xray_oracle/__init__.py").is_file() && a.join("core/contracts").is_dir()
        })
        .map(Path::to_path_buf)
}

/// The `xray_parity` wheel's layout: the running executable is
/// `<site-packages>/xray_parity/bin/xray` and `<site-packages>/xray_oracle/__init__.py` is
/// installed beside it (the wheel ships both). Returns the site-packages and the executable.
fn wheel_layout() -> Option<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().ok()?;
    let exe = exe.canonicalize().unwrap_or(exe);
    let bin = exe.parent()?;
    let pkg = bin.parent()?;
    let sp = pkg.parent()?;
    (bin.file_name()? == "bin"
        && pkg.file_name()? == "xray_parity"
        && sp.join("xray_oracle/__init__.py").is_file())
    .then(|| (sp.to_path_buf(), exe.clone()))
}

/// The venv of an installed wheel: `site_packages` is `<venv>/lib/python3.X/site-packages` and
/// `<venv>/pyvenv.cfg` exists; else an error (installed outside a venv: XRAY_VENV names one).
fn wheel_venv(site_packages: &Path, exe: &Path) -> Result<PathBuf> {
    let venv = site_packages
        .parent()
        .and_then(Path::parent)
        .filter(|lib| lib.file_name().is_some_and(|n| n == "lib"))
        .and_then(Path::parent)
        .filter(|v| v.join("pyvenv.cfg").is_file());
    venv.map(Path::to_path_buf)
        .ok_or_else(|| OracleError::Environment {
            reason: format!(
                "the xray_parity wheel holding {} is installed outside a venv ({} is not <venv>/lib/python3.X/site-packages with a pyvenv.cfg)",
                exe.display(),
                site_packages.display()
            ),
            fix: "install the wheel into a venv (`python3 -m venv`; `pip install 'xray_parity[oracle]'` for the reference), or set XRAY_VENV to one".into(),
        })
}

/// The installation roots the oracle may come from, in order, with the reason for each: the
/// checkout holding the running executable (`target/release/xray`), then the checkout this crate
/// was compiled from (`CARGO_MANIFEST_DIR` at build time), unless the executable is the one an
/// installed `xray_parity` wheel carries (its installation is its venv: [`wheel_layout`]; the
/// machine that built the wheel is no place to look). The working directory is never one.
fn installation_roots() -> Vec<(PathBuf, String)> {
    let mut roots: Vec<(PathBuf, String)> = Vec::new();
    if wheel_layout().is_some() {
        return roots;
    }
    if let Ok(exe) = std::env::current_exe() {
        let exe = exe.canonicalize().unwrap_or(exe);
        if let Some(r) = checkout_of(&exe) {
            roots.push((
                r,
                format!(
                    "the X-Ray checkout holding the executable {}",
                    exe.display()
                ),
            ));
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(r) = checkout_of(built) {
        if !roots.iter().any(|(p, _)| p == &r) {
            roots.push((
                r,
                "the X-Ray checkout this binary was built from (CARGO_MANIFEST_DIR)".into(),
            ));
        }
    }
    roots
}

/// An explicit path from the environment variable `var`: refused when set but empty (an empty
/// path is the working directory, whose code X-Ray never runs) and made absolute (a relative one
/// is resolved once, so what is imported and what `xray doctor` shows is one place), then refused
/// unless `ok` holds of it (the reason: `unless`).
fn explicit_path(
    var: &str,
    value: std::ffi::OsString,
    fix: &str,
    (ok, unless): (fn(&Path) -> bool, &str),
) -> Result<PathBuf> {
    if value.to_string_lossy().trim().is_empty() {
        return Err(OracleError::Environment {
            reason: format!(
                "{var} is set but empty (an empty path is the working directory, which X-Ray never imports from)"
            ),
            fix: fix.into(),
        });
    }
    let p = PathBuf::from(value);
    let p = p.canonicalize().unwrap_or(p);
    if !ok(&p) {
        return Err(OracleError::Environment {
            reason: format!("{var}={} {unless}", p.display()),
            fix: fix.into(),
        });
    }
    Ok(p)
}

fn site_packages_in(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let rd = std::fs::read_dir(&lib).ok()?;
    let mut found: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found.pop()
}

impl Oracle {
    /// Find the venv and the package: `XRAY_VENV` / `XRAY_ORACLE_PATH` if set, else, for the
    /// executable of an installed `xray_parity` wheel, the venv it is installed in and the
    /// `xray_oracle` package the wheel installed beside it, else the X-Ray checkout that holds the
    /// running executable, else the checkout this crate was built from (its `.venv` and
    /// `oracle/`). Never the working directory or its parents: a `.venv` there
    /// could hold `.pth` files, which Python executes.
    pub fn discover() -> Result<Oracle> {
        let fix = "run `make venv` in the X-Ray checkout (or set XRAY_VENV to a venv made from oracle/requirements.txt)";
        let roots = installation_roots();
        let wheel = wheel_layout();
        let (venv, venv_source) = match std::env::var_os("XRAY_VENV") {
            Some(v) => (
                explicit_path(
                    "XRAY_VENV",
                    v,
                    "point XRAY_VENV at a venv made from oracle/requirements.txt, or unset it",
                    (|v| v.is_dir(), "is not a directory"),
                )?,
                "XRAY_VENV".to_string(),
            ),
            None if wheel.is_some() => {
                let (sp, exe) = wheel.clone().unwrap_or_default();
                (
                    wheel_venv(&sp, &exe)?,
                    format!(
                        "the venv the xray_parity wheel is installed in (the executable {})",
                        exe.display()
                    ),
                )
            }
            None => roots
                .iter()
                .map(|(r, why)| (r.join(".venv"), why.clone()))
                .find(|(v, _)| v.is_dir())
                .ok_or_else(|| OracleError::Environment {
                    reason: format!(
                        "no .venv in the X-Ray installation ({})",
                        if roots.is_empty() {
                            "no X-Ray checkout holds this executable".to_string()
                        } else {
                            roots
                                .iter()
                                .map(|(r, _)| r.display().to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    ),
                    fix: fix.into(),
                })?,
        };
        let site_packages = site_packages_in(&venv).ok_or_else(|| OracleError::Environment {
            reason: format!("{} has no lib/python3.*/site-packages", venv.display()),
            fix: fix.into(),
        })?;
        let (package_root, package_source) = match std::env::var_os("XRAY_ORACLE_PATH") {
            Some(p) => (
                explicit_path(
                    "XRAY_ORACLE_PATH",
                    p,
                    "point XRAY_ORACLE_PATH at the X-Ray checkout's oracle/ directory, or unset it",
                    (
                        |p| p.join("xray_oracle/__init__.py").is_file(),
                        "has no xray_oracle/__init__.py",
                    ),
                )?,
                "XRAY_ORACLE_PATH".to_string(),
            ),
            None if wheel.is_some() => (
                wheel.clone().unwrap_or_default().0,
                "installed by the xray_parity wheel beside the executable".to_string(),
            ),
            None => roots
                .iter()
                .map(|(r, why)| (r.join("oracle"), why.clone()))
                .next()
                .ok_or_else(|| OracleError::Environment {
                    reason: "the xray_oracle Python package was not found: no X-Ray checkout holds this executable".into(),
                    fix: "run the xray built in the X-Ray checkout, or set XRAY_ORACLE_PATH to its oracle/ directory".into(),
                })?,
        };
        Ok(Oracle {
            venv,
            site_packages,
            package_root,
            venv_source,
            package_source,
        })
    }

    /// The version of distribution `name` (`torch`, `transformers`) installed in the venv, read
    /// from its `*.dist-info/METADATA` (`Name:` and `Version:`, as `importlib.metadata` reads
    /// them) without starting Python or importing anything. An error names the site-packages
    /// when none is installed, or when two are (a stale copy left beside a newer one).
    pub fn distribution_version(&self, name: &str) -> Result<String> {
        let norm = |s: &str| s.to_ascii_lowercase().replace(['-', '.'], "_");
        let env = |reason: String| OracleError::Environment {
            reason,
            fix: "run `make venv` (oracle/requirements.txt)".into(),
        };
        let rd = std::fs::read_dir(&self.site_packages)
            .map_err(|e| env(format!("{}: {e}", self.site_packages.display())))?;
        let mut found: Vec<(String, PathBuf)> = Vec::new();
        for e in rd.flatten() {
            let dir = e.path();
            let fname = e.file_name().to_string_lossy().to_string();
            let Some(stem) = fname.strip_suffix(".dist-info") else {
                continue;
            };
            if !norm(stem).starts_with(&format!("{}_", norm(name))) {
                continue;
            }
            let meta = dir.join("METADATA");
            let Ok(text) = std::fs::read_to_string(&meta) else {
                continue;
            };
            let field = |key: &str| {
                text.lines()
                    .take_while(|l| !l.is_empty())
                    .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            };
            if field("Name:").is_some_and(|n| norm(&n) == norm(name)) {
                match field("Version:") {
                    Some(v) if !v.is_empty() => found.push((v, meta)),
                    _ => return Err(env(format!("{} has no Version:", meta.display()))),
                }
            }
        }
        match found.as_slice() {
            [(v, _)] => Ok(v.clone()),
            [] => Err(env(format!(
                "no {name} distribution is installed in {} (no {name}-*.dist-info)",
                self.site_packages.display()
            ))),
            many => Err(env(format!(
                "{} {name} distributions are installed in {}: {}",
                many.len(),
                self.site_packages.display(),
                many.iter()
                    .map(|(v, m)| format!("{v} ({})", m.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Where the environment is, for `xray --version` (never starts Python).
    pub fn describe(&self) -> String {
        format!(
            "oracle venv: {} ({})\noracle package: {} ({})",
            self.venv.display(),
            self.venv_source,
            self.package_root.join("xray_oracle").display(),
            self.package_source
        )
    }

    /// What `xray doctor` reports: the imported package's file, python, numpy, torch,
    /// transformers versions, the interpreter's libpython and sys.path. Imports torch.
    pub fn environment_report(&self) -> Result<Vec<(String, String)>> {
        self.with_python(|py, m| {
            let e = |e: PyErr| py_err(py, e);
            let mut out: Vec<(String, String)> = Vec::new();
            let file: String = m.getattr("__file__").and_then(|f| f.extract()).map_err(e)?;
            out.push(("xray_oracle".into(), file));
            let sys = py.import("sys").map_err(e)?;
            let version: String = sys
                .getattr("version")
                .and_then(|v| v.extract())
                .map_err(e)?;
            out.push(("python".into(), one_line(&version)));
            for name in ["numpy", "torch", "transformers"] {
                let v: String = py
                    .import(name)
                    .and_then(|mm| mm.getattr("__version__"))
                    .and_then(|v| v.str().map(|s| s.to_string()))
                    .map_err(e)?;
                let f: String = py
                    .import(name)
                    .and_then(|mm| mm.getattr("__file__"))
                    .and_then(|f| f.extract())
                    .unwrap_or_default();
                out.push((name.into(), format!("{v} ({f})")));
            }
            out.push(("libpython".into(), loaded_libpython()));
            let path: Vec<String> = sys.getattr("path").and_then(|p| p.extract()).map_err(e)?;
            out.push(("sys.path".into(), path.join(":")));
            Ok(out)
        })
    }

    /// Run Python with the venv and package on sys.path, checking the reference stack imports.
    /// The interpreter is started isolated ([`interpreter::start_isolated`]): no `PYTHON*`
    /// variable, user site-packages or working directory is read; the venv is the only source.
    pub fn with_python<T>(
        &self,
        f: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyModule>) -> Result<T>,
    ) -> Result<T> {
        interpreter::start_isolated().map_err(|why| OracleError::Environment {
            reason: format!("the embedded Python interpreter did not start: {why}"),
            fix: "check the Python installation X-Ray was built with (PYO3_PYTHON; PYTHONHOME and PYTHONPATH are ignored)".into(),
        })?;
        Python::attach(|py| {
            let setup = (|| -> PyResult<()> {
                let site = py.import("site")?;
                site.call_method1(
                    "addsitedir",
                    (self.site_packages.to_string_lossy().to_string(),),
                )?;
                let sys = py.import("sys")?;
                let path = sys.getattr("path")?;
                let root = self.package_root.to_string_lossy().to_string();
                // No entry may name the working directory ('' or its path): modules there
                // must never shadow the installation's.
                let cwd = std::env::current_dir()
                    .map(|c| c.to_string_lossy().to_string())
                    .unwrap_or_default();
                let entries: Vec<String> = path.extract()?;
                for entry in entries {
                    if entry.is_empty() || entry == "." || (entry == cwd && entry != root) {
                        path.call_method1("remove", (entry,))?;
                    }
                }
                let has: bool = path
                    .call_method1("__contains__", (root.clone(),))?
                    .extract()?;
                if !has {
                    path.call_method1("insert", (0, root))?;
                }
                Ok(())
            })();
            setup.map_err(|e| py_err(py, e))?;
            // Located, not imported: torch loads only once the inputs have passed the oracle's
            // own checks (a bad file or argument is refused in well under a second).
            let util = py.import("importlib.util").map_err(|e| py_err(py, e))?;
            for (m, pkg) in [
                ("numpy", "numpy"),
                ("torch", "torch"),
                ("transformers", "transformers"),
            ] {
                let found = util
                    .call_method1("find_spec", (m,))
                    .map(|spec| !spec.is_none())
                    .unwrap_or(false);
                if !found {
                    return Err(OracleError::Environment {
                        reason: format!(
                            "Python package '{pkg}' is not importable from {}",
                            self.site_packages.display()
                        ),
                        fix: "run `make venv`".into(),
                    });
                }
            }
            self.check_numpy(py)?;
            let module = py.import("xray_oracle").map_err(|e| py_err(py, e))?;
            // The family descriptors Python dispatches by: core's, handed over before the first
            // call (Python lists no family of its own; `xray_oracle.families`). Once per process:
            // the interpreter and its modules are the process's.
            static REGISTERED: AtomicBool = AtomicBool::new(false);
            if !REGISTERED.load(Ordering::Acquire) {
                let descriptors = xray_core::family::descriptors_json()
                    .map_err(|e| OracleError::Data(format!("family descriptors: {e}")))?;
                py.import("xray_oracle.families")
                    .and_then(|m| m.call_method1("register", (descriptors,)))
                    .map_err(|e| py_err(py, e))?;
                REGISTERED.store(true, Ordering::Release);
            }
            f(py, &module)
        })
    }

    /// numpy imports and gives the C array API the `numpy` crate needs (its capsule): checked
    /// once here, so a broken or foreign numpy is one line naming it, not a panic at the first
    /// array (`Failed to access NumPy array API capsule`).
    fn check_numpy(&self, py: Python<'_>) -> Result<()> {
        let env = |what: String| OracleError::Environment {
            reason: format!("numpy from {}: {what}", self.site_packages.display()),
            fix: "run `make venv` (numpy from oracle/requirements.txt)".into(),
        };
        let np = py.import("numpy").map_err(|e| {
            env(format!(
                "does not import ({})",
                one_line(&py_err(py, e).to_string())
            ))
        })?;
        let file: String = np
            .getattr("__file__")
            .and_then(|f| f.extract())
            .unwrap_or_else(|_| "?".into());
        // The numpy crate panics when the capsule is missing or of another ABI: probe it with
        // one tiny array, the panic caught and its message kept (the default hook silenced so
        // nothing but the one line is printed).
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(numpy::PyArray1::<f32>::zeros(py, [1], false));
        }));
        std::panic::set_hook(hook);
        match probe {
            Ok(_) => Ok(()),
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown failure".into());
                Err(env(format!(
                    "{file} does not provide the NumPy C array API ({})",
                    one_line(&msg)
                )))
            }
        }
    }

    /// Run the reference for one input and copy every captured checkpoint out.
    pub fn run(&self, req: &OracleRequest) -> Result<OracleRun> {
        self.with_python(|py, m| {
            let kw = PyDict::new(py);
            let e = |e: PyErr| py_err(py, e);
            kw.set_item("dtype", req.dtype.as_str()).map_err(e)?;
            if let Some(n) = req.max_new_tokens {
                kw.set_item("max_new_tokens", n).map_err(e)?;
            }
            if let Some(t) = &req.teacher {
                kw.set_item("teacher", PyList::new(py, t).map_err(e)?)
                    .map_err(e)?;
            }
            if let Some(o) = &req.only {
                kw.set_item("only", PyList::new(py, o).map_err(e)?)
                    .map_err(e)?;
            }
            if let Some(n) = req.threads {
                kw.set_item("threads", n).map_err(e)?;
            }
            match &req.ops {
                PointSelect::None => {}
                PointSelect::All => kw.set_item("ops", "all").map_err(e)?,
                PointSelect::Only(names) => {
                    if !names.is_empty() {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        kw.set_item("ops", PyList::new(py, names).map_err(e)?)
                            .map_err(e)?;
                    }
                }
            }
            if let Some(x) = &req.samples {
                kw.set_item("samples", numpy::PyArray1::from_slice(py, x))
                    .map_err(e)?;
            }
            if let Some(h) = &req.audio_sha256 {
                kw.set_item("audio_sha256", h.as_str()).map_err(e)?;
            }
            let summaries: Summaries = Arc::default();
            if req.stats_only {
                if req.dtype != "float32" || !req.ops.is_none() {
                    return Err(OracleError::Data(
                        "a stats-only reference run is float32 with no op-level points".into(),
                    ));
                }
                kw.set_item("summarize", summarizer(py, summaries.clone()).map_err(e)?)
                    .map_err(e)?;
            }
            if let Some(v) = &req.weights_variant {
                kw.set_item("weights_variant", v.as_str()).map_err(e)?;
            }
            let res = m
                .call_method(
                    "run",
                    (
                        req.family.as_str(),
                        req.model_dir.to_string_lossy().to_string(),
                        req.audio.to_string_lossy().to_string(),
                        req.contract.resolved_json().to_string(),
                    ),
                    Some(&kw),
                )
                .map_err(|e| py_err(py, e))?;
            let extras = &xray_core::family::descriptor(&req.family)
                .map_err(|e| OracleError::Input {
                    message: e.to_string(),
                    traceback: String::new(),
                })?
                .reference_extras;
            let mut run = extract_run(
                py,
                &res,
                &req.ops,
                extras,
                req.stats_only.then_some(&summaries),
            )?;
            // Op-level points have no contract entry: their shapes are HF's own.
            req.contract
                .check_shapes(
                    run.checkpoints
                        .iter()
                        .filter(|c| !is_point(&c.name))
                        .map(|c| (c.name.as_str(), c.step, c.data.shape()))
                        .chain(
                            run.summaries
                                .iter()
                                .map(|s| (s.name.as_str(), s.step, s.shape.as_slice())),
                        ),
                )
                .map_err(|e| OracleError::Data(format!("the reference's checkpoints: {e}")))?;
            // What the reference computed on, hashed by Python: it must be what was sent.
            let fed: Option<String> = res
                .get_item("samples_sha256")
                .ok()
                .and_then(|v| v.extract().ok());
            if let Some(mut c) = req.audio_conversion.clone() {
                let sent = c.get("samples_sha256").and_then(|v| v.as_str()).map(str::to_string);
                if sent.is_some() && fed != sent {
                    return Err(OracleError::Data(format!(
                        "{}: the reference computed on samples with sha256 {:?}, not the {:?} it was sent",
                        req.audio.display(),
                        fed,
                        sent
                    )));
                }
                if let Some(obj) = c.as_object_mut() {
                    obj.insert("oracle_samples_sha256".into(), serde_json::json!(fed));
                }
                run.extra.insert("audio".into(), c);
            }
            Ok(run)
        })
    }
}

/// Starting the embedded interpreter the way `python -I` starts: the only unsafe code of the crate.
#[allow(unsafe_code)]
mod interpreter {
    use std::ffi::CStr;
    use std::sync::OnceLock;

    use pyo3::ffi;

    /// The message of a failed `PyStatus` (`function: message`, or the exit code).
    ///
    /// # Safety
    /// `st` comes from a CPython initialization call: `func` and `err_msg` are NULL or static C
    /// strings.
    unsafe fn status_text(st: &ffi::PyStatus) -> String {
        let text = |p: *const std::ffi::c_char| {
            if p.is_null() {
                None
            } else {
                // SAFETY: non-NULL, and CPython's status strings are static NUL-terminated C
                // strings (the caller's contract).
                Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            }
        };
        match (text(st.func), text(st.err_msg)) {
            (Some(f), Some(m)) => format!("{f}: {m}"),
            (None, Some(m)) => m,
            _ => format!("exit status {}", st.exitcode),
        }
    }

    /// Start the interpreter once per process, isolated as `python -I` is: the environment
    /// (`PYTHONPATH`, `PYTHONHOME`, `PYTHONSTARTUP`, `PYTHONUSERBASE`, every `PYTHON*`) is
    /// ignored, there is no user site-packages and no working-directory entry on `sys.path`; UTF-8
    /// mode (paths arrive from Rust as UTF-8). A failure is kept and returned on every call (one
    /// line; the interpreter is never started a second time). An interpreter someone else
    /// started first is left as it is.
    pub(super) fn start_isolated() -> Result<(), String> {
        static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
        STARTED
            .get_or_init(|| {
                // SAFETY: called once (OnceLock) before any other Python API of this process
                // (pyo3 is only used after it, inside `Python::attach`); the configs are
                // initialised by CPython's own Init functions before they are read, cleared after
                // use, and the GIL this thread holds after initialization is released with
                // PyEval_SaveThread exactly as pyo3's own initialization does.
                unsafe {
                    if ffi::Py_IsInitialized() != 0 {
                        return Ok(());
                    }
                    let mut pre = std::mem::MaybeUninit::<ffi::PyPreConfig>::uninit();
                    ffi::PyPreConfig_InitIsolatedConfig(pre.as_mut_ptr());
                    let mut pre = pre.assume_init();
                    pre.utf8_mode = 1;
                    pre.configure_locale = 1;
                    let st = ffi::Py_PreInitialize(&pre);
                    if ffi::PyStatus_Exception(st) != 0 {
                        return Err(status_text(&st));
                    }
                    let mut config = std::mem::MaybeUninit::<ffi::PyConfig>::uninit();
                    ffi::PyConfig_InitIsolatedConfig(config.as_mut_ptr());
                    let mut config = config.assume_init();
                    let st = ffi::Py_InitializeFromConfig(&config);
                    ffi::PyConfig_Clear(&mut config);
                    if ffi::PyStatus_Exception(st) != 0 {
                        return Err(status_text(&st));
                    }
                    ffi::PyEval_SaveThread();
                }
                Ok(())
            })
            .clone()
    }
}

/// The libpython this process has mapped (from /proc/self/maps), or the reason it is unknown.
fn loaded_libpython() -> String {
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| {
                Path::new(p)
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libpython"))
            })
            .map(str::to_string)
            .unwrap_or_else(|| "statically linked (no libpython mapped)".into()),
        Err(e) => format!("unknown (/proc/self/maps: {e})"),
    }
}

fn get<'py>(py: Python<'py>, d: &Bound<'py, PyAny>, key: &str) -> Result<Bound<'py, PyAny>> {
    d.get_item(key)
        .map_err(|e| OracleError::Data(format!("result has no '{key}': {}", py_err(py, e))))
}

/// What a stats-only run's summarizer collects: each captured array's [`Stats`] and content sha256,
/// in call order.
type Summaries = Arc<Mutex<Vec<(Stats, String)>>>;

/// The Python callable a stats-only run summarizes each captured array with: `summarize(array)`
/// takes a C-contiguous float32 numpy array, pushes its [`Stats::of`] and [`content_sha256`] onto
/// `sink` and returns their index (the array is not kept).
fn summarizer<'py>(py: Python<'py>, sink: Summaries) -> PyResult<Bound<'py, PyCFunction>> {
    PyCFunction::new_closure(
        py,
        Some(c"summarize"),
        Some(c"X-Ray stats-only capture: summarize(float32 array) -> index"),
        move |args: &Bound<'_, PyTuple>, _kw: Option<&Bound<'_, PyDict>>| -> PyResult<usize> {
            let arr = args.get_item(0)?;
            let ro = arr.extract::<PyReadonlyArrayDyn<f32>>()?;
            let view = ro.as_array();
            let std = view.as_standard_layout();
            let slice = std.as_slice().ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err("summarize: array is not contiguous")
            })?;
            let summary = (Stats::of(slice), content_sha256(slice));
            let mut v = sink
                .lock()
                .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("summarize: poisoned"))?;
            v.push(summary);
            Ok(v.len() - 1)
        },
    )
}

/// A checkpoint dict's `name`, `step` and `layout` (a known [`Layout`]).
fn entry_head(py: Python<'_>, item: &Bound<'_, PyAny>) -> Result<(String, usize, Layout)> {
    let data = |e: PyErr| OracleError::Data(py_err(py, e).to_string());
    let name: String = get(py, item, "name")?.extract().map_err(data)?;
    let step: Step = get(py, item, "step")?.extract().map_err(data)?;
    let layout_s: String = get(py, item, "layout")?.extract().map_err(data)?;
    let layout: Layout = serde_json::from_value(serde_json::Value::String(layout_s.clone()))
        .map_err(|_| {
            OracleError::Data(format!(
                "{}: unknown layout '{layout_s}'",
                xray_core::key(&name, step)
            ))
        })?;
    Ok((name, step, layout))
}

/// A stats-only run's `checkpoints`: `{name, step, layout, shape, summary}` dicts, `summary`
/// an index into what [`summarizer`] collected (each used once).
fn extract_summaries(
    py: Python<'_>,
    list: &Bound<'_, PyAny>,
    collected: &Mutex<Vec<(Stats, String)>>,
) -> Result<Vec<Entry>> {
    let data = |e: PyErr| OracleError::Data(py_err(py, e).to_string());
    let collected = collected
        .lock()
        .map_err(|_| OracleError::Data("stats-only summaries: lock poisoned".into()))?;
    let mut used = vec![false; collected.len()];
    let mut out = Vec::new();
    for item in list.try_iter().map_err(data)? {
        let item = item.map_err(data)?;
        let (name, step, layout) = entry_head(py, &item)?;
        let shape: Vec<usize> = get(py, &item, "shape")?.extract().map_err(data)?;
        let i: usize = get(py, &item, "summary")?.extract().map_err(data)?;
        let (stats, sha) = collected.get(i).ok_or_else(|| {
            OracleError::Data(format!(
                "{}: summary {i} was never made ({} were)",
                xray_core::key(&name, step),
                collected.len()
            ))
        })?;
        if std::mem::replace(&mut used[i], true) {
            return Err(OracleError::Data(format!(
                "{}: summary {i} is claimed by two checkpoints",
                xray_core::key(&name, step)
            )));
        }
        if stats.count != shape.iter().product::<usize>() {
            return Err(OracleError::Data(format!(
                "{}: summary of {} values for shape {shape:?}",
                xray_core::key(&name, step),
                stats.count
            )));
        }
        out.push(Entry {
            name,
            step,
            shape,
            dtype: xray_core::dump::Dtype::F32,
            layout,
            file: None,
            sha256: None,
            stats: Some(stats.clone()),
            content_sha256: Some(sha.clone()),
            token_positions: None,
            logits_processed: None,
        });
    }
    Ok(out)
}

fn extract_run(
    py: Python<'_>,
    res: &Bound<'_, PyAny>,
    ops: &PointSelect,
    extras: &BTreeMap<String, xray_core::family::ExtraKind>,
    summaries: Option<&Summaries>,
) -> Result<OracleRun> {
    let data = |e: PyErr| OracleError::Data(py_err(py, e).to_string());
    let tokens: Vec<i64> = get(py, res, "tokens")?.extract().map_err(data)?;
    let transcript: String = get(py, res, "transcript")?.extract().map_err(data)?;
    let tools: BTreeMap<String, String> = get(py, res, "tools")?.extract().map_err(data)?;
    let weights_sha256: String = get(py, res, "weights_sha256")?.extract().map_err(data)?;
    let audio_sha256: String = get(py, res, "audio_sha256")?.extract().map_err(data)?;
    let mut extra = BTreeMap::new();
    if let Ok(v) = res.get_item("weights_variant") {
        if !v.is_none() {
            let text: String = py
                .import("json")
                .and_then(|j| j.call_method1("dumps", (v,)))
                .and_then(|s| s.extract())
                .map_err(data)?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|x| OracleError::Data(format!("weights_variant: {x}")))?;
            extra.insert("reference_variant".to_string(), json);
        }
    }
    // The extras the family's descriptor declares, each of its declared kind (absent is allowed:
    // a run that has none, e.g. a decode that produced no hypothesis, returns None).
    for (name, kind) in extras {
        let Ok(v) = res.get_item(name.as_str()) else {
            continue;
        };
        if v.is_none() {
            continue;
        }
        let json = match kind {
            xray_core::family::ExtraKind::TokenIds => {
                let ids: Vec<i64> = v.extract().map_err(|e| {
                    OracleError::Data(format!(
                        "extra '{name}': not a list of token ids ({})",
                        py_err(py, e)
                    ))
                })?;
                serde_json::json!(ids)
            }
        };
        extra.insert(name.clone(), json);
    }
    if let Some(collected) = summaries {
        let summaries = extract_summaries(py, &get(py, res, "checkpoints")?, collected)?;
        if let Some(bad) = summaries.iter().find(|c| is_point(&c.name)) {
            return Err(OracleError::Data(format!(
                "contract checkpoint list holds the op-level point {}",
                xray_core::key(&bad.name, bad.step)
            )));
        }
        return Ok(OracleRun {
            tokens,
            transcript,
            checkpoints: Vec::new(),
            tools,
            weights_sha256,
            audio_sha256,
            extra,
            summaries,
        });
    }
    let mut checkpoints = extract_entries(py, &get(py, res, "checkpoints")?)?;
    if let Some(bad) = checkpoints.iter().find(|c| is_point(&c.name)) {
        return Err(OracleError::Data(format!(
            "contract checkpoint list holds the op-level point {}",
            xray_core::key(&bad.name, bad.step)
        )));
    }
    // Op-level points, after the contract's checkpoints, in the order Python returned them
    // (firing order). Only what was asked for, and everything asked for is Python's to check.
    let points = match res.get_item("op_points") {
        Ok(p) => extract_entries(py, &p)?,
        Err(_) if ops.is_none() => Vec::new(),
        Err(_) => {
            return Err(OracleError::Data(
                "op-level points were requested but the result has no 'op_points'".into(),
            ))
        }
    };
    for p in &points {
        if !is_point(&p.name) {
            return Err(OracleError::Data(format!(
                "op_points entry {} is not a point name ({{module}}:in or {{module}}:out)",
                xray_core::key(&p.name, p.step)
            )));
        }
        if !ops.wants(&p.name) {
            return Err(OracleError::Data(format!(
                "op_points holds {}, which the request did not ask for",
                xray_core::key(&p.name, p.step)
            )));
        }
    }
    checkpoints.extend(points);
    Ok(OracleRun {
        tokens,
        transcript,
        checkpoints,
        tools,
        weights_sha256,
        audio_sha256,
        extra,
        summaries: Vec::new(),
    })
}

/// A list of {name, step, layout, array} dicts, copied out of the interpreter.
fn extract_entries(py: Python<'_>, list: &Bound<'_, PyAny>) -> Result<Vec<Captured>> {
    let data = |e: PyErr| OracleError::Data(py_err(py, e).to_string());
    let mut checkpoints = Vec::new();
    for item in list.try_iter().map_err(data)? {
        let item = item.map_err(data)?;
        let (name, step, layout) = entry_head(py, &item)?;
        let arr = get(py, &item, "array")?;
        // One copy out of the interpreter; comparison code never touches Python. A float64 run
        // (calibration) is narrowed to f32 here: that rounding is half an f32 ULP, far below the
        // f32-vs-f64 noise floor it is used to measure.
        let data = if let Ok(ro) = arr.extract::<PyReadonlyArrayDyn<f32>>() {
            ro.as_array().as_standard_layout().into_owned()
        } else if let Ok(ro) = arr.extract::<PyReadonlyArrayDyn<f64>>() {
            ro.as_array().mapv(|v| v as f32)
        } else {
            return Err(OracleError::Data(format!(
                "{}: array is not a float32/float64 numpy array",
                xray_core::key(&name, step)
            )));
        };
        checkpoints.push(Captured {
            name,
            step,
            layout,
            data,
        });
    }
    Ok(checkpoints)
}

/// The PyTorch-eager half of `xray bench`: a Whisper model loaded once in the interpreter, timed
/// one operation per call so the caller can interleave it with the runtime.
pub struct TorchBench {
    oracle: Oracle,
    handle: Py<PyAny>,
}

impl TorchBench {
    /// Load HF Whisper from `model_dir` (f32; SDPA and eager attention; CTranslate2 on the same
    /// weights when installed; `threads` intra-op threads), fed
    /// `samples`: `audio` as the runtime's reader decoded and converted it (the same samples the
    /// runtime is timed on).
    pub fn whisper(
        oracle: &Oracle,
        model_dir: &Path,
        audio: &Path,
        samples: &[f32],
        threads: usize,
    ) -> Result<TorchBench> {
        let handle = oracle.with_python(|py, _m| {
            let bench = py.import("xray_oracle.bench").map_err(|e| py_err(py, e))?;
            let h = bench
                .getattr("WhisperBench")
                .and_then(|c| {
                    c.call1((
                        model_dir.to_string_lossy().to_string(),
                        audio.to_string_lossy().to_string(),
                        threads,
                        numpy::PyArray1::from_slice(py, samples),
                    ))
                })
                .map_err(|e| py_err(py, e))?;
            Ok(h.unbind())
        })?;
        Ok(TorchBench {
            oracle: oracle.clone(),
            handle,
        })
    }

    /// Seconds for one encoder forward on the 30 s window by `anchor` (`sdpa`: transformers'
    /// default attention, `eager`, or `ct2`: CTranslate2); `None` when the anchor is absent
    /// ([`TorchBench::info`] says why).
    pub fn encoder(&self, anchor: &str) -> Result<Option<f64>> {
        self.call("encoder", (anchor,))
    }

    /// Seconds and output-token count for one greedy generate by `anchor` on precomputed encoder
    /// outputs (the encoder is not timed), capped at `max_new_tokens`; `None` when the anchor is
    /// absent.
    pub fn decode(&self, max_new_tokens: usize, anchor: &str) -> Result<Option<(f64, usize)>> {
        self.call("decode", (max_new_tokens, anchor))
    }

    /// JSON text: the CPU model, library versions, and why the CTranslate2 anchor is absent
    /// (`ct2_absent`, null when present).
    pub fn info(&self) -> Result<String> {
        self.call("info", ())
    }

    /// Seconds and generated-token count for one greedy generate capped at `max_new_tokens`.
    pub fn generate(&self, max_new_tokens: usize) -> Result<(f64, usize)> {
        self.call("generate", (max_new_tokens,))
    }

    /// `method(*args)` on the Python bench object, its result extracted as `T`; a Python error
    /// (the call's or the extraction's) as [`py_err`] renders it.
    fn call<T>(&self, method: &str, args: impl for<'py> pyo3::call::PyCallArgs<'py>) -> Result<T>
    where
        T: for<'py> FromPyObjectOwned<'py>,
    {
        self.oracle.with_python(|py, _| {
            self.handle
                .bind(py)
                .call_method1(method, args)
                .and_then(|r| r.extract().map_err(Into::into))
                .map_err(|e| py_err(py, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An installed wheel's venv is the one holding its site-packages (`pyvenv.cfg`); a
    /// site-packages outside a venv, or not under `lib/`, is an error naming XRAY_VENV.
    #[test]
    fn the_wheel_venv_is_the_one_holding_its_site_packages() {
        let dir = tempfile::tempdir().unwrap();
        let exe = Path::new("/x/xray_parity/bin/xray");
        let sp = dir.path().join("v/lib/python3.11/site-packages");
        std::fs::create_dir_all(&sp).unwrap();
        let e = wheel_venv(&sp, exe).unwrap_err().to_string();
        assert!(
            e.contains("outside a venv") && e.contains("XRAY_VENV"),
            "{e}"
        );
        std::fs::write(dir.path().join("v/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert_eq!(wheel_venv(&sp, exe).unwrap(), dir.path().join("v"));
        let odd = dir.path().join("v/other/python3.11/site-packages");
        std::fs::create_dir_all(&odd).unwrap();
        assert!(wheel_venv(&odd, exe).is_err());
        // This test binary is no wheel's executable: the checkout rules apply.
        assert!(wheel_layout().is_none());
    }

    /// A distribution's version comes from its dist-info (`Name:` matched normalized, the local
    /// label kept); none, or two, is an error naming the site-packages.
    #[test]
    fn distribution_versions_are_read_from_dist_info() {
        let dir = tempfile::tempdir().unwrap();
        let sp = dir.path().join("lib/python3.11/site-packages");
        let dist = |stem: &str, meta: &str| {
            let d = sp.join(format!("{stem}.dist-info"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("METADATA"), meta).unwrap();
        };
        dist(
            "torch-2.11.0+cpu",
            "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cpu\n\nVersion: 9.9 in the body\n",
        );
        dist("torchaudio-2.11.0", "Name: torchaudio\nVersion: 2.11.0\n");
        dist(
            "Transformers-5.24.0",
            "Name: Transformers\nVersion: 5.24.0\n",
        );
        let o = Oracle {
            venv: dir.path().to_path_buf(),
            site_packages: sp.clone(),
            package_root: dir.path().to_path_buf(),
            venv_source: "test".into(),
            package_source: "test".into(),
        };
        assert_eq!(o.distribution_version("torch").unwrap(), "2.11.0+cpu");
        assert_eq!(o.distribution_version("transformers").unwrap(), "5.24.0");
        let err = o.distribution_version("numpy").unwrap_err().to_string();
        assert!(
            err.contains("no numpy distribution") && err.contains("site-packages"),
            "{err}"
        );
        dist("torch-2.10.0", "Name: torch\nVersion: 2.10.0\n");
        let err = o.distribution_version("torch").unwrap_err().to_string();
        assert!(err.contains("2 torch distributions"), "{err}");
    }
}
