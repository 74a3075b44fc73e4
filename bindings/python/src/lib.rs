//! `xray_parity._native`: the Python bindings of X-Ray's comparison library (`xray-compare`) and
//! the core's dump format (`xray-core`). The Python package `xray_parity` wraps these functions
//! (python/xray_parity/__init__.py); nothing here is X-Ray logic of its own: each function calls
//! the one the CLI calls, so Python and `xray` give the same evidence, text and bytes.
//!
//! Errors are one line (the library error and its causes, as the CLI prints them) raised as
//! `xray_parity.XrayError`; nothing panics across the boundary (pyo3 turns a panic into
//! `PanicException`, but no code path here unwraps).

#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use xray_core::Step;

use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use xray_compare::corpus::{gate_corpus, Corpus};
use xray_compare::evidence::{Evidence, RunDumps, Verdict};
use xray_compare::gate::{gate, junit_xml, GateOptions, GateReport};
use xray_compare::offline::{compare_dumps_evidence, op_level, OfflineOptions, PointGraph};
use xray_compare::suppression::Suppression;
use xray_compare::tolerance::Policy;
use xray_core::dump::{Dump, DumpWriter, LogitsProcessed, Manifest, TokenPositions};
use xray_core::Layout;

create_exception!(
    _native,
    XrayError,
    PyException,
    "An X-Ray input or comparison error: one line naming the file and the fix (the CLI's exit 2)."
);

/// The error and its causes on one line (`context: cause: cause`), as anyhow's `{:#}` prints.
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}

fn err<E: std::error::Error + 'static>(e: E) -> PyErr {
    XrayError::new_err(one_line(&e))
}

fn msg(m: impl Into<String>) -> PyErr {
    XrayError::new_err(m.into())
}

fn absolute(p: &Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// A loaded `xray.dump` directory (checked end to end by `Dump::load`: manifest, file hashes,
/// shapes, dtypes).
#[pyclass(module = "xray_parity._native", frozen)]
struct NativeDump {
    dump: Dump,
}

#[pymethods]
impl NativeDump {
    /// The dump directory.
    #[getter]
    fn dir(&self) -> String {
        self.dump.dir.display().to_string()
    }

    /// The manifest as JSON text (`json.loads` it for a dict).
    fn manifest_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.dump.manifest).map_err(err)
    }

    /// `(name, step)` of every checkpoint, in manifest order.
    fn keys(&self) -> Vec<(String, usize)> {
        self.dump
            .manifest
            .checkpoints
            .iter()
            .map(|e| (e.name.clone(), e.step))
            .collect()
    }

    /// Files in the directory its manifest does not list (never read).
    #[getter]
    fn unlisted(&self) -> Vec<String> {
        self.dump.unlisted.clone()
    }

    /// The tensor of checkpoint `name` at `step` as a float32 array (a copy); `KeyError` when the
    /// dump does not hold it, `XrayError` for a stats-only dump (it holds summaries only).
    fn array<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        step: Step,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        if self.dump.manifest.stats_only {
            return Err(msg(format!(
                "{}: a stats-only dump holds summaries, not tensors (checkpoint {})",
                self.dump.dir.display(),
                xray_core::key(name, step)
            )));
        }
        match self.dump.get(name, step) {
            Some(t) => Ok(t.clone().into_pyarray(py)),
            None => Err(pyo3::exceptions::PyKeyError::new_err(format!(
                "{} is not in {}",
                xray_core::key(name, step),
                self.dump.dir.display()
            ))),
        }
    }
}

/// An `xray.evidence/v1` document.
#[pyclass(module = "xray_parity._native", frozen)]
struct NativeEvidence {
    ev: Evidence,
}

