//! X-Ray oracle: the HuggingFace transformers reference, run in-process through pyo3.
//!
//! The Python package `xray_oracle` (in `oracle/xray_oracle/`) loads the model with
//! `from_pretrained(local_files_only=True)` (never `trust_remote_code`, never a pickle), runs
//! transformers' own feature extractor and `generate`, and captures the checkpoints the family's
//! contract names with forward hooks. This crate finds the project's `.venv` without the user
//! activating anything, holds the interpreter once per run, and copies the arrays out into
//! ndarray before it lets go of the interpreter. A Python exception becomes
//! [`OracleError::Python`] carrying the formatted traceback.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use numpy::PyReadonlyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use xray_runtime::capture::Captured;
use xray_runtime::dump::{DumpWriter, Manifest};
use xray_runtime::Layout;

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
    /// A Python exception, with its formatted traceback.
    #[error("oracle raised in Python:\n{traceback}")]
    Python {
        /// `traceback.format_exception` output.
        traceback: String,
    },
    /// The oracle returned something that does not fit the contract.
    #[error("oracle returned bad data: {0}")]
    Data(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, OracleError>;

fn py_err(py: Python<'_>, e: PyErr) -> OracleError {
    let tb = (|| -> PyResult<String> {
        let tbm = py.import("traceback")?;
        let lines = tbm.call_method1("format_exception", (e.value(py),))?;
        let parts: Vec<String> = lines.extract()?;
        Ok(parts.concat())
    })()
    .unwrap_or_else(|_| e.to_string());
    OracleError::Python { traceback: tb }
}

/// Where the oracle's Python lives.
#[derive(Debug, Clone)]
pub struct Oracle {
    /// The venv's site-packages.
    pub site_packages: PathBuf,
    /// The directory that contains the `xray_oracle` package.
    pub package_root: PathBuf,
}

/// One reference run request.
#[derive(Debug, Clone)]
pub struct OracleRequest {
    /// Family (`whisper`, `granite_nar`).
    pub family: String,
    /// HF model directory.
    pub model_dir: PathBuf,
    /// WAV file.
    pub audio: PathBuf,
    /// The family's contract text (from `xray_runtime::contract::contract_text`).
    pub contract: String,
    /// `float32` (default) or `float64` (calibration).
    pub dtype: String,
    /// Cap on generated tokens.
    pub max_new_tokens: Option<usize>,
    /// Teacher forcing (granite: CTC hypothesis ids).
    pub teacher: Option<Vec<i64>>,
    /// Only these checkpoint globs.
    pub only: Option<Vec<String>>,
    /// torch thread count.
    pub threads: Option<usize>,
}

impl OracleRequest {
    /// A float32 request with no options.
    pub fn new(family: &str, model_dir: &Path, audio: &Path, contract: &str) -> Self {
        OracleRequest {
            family: family.to_string(),
            model_dir: model_dir.to_path_buf(),
            audio: audio.to_path_buf(),
            contract: contract.to_string(),
            dtype: "float32".into(),
            max_new_tokens: None,
            teacher: None,
            only: None,
            threads: None,
        }
    }
}

/// What the reference produced.
#[derive(Debug, Clone, Default)]
pub struct OracleRun {
    /// Token sequence (Whisper: prefix + generated incl. EOS; NAR: final ids).
    pub tokens: Vec<i64>,
    /// Transcript.
    pub transcript: String,
    /// Captured checkpoints in capture order.
    pub checkpoints: Vec<Captured>,
    /// python, torch, transformers, numpy versions.
    pub tools: BTreeMap<String, String>,
    /// sha256 of the weights file.
    pub weights_sha256: String,
    /// sha256 of the audio file.
    pub audio_sha256: String,
    /// Family extras (e.g. `hypothesis`).
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl OracleRun {
    /// A dump writer holding this run (`producer = oracle`).
    pub fn to_dump(&self, family: &str, model_id: &str) -> DumpWriter {
        let mut w = DumpWriter::new(Manifest {
            schema: xray_runtime::dump::SCHEMA.into(),
            version: xray_runtime::dump::VERSION,
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
        });
        for c in &self.checkpoints {
            w.add(&c.name, c.step, c.layout, &c.data);
        }
        w
    }
}

fn find_up(start: &Path, rel: &str) -> Option<PathBuf> {
    start.ancestors().map(|a| a.join(rel)).find(|p| p.exists())
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
    /// Find the venv and the package: `XRAY_VENV` / `XRAY_ORACLE_PATH` if set, else the nearest
    /// `.venv` and `oracle/xray_oracle` above the current directory or the executable, else the
    /// source checkout this crate was built from.
    pub fn discover() -> Result<Oracle> {
        let fix = "run `make venv` in the X-Ray checkout (or set XRAY_VENV to a venv made from oracle/requirements.txt)";
        let mut starts: Vec<PathBuf> = Vec::new();
        if let Ok(c) = std::env::current_dir() {
            starts.push(c);
        }
        if let Ok(e) = std::env::current_exe() {
            starts.push(e);
        }
        starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let venv = match std::env::var_os("XRAY_VENV") {
            Some(v) => PathBuf::from(v),
            None => starts
                .iter()
                .find_map(|s| find_up(s, ".venv"))
                .ok_or_else(|| OracleError::Environment {
                    reason: "no .venv found above the current directory".into(),
                    fix: fix.into(),
                })?,
        };
        let site_packages = site_packages_in(&venv).ok_or_else(|| OracleError::Environment {
            reason: format!("{} has no lib/python3.*/site-packages", venv.display()),
            fix: fix.into(),
        })?;
        let package_root = match std::env::var_os("XRAY_ORACLE_PATH") {
            Some(p) => PathBuf::from(p),
            None => starts
                .iter()
                .find_map(|s| find_up(s, "oracle/xray_oracle"))
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .ok_or_else(|| OracleError::Environment {
                    reason: "the xray_oracle Python package (oracle/xray_oracle) was not found".into(),
                    fix: "run xray from the X-Ray checkout or set XRAY_ORACLE_PATH to its oracle/ directory".into(),
                })?,
        };
        Ok(Oracle {
            site_packages,
            package_root,
        })
    }

    /// Run Python with the venv and package on sys.path, checking the reference stack imports.
    pub fn with_python<T>(
        &self,
        f: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyModule>) -> Result<T>,
    ) -> Result<T> {
        Python::with_gil(|py| {
            let setup = (|| -> PyResult<()> {
                let site = py.import("site")?;
                site.call_method1(
                    "addsitedir",
                    (self.site_packages.to_string_lossy().to_string(),),
                )?;
                let sys = py.import("sys")?;
                let path = sys.getattr("path")?;
                let root = self.package_root.to_string_lossy().to_string();
                let has: bool = path
                    .call_method1("__contains__", (root.clone(),))?
                    .extract()?;
                if !has {
                    path.call_method1("insert", (0, root))?;
                }
                Ok(())
            })();
            setup.map_err(|e| py_err(py, e))?;
            for (m, pkg) in [
                ("numpy", "numpy"),
                ("torch", "torch"),
                ("transformers", "transformers"),
            ] {
                if py.import(m).is_err() {
                    return Err(OracleError::Environment {
                        reason: format!(
                            "Python package '{pkg}' is not importable from {}",
                            self.site_packages.display()
                        ),
                        fix: "run `make venv`".into(),
                    });
                }
            }
            let module = py.import("xray_oracle").map_err(|e| py_err(py, e))?;
            f(py, &module)
        })
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
            let res = m
                .call_method(
                    "run",
                    (
                        req.family.as_str(),
                        req.model_dir.to_string_lossy().to_string(),
                        req.audio.to_string_lossy().to_string(),
                        req.contract.as_str(),
                    ),
                    Some(&kw),
                )
                .map_err(|e| py_err(py, e))?;
            extract_run(py, &res)
        })
    }
}

