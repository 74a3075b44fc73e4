//! Reference replay through pyo3: one HF module of the reference model re-run on a tensor X-Ray
//! hands it (`xray_oracle/replay.py`), with its own parameters or a named counterfactual
//! ([`Counterfactual`], passed as JSON).

use std::path::{Path, PathBuf};

use ndarray::ArrayD;
use numpy::{PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use xray_core::replay::{Counterfactual, ModuleInfo};
use xray_core::Layout;

use crate::{py_err, Oracle, OracleError, Result};

/// One replay: module `module` of `family`'s reference in `model_dir`, fed `input`. Every tensor
/// in and out is an op-level point in the form and layout the contract's `points` rules declare
/// (docs/checkpoint-contracts.md, "Op-level points"): the oracle undoes the input's rule to feed
/// the module and applies the output's; a point no rule declares, or a tensor in another layout
/// than its rule's, is refused naming the point.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// Family (`whisper`, `granite_nar`): which loader builds the reference.
    pub family: String,
    /// The family's contract resolved against the model's config
    /// (`Contract::resolved_json`, `xray.contract.resolved/v1`): its point rules.
    pub contract: std::sync::Arc<String>,
    /// HF model directory.
    pub model_dir: PathBuf,
    /// `float32` (default) or `float64`.
    pub dtype: String,
    /// Dotted module path from the model's root (`model.encoder.layers.2.fc1`).
    pub module: String,
    /// The module's first positional input as its op-level point holds it (the engine's own
    /// `{module}:in`, in its declared form). For an embedding: its ids, or with `ids_from_rows`
    /// rows of its table (the reference's `{module}:out`), whose ids are looked up.
    pub input: ArrayD<f32>,
    /// The input's layout: its point rule's (another is refused).
    pub layout: Layout,
    /// An embedding's input is rows of its table, not ids.
    pub ids_from_rows: bool,
    /// More named inputs with their layouts: an attention core's `key` and `value` (its
    /// `k_proj:out` and `v_proj:out`; `input` is then its queries, `q_proj:out`).
    pub extra: Vec<(String, ArrayD<f32>, Layout)>,
    /// The counterfactual of [`Replayed::output`] (`Counterfactual::None`: the clean replay).
    pub counterfactual: Counterfactual,
    /// More counterfactuals on the same input, in the same call ([`Replayed::also`]).
    pub also: Vec<Counterfactual>,
}

impl ReplayRequest {
    /// A clean float32 replay of `module` on `input`, under the resolved contract `contract`.
    pub fn new(
        family: &str,
        contract: std::sync::Arc<String>,
        model_dir: &Path,
        module: &str,
        input: ArrayD<f32>,
        layout: Layout,
    ) -> Self {
        ReplayRequest {
            family: family.into(),
            contract,
            model_dir: model_dir.to_path_buf(),
            dtype: "float32".into(),
            module: module.into(),
            input,
            layout,
            ids_from_rows: false,
            extra: Vec::new(),
            counterfactual: Counterfactual::None,
            also: Vec::new(),
        }
    }
}

/// What a replay produced.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The module: class, kind, the parameters it read (and same-shape keys), settings.
    pub info: ModuleInfo,
    /// Its output under [`ReplayRequest::counterfactual`], as its op-level point holds it (the
    /// form its rule declares).
    pub output: ArrayD<f32>,
    /// The output's layout (its point rule's).
    pub layout: Layout,
    /// One per [`ReplayRequest::also`]: the output, or why the counterfactual does not apply.
    pub also: Vec<std::result::Result<ArrayD<f32>, String>>,
}

fn to_array(py: Python<'_>, v: &Bound<'_, PyAny>, what: &str) -> Result<ArrayD<f32>> {
    if let Ok(ro) = v.extract::<PyReadonlyArrayDyn<f32>>() {
        return Ok(ro.as_array().as_standard_layout().into_owned());
    }
    if let Ok(ro) = v.extract::<PyReadonlyArrayDyn<f64>>() {
        return Ok(ro.as_array().mapv(|x| x as f32));
    }
    let _ = py;
    Err(OracleError::Data(format!(
        "replay {what}: not a float32/float64 numpy array"
    )))
}

impl Oracle {
    /// Re-run one module of the reference on the request's input (see [`ReplayRequest`]), through
    /// the same interpreter as [`Oracle::run`]; the model is loaded once per process.
    pub fn replay(&self, req: &ReplayRequest) -> Result<Replayed> {
        self.with_python(|py, _m| {
            let e = |e: PyErr| py_err(py, e);
            let m = py.import("xray_oracle.replay").map_err(e)?;
            let cf = |c: &Counterfactual| {
                serde_json::to_string(c).map_err(|x| OracleError::Data(x.to_string()))
            };
            let kw = PyDict::new(py);
            kw.set_item("dtype", req.dtype.as_str()).map_err(e)?;
            kw.set_item("contract", req.contract.as_str()).map_err(e)?;
            kw.set_item("ids_from_rows", req.ids_from_rows).map_err(e)?;
            if !req.also.is_empty() {
                let also = req.also.iter().map(cf).collect::<Result<Vec<String>>>()?;
                kw.set_item("counterfactuals", PyList::new(py, also).map_err(e)?)
                    .map_err(e)?;
            }
            if !req.extra.is_empty() {
                let extra = PyDict::new(py);
                for (k, a, l) in &req.extra {
                    extra
                        .set_item(k.as_str(), (PyArrayDyn::from_array(py, a), l.to_string()))
                        .map_err(e)?;
                }
                kw.set_item("extra", extra).map_err(e)?;
            }
            let input = PyArrayDyn::from_array(py, &req.input);
            let res = m
                .call_method(
                    "replay",
                    (
                        req.family.as_str(),
                        req.model_dir.to_string_lossy().to_string(),
                        req.module.as_str(),
                        input,
                        req.layout.to_string(),
                        cf(&req.counterfactual)?,
                    ),
                    Some(&kw),
                )
                .map_err(e)?;
            let get = |k: &str| {
                res.get_item(k).map_err(|x| {
                    OracleError::Data(format!("replay result has no '{k}': {}", py_err(py, x)))
                })
            };
            let info_obj = get("info")?;
            let info_json: String = py
                .import("json")
                .and_then(|j| j.call_method1("dumps", (info_obj,)))
                .and_then(|s| s.extract())
                .map_err(e)?;
            let info: ModuleInfo = serde_json::from_str(&info_json).map_err(|x| {
                OracleError::Data(format!("replay {}: module info: {x}", req.module))
            })?;
            let output = to_array(py, &get("output")?, &req.module)?;
            let layout_s: String = get("layout")?.extract().map_err(e)?;
            let layout: Layout = serde_json::from_value(serde_json::Value::String(
                layout_s.clone(),
            ))
            .map_err(|_| {
                OracleError::Data(format!(
                    "replay {}: unknown layout '{layout_s}'",
                    req.module
                ))
            })?;
            let mut also = Vec::new();
            if !req.also.is_empty() {
                let outs = get("outputs")?;
                for o in outs.try_iter().map_err(e)? {
                    let o = o.map_err(e)?;
                    if let Ok(why) = o.extract::<String>() {
                        also.push(Err(why));
                    } else {
                        also.push(Ok(to_array(py, &o, &req.module)?));
                    }
                }
                if also.len() != req.also.len() {
                    return Err(OracleError::Data(format!(
                        "replay {}: {} outputs for {} counterfactuals",
                        req.module,
                        also.len(),
                        req.also.len()
                    )));
                }
            }
            Ok(Replayed {
                info,
                output,
                layout,
                also,
            })
        })
    }
}