#[pymethods]
impl NativeEvidence {
    /// `pass`, `diverged`, ... (the evidence's verdict).
    #[getter]
    fn verdict(&self) -> &'static str {
        self.ev.verdict.as_str()
    }

    /// True when the verdict is `pass`.
    #[getter]
    fn passed(&self) -> bool {
        self.ev.verdict == Verdict::Pass
    }

    /// The evidence as JSON text (what `--evidence` writes).
    fn to_json(&self) -> PyResult<String> {
        self.ev.to_json().map_err(err)
    }

    /// What `xray check` / `xray compare` print on stderr (`xray: verdict ...` and the rest).
    fn summary(&self) -> String {
        xray_compare::report::summary(&self.ev)
    }

    /// One line: the verdict line and the first divergence (`report::headline`).
    fn headline(&self) -> String {
        xray_compare::report::headline(&self.ev)
    }

    /// The self-contained HTML report (`--report`).
    fn html(&self) -> String {
        xray_compare::report::html(&self.ev)
    }

    /// The Markdown report (`--markdown`).
    fn markdown(&self) -> String {
        xray_compare::report::markdown(&self.ev)
    }

    /// Writes the evidence JSON to `path` atomically.
    fn write(&self, path: PathBuf) -> PyResult<()> {
        let json = self.ev.to_json().map_err(err)?;
        xray_compare::evidence::write_atomic(&path, json.as_bytes()).map_err(err)
    }
}

/// The result of a gate.
#[pyclass(module = "xray_parity._native", frozen)]
struct NativeGate {
    report: GateReport,
}

#[pymethods]
impl NativeGate {
    /// True when no finding fails.
    #[getter]
    fn passed(&self) -> bool {
        self.report.passed()
    }

    /// Every checkpoint id checked.
    #[getter]
    fn checked(&self) -> Vec<String> {
        self.report.checked.clone()
    }

    /// `(failing, message)` per finding, in check order.
    #[getter]
    fn findings(&self) -> Vec<(bool, String)> {
        self.report
            .findings
            .iter()
            .map(|f| (f.failing, f.message.clone()))
            .collect()
    }

    /// What `xray gate` prints.
    fn text(&self) -> String {
        self.report.text()
    }

    /// The JUnit XML `xray gate --junit` writes.
    fn junit_xml(&self) -> PyResult<String> {
        junit_xml(&self.report).map_err(err)
    }
}

/// Loads and checks a dump directory.
#[pyfunction]
fn load_dump(py: Python<'_>, dir: PathBuf) -> PyResult<NativeDump> {
    let dump = py.detach(|| Dump::load(&dir)).map_err(err)?;
    Ok(NativeDump { dump })
}

/// Loads and checks an evidence file.
#[pyfunction]
fn load_evidence(path: PathBuf) -> PyResult<NativeEvidence> {
    Ok(NativeEvidence {
        ev: Evidence::load(&path).map_err(err)?,
    })
}

/// Parses evidence JSON text (`source` names it in errors).
#[pyfunction]
fn evidence_from_json(text: &str, source: &str) -> PyResult<NativeEvidence> {
    Ok(NativeEvidence {
        ev: Evidence::from_json(text, source).map_err(err)?,
    })
}