fn get<'py>(py: Python<'py>, d: &Bound<'py, PyAny>, key: &str) -> Result<Bound<'py, PyAny>> {
    d.get_item(key)
        .map_err(|e| OracleError::Data(format!("result has no '{key}': {}", py_err(py, e))))
}

fn extract_run(py: Python<'_>, res: &Bound<'_, PyAny>) -> Result<OracleRun> {
    let data = |e: PyErr| OracleError::Data(py_err(py, e).to_string());
    let tokens: Vec<i64> = get(py, res, "tokens")?.extract().map_err(data)?;
    let transcript: String = get(py, res, "transcript")?.extract().map_err(data)?;
    let tools: BTreeMap<String, String> = get(py, res, "tools")?.extract().map_err(data)?;
    let weights_sha256: String = get(py, res, "weights_sha256")?.extract().map_err(data)?;
    let audio_sha256: String = get(py, res, "audio_sha256")?.extract().map_err(data)?;
    let mut extra = BTreeMap::new();
    if let Ok(h) = res.get_item("hypothesis") {
        if let Ok(v) = h.extract::<Vec<i64>>() {
            extra.insert("hypothesis".to_string(), serde_json::json!(v));
        }
    }
    let cps = get(py, res, "checkpoints")?;
    let mut checkpoints = Vec::new();
    for item in cps.try_iter().map_err(data)? {
        let item = item.map_err(data)?;
        let name: String = get(py, &item, "name")?.extract().map_err(data)?;
        let step: usize = get(py, &item, "step")?.extract().map_err(data)?;
        let layout_s: String = get(py, &item, "layout")?.extract().map_err(data)?;
        let layout: Layout = serde_json::from_value(serde_json::Value::String(layout_s.clone()))
            .map_err(|_| {
                OracleError::Data(format!("{name}@step{step}: unknown layout '{layout_s}'"))
            })?;
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
                "{name}@step{step}: array is not a float32/float64 numpy array"
            )));
        };
        checkpoints.push(Captured {
            name,
            step,
            layout,
            data,
        });
    }
    Ok(OracleRun {
        tokens,
        transcript,
        checkpoints,
        tools,
        weights_sha256,
        audio_sha256,
        extra,
    })
}