/// `xray compare REF GOT [--policy FILE] [--require-all] [--isolated DIR]... [--variant DIR]...`
/// without `--model`: the evidence, and the console lines the CLI prints before its summary.
/// The contract is resolved from the reference dump's `extra.config`, or from `config_json`
/// (a model's config.json text, `config_source` naming it).
#[pyfunction]
#[pyo3(signature = (reference, got, policy=None, require_all=false, isolated=vec![], variants=vec![], config_json=None, config_source=None, generation_config=None))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    reference: PathBuf,
    got: PathBuf,
    policy: Option<PathBuf>,
    require_all: bool,
    isolated: Vec<PathBuf>,
    variants: Vec<PathBuf>,
    config_json: Option<String>,
    config_source: Option<String>,
    generation_config: Option<PathBuf>,
) -> PyResult<(NativeEvidence, Vec<String>)> {
    py.detach(|| -> PyResult<(NativeEvidence, Vec<String>)> {
        let policy = match &policy {
            Some(p) => Policy::load(p).map_err(err)?,
            None => Policy::default(),
        };
        let ref_dump = Dump::load(&reference).map_err(err)?;
        let got_dump = Dump::load(&got).map_err(err)?;
        let load_all = |v: &[PathBuf]| -> PyResult<Vec<Dump>> {
            v.iter().map(|d| Dump::load(d).map_err(err)).collect()
        };
        let iso = load_all(&isolated)?;
        let var = load_all(&variants)?;
        let source = config_source.unwrap_or_else(|| "config_json".into());
        let config = match config_json {
            Some(text) => Some((
                serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|e| msg(format!("{source}: {e}")))?,
                source,
            )),
            None => None,
        };
        let suppression = match &generation_config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| msg(format!("{}: {e}", p.display())))?;
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| msg(format!("{}: {e}", p.display())))?;
                Some(Suppression::from_config(&v, &p.display().to_string()).map_err(msg)?)
            }
            None => None,
        };
        // Declared precision (`extra.precision`) is named; without X-Ray's runtime graph here,
        // nothing is accepted, and a policy accepting a precision is refused (`xray compare
        // --model DIR` applies it).
        let ops = xray_compare::precision::declared(&got_dump).map_err(err)?;
        let (policy, precision) =
            xray_compare::precision::declare(policy, &got_dump, ops, None).map_err(err)?;
        let offline = compare_dumps_evidence(
            &ref_dump,
            &got_dump,
            OfflineOptions {
                config,
                suppression,
                policy,
                require_all,
                isolated: iso.iter().collect(),
                variants: var.iter().collect(),
                dump_paths: Some(RunDumps {
                    reference: absolute(&reference),
                    got: absolute(&got),
                    got_weights_sha256: None,
                }),
            },
        )
        .map_err(err)?;
        let mut ev = offline.evidence;
        if let Some(p) = precision {
            ev.notes.push(p.summary());
            ev.precision = Some(p);
        }
        if !offline.stats_only {
            // The reference's points in firing order (no runtime graph here); no oracle, so no
            // reference replay: the note says what `xray compare --model DIR` would add.
            let nodes = |step: Step| PointGraph::firing_order(&ref_dump, step);
            let graph = PointGraph {
                nodes: &nodes,
                weight: None,
                source: PointGraph::FIRING_ORDER,
            };
            op_level(
                &mut ev,
                &ref_dump,
                &got_dump,
                &offline.contract,
                &offline.options.policy,
                &graph,
                &mut |op, _| {
                    vec![format!(
                        "replay: not run from Python; `xray compare --model DIR` re-runs {} through the HF reference on the engine's own input",
                        op.module
                    )]
                },
            );
        }
        Ok((NativeEvidence { ev }, offline.console))
    })
}

fn evidence_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<Evidence>> {
    if let Ok(e) = obj.cast::<NativeEvidence>() {
        return Ok(Some(e.get().ev.clone()));
    }
    Ok(None)
}

/// `xray gate --evidence NEW --baseline OLD`: `new` and `baseline` are evidence objects, evidence
/// files, or both corpus evidence directories.
#[pyfunction]
#[pyo3(signature = (new, baseline, factor=None, rel_l2_floor=None, max_abs_floor=None, allow_different_input=false))]
fn gate_evidence(
    new: &Bound<'_, PyAny>,
    baseline: &Bound<'_, PyAny>,
    factor: Option<f64>,
    rel_l2_floor: Option<f64>,
    max_abs_floor: Option<f64>,
    allow_different_input: bool,
) -> PyResult<NativeGate> {
    let d = GateOptions::default();
    let opts = GateOptions {
        factor: factor.unwrap_or(d.factor),
        rel_l2_floor: rel_l2_floor.unwrap_or(d.rel_l2_floor),
        max_abs_floor: max_abs_floor.unwrap_or(d.max_abs_floor),
        allow_different_input,
    };
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if !(ok(opts.factor) && opts.factor >= 1.0 && ok(opts.rel_l2_floor) && ok(opts.max_abs_floor)) {
        return Err(msg("factor must be >= 1 and the floors finite and >= 0"));
    }
    let path = |o: &Bound<'_, PyAny>| -> PyResult<PathBuf> { o.extract::<PathBuf>() };
    let (n, b) = (evidence_of(new)?, evidence_of(baseline)?);
    let report = match (n, b) {
        (Some(n), Some(b)) => gate(&n, &b, &opts).map_err(err)?,
        (n, b) => {
            let (np, bp) = (
                n.is_none().then(|| path(new)).transpose()?,
                b.is_none().then(|| path(baseline)).transpose()?,
            );
            let dirs = (
                np.as_ref().is_some_and(|p| p.is_dir()),
                bp.as_ref().is_some_and(|p| p.is_dir()),
            );
            match dirs {
                (true, true) => {
                    let (np, bp) = (np.unwrap_or_default(), bp.unwrap_or_default());
                    let new = Corpus::load(&np).map_err(err)?;
                    let base = Corpus::load(&bp).map_err(err)?;
                    gate_corpus(&new, &base, &opts).map_err(|e| {
                        msg(format!(
                            "gating {} against {}: {}",
                            np.display(),
                            bp.display(),
                            one_line(&e)
                        ))
                    })?
                }
                (false, false) => {
                    let load = |e: Option<Evidence>, p: Option<PathBuf>| -> PyResult<Evidence> {
                        match (e, p) {
                            (Some(e), _) => Ok(e),
                            (None, Some(p)) => Evidence::load(&p).map_err(err),
                            (None, None) => Err(msg("no evidence given")),
                        }
                    };
                    let new = load(n, np)?;
                    let base = load(b, bp)?;
                    gate(&new, &base, &opts).map_err(err)?
                }
                _ => {
                    return Err(msg(
                        "new and baseline must both be evidence (objects or files) or both corpus directories",
                    ))
                }
            }
        }
    };
    Ok(NativeGate { report })
}

/// Writes a dump through the Rust `DumpWriter`: `manifest_json` is the manifest without
/// checkpoints (family, model_id, producer, identity, tools, tokens, transcript, extra,
/// engine_weights, stats_only); each entry `(name, step, layout, array, token_positions,
/// logits_processed)` is stored as f32.
#[pyfunction]
#[pyo3(signature = (out_dir, manifest_json, entries, overwrite=false))]
#[allow(clippy::type_complexity)]
fn write_dump(
    py: Python<'_>,
    out_dir: PathBuf,
    manifest_json: &str,
    entries: Vec<(
        String,
        usize,
        String,
        PyReadonlyArrayDyn<'_, f32>,
        Option<String>,
        Option<String>,
    )>,
    overwrite: bool,
) -> PyResult<String> {
    let mut manifest: Manifest = serde_json::from_str(manifest_json)
        .map_err(|e| msg(format!("manifest: {}", one_line(&e))))?;
    manifest.checkpoints.clear();
    let mut w = DumpWriter::new(manifest);
    for (name, step, layout, array, token_positions, logits_processed) in entries {
        let k = xray_core::key(&name, step);
        let layout: Layout = manifest_word(
            &k,
            "layout",
            &layout,
            "one of token_major, head_major, channel_major, plain",
        )?;
        let tp: Option<TokenPositions> = token_positions
            .map(|v| manifest_word(&k, "token_positions", &v, "\"last\""))
            .transpose()?;
        let lp: Option<LogitsProcessed> = logits_processed
            .map(|v| manifest_word(&k, "logits_processed", &v, "\"suppression\""))
            .transpose()?;
        let t = array.as_array().to_owned();
        w.add_declared(&name, step, layout, &t, tp, lp);
    }
    py.detach(|| w.write_to(&out_dir, overwrite)).map_err(err)?;
    Ok(absolute(&out_dir))
}

/// A manifest field's word (`field` of checkpoint `k`) as the core enum that names it (its serde
/// spelling); any other word is an error saying what is allowed (`allowed`).
fn manifest_word<T: serde::de::DeserializeOwned>(
    k: &impl std::fmt::Display,
    field: &str,
    word: &str,
    allowed: &str,
) -> PyResult<T> {
    serde_json::from_value(serde_json::Value::String(word.to_string()))
        .map_err(|_| msg(format!("checkpoint {k}: {field} {word:?} is not {allowed}")))
}

/// The X-Ray version these bindings were built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// A checkpoint's id, `name@stepK`: Rust's one spelling (`xray_core::key`), for the Python API's
/// messages.
#[pyfunction]
fn key(name: &str, step: usize) -> String {
    xray_core::key(name, step).to_string()
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("XrayError", m.py().get_type::<XrayError>())?;
    m.add_class::<NativeDump>()?;
    m.add_class::<NativeEvidence>()?;
    m.add_class::<NativeGate>()?;
    m.add_function(wrap_pyfunction!(load_dump, m)?)?;
    m.add_function(wrap_pyfunction!(load_evidence, m)?)?;
    m.add_function(wrap_pyfunction!(evidence_from_json, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(gate_evidence, m)?)?;
    m.add_function(wrap_pyfunction!(write_dump, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(key, m)?)?;
    Ok(())
}