/// The PyTorch-eager half of `xray bench`: a Whisper model loaded once in the interpreter, timed
/// one operation per call so the caller can interleave it with the runtime.
pub struct TorchBench {
    oracle: Oracle,
    handle: Py<PyAny>,
}

impl TorchBench {
    /// Load HF Whisper from `model_dir` (f32, eager attention, `threads` intra-op threads).
    pub fn whisper(
        oracle: &Oracle,
        model_dir: &Path,
        audio: &Path,
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

    /// Seconds for one encoder forward on the 30 s window.
    pub fn encoder(&self) -> Result<f64> {
        self.oracle.with_python(|py, _| {
            self.handle
                .bind(py)
                .call_method0("encoder")
                .and_then(|r| r.extract())
                .map_err(|e| py_err(py, e))
        })
    }

    /// Seconds and generated-token count for one greedy generate on precomputed encoder outputs
    /// (the encoder is not timed), capped at `max_new_tokens`.
    pub fn decode(&self, max_new_tokens: usize) -> Result<(f64, usize)> {
        self.oracle.with_python(|py, _| {
            self.handle
                .bind(py)
                .call_method1("decode", (max_new_tokens,))
                .and_then(|r| r.extract())
                .map_err(|e| py_err(py, e))
        })
    }

    /// Seconds and generated-token count for one greedy generate capped at `max_new_tokens`.
    pub fn generate(&self, max_new_tokens: usize) -> Result<(f64, usize)> {
        self.oracle.with_python(|py, _| {
            self.handle
                .bind(py)
                .call_method1("generate", (max_new_tokens,))
                .and_then(|r| r.extract())
                .map_err(|e| py_err(py, e))
        })
    }
}
