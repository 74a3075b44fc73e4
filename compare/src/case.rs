//! Repro cases, schema `xray.case/v1` (`docs/bring-your-own-engine.md`, "Repro cases"): one op
//! cut out of a divergent run, with everything needed to judge another computation of it and
//! nothing else.
//!
//! ```text
//! CASE/
//!   case.json                       the manifest (below)
//!   input.0.npy                     the op's reference input(s), one per input port
//!   weights/<safetensors key>.npy   only the weights the op reads
//!   reference.npy                   the reference output at the case's point
//!   engine.npy                      the output of the engine the case was cut from
//! ```
//!
//! Every tensor is a `.npy` file (f32, C order, written and read with ndarray-npy through
//! `xray_core::dump`, as dumps are) listed in `case.json` with its shape and the sha256 of its
//! values (`content_sha256`, as stats-only dumps hash them); loading checks each one ([`load`]).
//! [`judge`] compares any output with the reference output under the case's tolerance through
//! the same metrics and pass rule as a comparison ([`crate::metrics`]). A case is written into a
//! fresh sibling directory and renamed into place ([`write_case`]); an existing directory is
//! replaced only when it is an X-Ray case holding nothing its `case.json` does not list, and only
//! when asked ([`check_case_target`]).

use std::path::{Path, PathBuf};
use xray_core::Step;

use serde::{Deserialize, Serialize};
use xray_core::dump::{content_sha256, npy_bytes, parse_npy};
use xray_core::{Layout, Tensor};

use crate::evidence::ToleranceEvidence;
use crate::metrics::{compare, Metrics};
use crate::tolerance::Tolerance;

/// Schema identifier written in `schema`.
pub const SCHEMA: &str = "xray.case/v1";

/// The manifest's file name.
pub const MANIFEST: &str = "case.json";

/// The folder of the weight files.
pub const WEIGHTS_DIR: &str = "weights";

/// Largest `case.json` read (a manifest lists a few tensors: anything larger is not one).
const MANIFEST_MAX_BYTES: u64 = 16 << 20;

/// A case that cannot be written, read or judged: the path and why (one line).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct CaseError {
    /// The file or directory.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

fn cerr(path: &Path, reason: impl Into<String>) -> CaseError {
    CaseError {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// One tensor file of a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseTensor {
    /// Path relative to the case directory.
    pub file: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Layout (op inputs and outputs: the runtime edge's; absent for weights).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Layout>,
    /// sha256 of the raw little-endian f32 values in C order (`xray_core::dump::content_sha256`).
    pub content_sha256: String,
}

/// The runtime op the case isolates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseOp {
    /// The op's name in X-Ray's runtime graph (`encoder.layer.1.mlp_norm`).
    pub name: String,
    /// Its kernel kind (`layer_norm`).
    pub kind: String,
    /// The kernel's parameters (`{"eps": 1e-5}`), as `xray list --json` exports them.
    pub params: serde_json::Value,
    /// The HF module it mirrors (its weight keys' module), null for a weightless op.
    pub module: Option<String>,
    /// The output edge the case judges.
    pub output_edge: String,
    /// That edge's checkpoint label, if any.
    pub output_checkpoint: Option<String>,
    /// The op-level points the output edge carries (aliases of one tensor).
    pub output_points: Vec<String>,
}

/// The upstream code the op mirrors, with where each fact comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Upstream {
    /// The file that builds and runs the module (`transformers/models/whisper/modeling_whisper.py`).
    pub file: Option<String>,
    /// The module's class (`nn.Linear`), null when not known.
    pub class: Option<String>,
    /// The module's dotted path from the model's root (`model.decoder.layers.0.fc1`).
    pub module: Option<String>,
    /// The model class the reference loads (the contract's `hf_class`).
    pub model_class: Option<String>,
    /// The transformers version the reference ran (its dump's `tools.transformers`).
    pub transformers: Option<String>,
    /// What each of the above is known from (one sentence each).
    pub known_from: Vec<String>,
}

/// One input of the op: the reference's tensor at the point its edge carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseInput {
    /// The kernel's port (`x`).
    pub port: String,
    /// The runtime edge.
    pub edge: String,
    /// The op-level point it was taken from in the reference dump.
    pub point: String,
    /// The tensor.
    #[serde(flatten)]
    pub tensor: CaseTensor,
}

/// One weight the op reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseWeight {
    /// The kernel's role (`weight`, `bias`).
    pub role: String,
    /// The safetensors key.
    pub key: String,
    /// The tensor.
    #[serde(flatten)]
    pub tensor: CaseTensor,
}

/// The output of the engine the case was cut from, and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseEngine {
    /// The engine dump's `producer` (`runtime`, `candle-whisper`).
    pub producer: String,
    /// The tensor.
    #[serde(flatten)]
    pub tensor: CaseTensor,
    /// Its metrics against the reference output under the case's tolerance.
    pub metrics: Metrics,
    /// Whether it passes (false: the case reproduces the divergence).
    pub passes: bool,
}

/// Where the case was cut from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseSource {
    /// The evidence file.
    pub evidence: String,
    /// The reference dump.
    pub reference_dump: String,
    /// The dump of the engine under test.
    pub engine_dump: String,
    /// The model directory (`xray replay --runtime` builds the op's graph from it).
    pub model: String,
    /// sha256 of the model's weights file.
    pub weights_sha256: Option<String>,
    /// sha256 of the audio the run was on.
    pub audio_sha256: Option<String>,
    /// The X-Ray version that wrote the case.
    pub written_by: String,
}

/// The divergence the case reproduces, as the evidence stated it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseDivergence {
    /// The origin checkpoint (`audio.encoder.layer.1.out`).
    pub checkpoint: String,
    /// The op-level signature (`row_affine`), when the evidence named one.
    pub signature: Option<xray_core::SignatureKind>,
    /// Its one-line detail.
    pub detail: Option<String>,
}

/// `case.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Model family.
    pub family: String,
    /// The step (0: encoder and decoder prefill; K: the K-th decode step).
    pub step: Step,
    /// The op-level point judged (`model.encoder.layers.1.final_layer_norm:out`).
    pub point: String,
    /// The runtime op.
    pub op: CaseOp,
    /// The upstream code it mirrors.
    pub upstream: Upstream,
    /// Its inputs, one per port, in port order.
    pub inputs: Vec<CaseInput>,
    /// Its weights, one per role, in role order.
    pub weights: Vec<CaseWeight>,
    /// The reference output.
    pub reference: CaseTensor,
    /// The engine's output.
    pub engine: CaseEngine,
    /// The tolerance outputs are judged by (the evidence's for the point).
    pub tolerance: ToleranceEvidence,
    /// The divergence reproduced.
    pub divergence: CaseDivergence,
    /// Where it was cut from.
    pub source: CaseSource,
    /// The model's `config.json`, in a module case (`op.kind` `module`: a whole HF module, every
    /// op between its boundaries), where it says how the module is built (another engine's
    /// loader needs it); absent for one op, whose `params` say it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

impl Case {
    /// Every file of the case, `case.json` first.
    pub fn files(&self) -> Vec<String> {
        let mut v = vec![MANIFEST.to_string()];
        v.extend(self.inputs.iter().map(|i| i.tensor.file.clone()));
        v.extend(self.weights.iter().map(|w| w.tensor.file.clone()));
        v.push(self.reference.file.clone());
        v.push(self.engine.tensor.file.clone());
        v
    }

    /// `encoder.layer.1.mlp_norm (model.encoder.layers.1.final_layer_norm:out@step0)`.
    pub fn label(&self) -> String {
        format!(
            "{} ({})",
            self.op.name,
            xray_core::key(&self.point, self.step)
        )
    }
}

/// The file name of a weight: `weights/<key>.npy`; a key that is not a plain file name (a path
/// separator, a leading dot, a control character) is refused.
pub fn weight_file(key: &str) -> Result<String, CaseError> {
    if key.is_empty()
        || key.starts_with('.')
        || key.contains(['/', '\\'])
        || key.chars().any(char::is_control)
    {
        return Err(CaseError {
            path: key.to_string(),
            reason: "a safetensors key that is not a plain file name cannot name a weight file"
                .into(),
        });
    }
    Ok(format!("{WEIGHTS_DIR}/{key}.npy"))
}

/// A relative file name inside the case: `name` or `weights/name`, no `..`, no absolute path.
fn safe_relative(file: &str) -> bool {
    let parts: Vec<&str> = file.split('/').collect();
    let plain = |p: &str| {
        !p.is_empty() && p != "." && p != ".." && !p.contains('\\') && !p.starts_with('.')
    };
    match parts.as_slice() {
        [f] => plain(f),
        [d, f] => *d == WEIGHTS_DIR && plain(f),
        _ => false,
    }
}

/// The files of a case being made: `.npy` bytes by relative path.
#[derive(Debug, Default)]
pub struct CaseFiles {
    files: Vec<(String, Vec<u8>)>,
}

impl CaseFiles {
    /// Encodes `t` as `file` and describes it.
    pub fn add(
        &mut self,
        file: &str,
        t: &Tensor,
        layout: Option<Layout>,
    ) -> Result<CaseTensor, CaseError> {
        if !safe_relative(file) || file == MANIFEST {
            return Err(CaseError {
                path: file.to_string(),
                reason: "not a plain file name inside the case".into(),
            });
        }
        if self.files.iter().any(|(f, _)| f == file) {
            return Err(CaseError {
                path: file.to_string(),
                reason: "two tensors of the case would share this file".into(),
            });
        }
        let t = t.as_standard_layout().into_owned();
        let bytes = npy_bytes(&t).map_err(|e| CaseError {
            path: file.to_string(),
            reason: e.to_string(),
        })?;
        self.files.push((file.to_string(), bytes));
        Ok(CaseTensor {
            file: file.to_string(),
            shape: t.shape().to_vec(),
            layout,
            content_sha256: content_sha256(t.as_slice().unwrap_or(&[])),
        })
    }
}

/// What a case directory holds now ([`xray_core::outdir::Target`]; an existing case is
/// `Existing`).
pub type CaseTarget = xray_core::outdir::Target;

/// A case directory as [`xray_core::outdir`] writes and recognises it: [`MANIFEST`] of schema
/// [`SCHEMA`], listing itself, its tensors and its weights.
const CASE_DIR: xray_core::outdir::Kind = xray_core::outdir::Kind {
    noun: "case",
    manifest: MANIFEST,
    schema: SCHEMA,
    listed: listed_files,
};

impl From<xray_core::outdir::Refused> for CaseError {
    fn from(r: xray_core::outdir::Refused) -> Self {
        cerr(&r.path, r.reason)
    }
}

/// The files an existing `case.json` lists (read leniently: any `file` string of its tensors).
fn listed_files(v: &serde_json::Value) -> Vec<String> {
    let mut out = vec![MANIFEST.to_string()];
    let mut push = |t: Option<&serde_json::Value>| {
        if let Some(f) = t.and_then(|t| t.get("file")).and_then(|f| f.as_str()) {
            if safe_relative(f) {
                out.push(f.to_string());
            }
        }
    };
    for list in ["inputs", "weights"] {
        for t in v.get(list).and_then(|l| l.as_array()).into_iter().flatten() {
            push(Some(t));
        }
    }
    push(v.get("reference"));
    push(v.get("engine"));
    out
}

/// Checks that a case may be written to `dir` (run it before the expensive work; the writer runs
/// it again): absent, empty, or (only with `replace`) an X-Ray case holding nothing its
/// `case.json` does not list. A file, a symbolic link, a directory that is not an X-Ray case, a
/// case holding other files, or an ancestor that is not a directory is refused, naming it.
pub fn check_case_target(dir: &Path, replace: bool) -> Result<CaseTarget, CaseError> {
    Ok(xray_core::outdir::check_target(dir, &CASE_DIR, replace)?)
}

fn write_new(p: &Path, bytes: &[u8]) -> Result<(), CaseError> {
    use std::io::Write;
    let mut f = std::fs::File::create_new(p).map_err(|e| cerr(p, e.to_string()))?;
    f.write_all(bytes).map_err(|e| cerr(p, e.to_string()))?;
    f.sync_all().map_err(|e| cerr(p, e.to_string()))
}

/// Writes `case` and its `files` into `dir` atomically: everything goes into a fresh temporary
/// sibling directory, renamed into place once complete. `dir` may be absent or empty; an existing
/// X-Ray case is replaced only when `replace` is true, after the new one is complete, removing
/// only the files its `case.json` listed. The manifest must list exactly the files given.
pub fn write_case(
    case: &Case,
    files: &CaseFiles,
    dir: &Path,
    replace: bool,
) -> Result<(), CaseError> {
    let mut listed = case.files();
    listed.retain(|f| f != MANIFEST);
    let mut given: Vec<&str> = files.files.iter().map(|(f, _)| f.as_str()).collect();
    let mut want: Vec<&str> = listed.iter().map(String::as_str).collect();
    given.sort_unstable();
    want.sort_unstable();
    if given != want {
        return Err(cerr(
            dir,
            "internal: the case manifest does not list exactly the files written",
        ));
    }
    xray_core::outdir::write_whole(dir, &CASE_DIR, replace, |tmp| {
        if files
            .files
            .iter()
            .any(|(f, _)| f.starts_with(&format!("{WEIGHTS_DIR}/")))
        {
            let w = tmp.join(WEIGHTS_DIR);
            std::fs::create_dir(&w).map_err(|e| cerr(&w, e.to_string()))?;
        }
        for (f, bytes) in &files.files {
            write_new(&tmp.join(f), bytes)?;
        }
        let mp = tmp.join(MANIFEST);
        let text = serde_json::to_string_pretty(case).map_err(|e| cerr(&mp, e.to_string()))?;
        write_new(&mp, format!("{text}\n").as_bytes())
    })
}

/// A case read back and checked.
#[derive(Debug, Clone)]
pub struct LoadedCase {
    /// The case directory.
    pub dir: PathBuf,
    /// `case.json`.
    pub case: Case,
    /// The inputs, in port order.
    pub inputs: Vec<Tensor>,
    /// The weights by key, in role order.
    pub weights: Vec<(String, Tensor)>,
    /// The reference output.
    pub reference: Tensor,
    /// The engine's output.
    pub engine: Tensor,
}

/// Reads a `.npy` file as f32 (any dtype a dump accepts), naming the file in every error.
pub fn read_npy(path: &Path) -> Result<Tensor, CaseError> {
    let meta = std::fs::metadata(path).map_err(|e| cerr(path, e.to_string()))?;
    if !meta.is_file() {
        return Err(cerr(path, "is not a file"));
    }
    let bytes = std::fs::read(path).map_err(|e| cerr(path, e.to_string()))?;
    parse_npy(path, &bytes).map(|(t, _)| t).map_err(|e| {
        cerr(
            path,
            e.to_string().replace(&format!("{}: ", path.display()), ""),
        )
    })
}

fn load_tensor(dir: &Path, t: &CaseTensor, what: &str) -> Result<Tensor, CaseError> {
    if !safe_relative(&t.file) {
        return Err(cerr(
            &dir.join(MANIFEST),
            format!(
                "{what}: file {:?} is not a plain file name inside the case",
                t.file
            ),
        ));
    }
    let p = dir.join(&t.file);
    if !p.exists() {
        return Err(cerr(
            &p,
            format!("missing: {MANIFEST} lists it as the {what}; the case is incomplete (re-make it with `xray repro`)"),
        ));
    }
    let x = read_npy(&p)?;
    if x.shape() != t.shape.as_slice() {
        return Err(cerr(
            &p,
            format!("shape {:?}, {MANIFEST} says {:?}", x.shape(), t.shape),
        ));
    }
    let x = x.as_standard_layout().into_owned();
    if content_sha256(x.as_slice().unwrap_or(&[])) != t.content_sha256 {
        return Err(cerr(
            &p,
            format!(
                "its values do not match the content_sha256 in {MANIFEST} (the file was changed)"
            ),
        ));
    }
    Ok(x)
}

/// Reads and checks a case directory: `case.json` of schema [`SCHEMA`], every file it lists
/// present, a `.npy` of the listed shape and values (content sha256), the engine and reference
/// outputs of one shape, and a tolerance with finite, non-negative bounds. Every failure names
/// the file.
pub fn load(dir: &Path) -> Result<LoadedCase, CaseError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(cerr(dir, "is not a directory (give the case directory)")),
        Err(e) => return Err(cerr(dir, e.to_string())),
    }
    let mp = dir.join(MANIFEST);
    let meta = std::fs::metadata(&mp).map_err(|e| {
        cerr(
            &mp,
            format!("{e} (not an X-Ray case: `xray repro EVIDENCE --out DIR` makes one)"),
        )
    })?;
    if meta.len() > MANIFEST_MAX_BYTES {
        return Err(cerr(
            &mp,
            format!("{} bytes: too large for a case manifest", meta.len()),
        ));
    }
    let text = std::fs::read_to_string(&mp).map_err(|e| cerr(&mp, e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| cerr(&mp, format!("invalid JSON: {e}")))?;
    match v.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) => return Err(cerr(&mp, format!("schema {other:?}, expected {SCHEMA:?}"))),
        None => {
            return Err(cerr(
                &mp,
                format!("no \"schema\": not an {SCHEMA} case manifest"),
            ))
        }
    }
    let case: Case = serde_json::from_value(v)
        .map_err(|e| cerr(&mp, format!("does not read as {SCHEMA}: {e}")))?;
    if case.inputs.is_empty() {
        return Err(cerr(&mp, "lists no input"));
    }
    check_tolerance(&case.tolerance.bounds).map_err(|r| cerr(&mp, r))?;
    let mut seen = std::collections::BTreeSet::new();
    for f in case.files() {
        if !seen.insert(f.clone()) {
            return Err(cerr(&mp, format!("lists {f:?} twice")));
        }
    }
    let inputs = case
        .inputs
        .iter()
        .enumerate()
        .map(|(i, x)| load_tensor(dir, &x.tensor, &format!("input {i} ({})", x.point)))
        .collect::<Result<Vec<_>, _>>()?;
    let weights = case
        .weights
        .iter()
        .map(|w| {
            Ok((
                w.key.clone(),
                load_tensor(dir, &w.tensor, &format!("weight {}", w.key))?,
            ))
        })
        .collect::<Result<Vec<_>, CaseError>>()?;
    let reference = load_tensor(dir, &case.reference, "reference output")?;
    let engine = load_tensor(dir, &case.engine.tensor, "engine output")?;
    if reference.shape() != engine.shape() {
        return Err(cerr(
            &mp,
            format!(
                "the reference output is {:?} but the engine output is {:?}",
                reference.shape(),
                engine.shape()
            ),
        ));
    }
    Ok(LoadedCase {
        dir: dir.to_path_buf(),
        case,
        inputs,
        weights,
        reference,
        engine,
    })
}

/// A tolerance's bounds must be finite and non-negative (fractions at most 1).
fn check_tolerance(t: &Tolerance) -> Result<(), String> {
    let ok = |x: f64| x.is_finite() && x >= 0.0;
    if !ok(t.atol) || !ok(t.rtol) || !ok(t.max_outlier_fraction) || t.max_outlier_fraction > 1.0 {
        return Err(format!(
            "tolerance atol {} rtol {} max_outlier_fraction {}: bounds must be finite and non-negative",
            t.atol, t.rtol, t.max_outlier_fraction
        ));
    }
    for (n, x) in [("max_rel_l2", t.max_rel_l2), ("max_kl", t.max_kl)] {
        if x.is_some_and(|x| !ok(x)) {
            return Err(format!("tolerance {n} must be finite and non-negative"));
        }
    }
    Ok(())
}

/// The verdict on one output of the case's op.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    /// Metrics against the reference output.
    pub metrics: Metrics,
    /// Whether they pass the case's tolerance.
    pub passes: bool,
    /// The criteria that failed (empty when it passes).
    pub failed: Vec<String>,
}

/// Judges `got` against the case's reference output under the case's tolerance (the metrics and
/// pass rule of a comparison). A shape other than the reference's is an error naming both.
pub fn judge(case: &LoadedCase, got: &Tensor, what: &str) -> Result<Judgement, CaseError> {
    if got.shape() != case.reference.shape() {
        return Err(CaseError {
            path: what.to_string(),
            reason: format!(
                "shape {:?}, but the case's output {} is {:?}{}",
                got.shape(),
                case.case.point,
                case.reference.shape(),
                case.case
                    .reference
                    .layout
                    .map(|l| format!(" ({l})"))
                    .unwrap_or_default()
            ),
        });
    }
    let tol = case.case.tolerance.bounds;
    let m = compare(&case.reference.view(), &got.view(), &tol).map_err(|e| CaseError {
        path: case
            .dir
            .join(&case.case.reference.file)
            .display()
            .to_string(),
        reason: e.to_string(),
    })?;
    let passes = m.passes(&tol);
    let failed = if passes {
        vec![]
    } else {
        failed_criteria(&m, &tol)
    };
    Ok(Judgement {
        metrics: m,
        passes,
        failed,
    })
}

/// The pass criteria `m` violates, in words.
fn failed_criteria(m: &Metrics, tol: &Tolerance) -> Vec<String> {
    let mut v = Vec::new();
    if m.non_finite.runtime_only > 0 {
        v.push(format!(
            "{} non-finite value(s) where the reference is finite",
            m.non_finite.runtime_only
        ));
    }
    if let Some(max) = tol.max_rel_l2.filter(|&x| m.rel_l2 > x) {
        v.push(format!("rel_l2 {:.3e} > {max:.1e}", m.rel_l2));
    }
    if m.beyond_fraction > tol.max_outlier_fraction {
        v.push(format!(
            "{} of {} elements ({:.3}%) beyond atol {:.1e} + rtol {:.1e} (at most {:.3}%)",
            m.beyond_tolerance,
            m.count,
            100.0 * m.beyond_fraction,
            tol.atol,
            tol.rtol,
            100.0 * tol.max_outlier_fraction
        ));
    }
    if v.is_empty() {
        v.push("outside the tolerance".into());
    }
    v
}

impl Judgement {
    /// `pass`/`fail`, what was judged, the deciding numbers and the tolerance, on one line.
    pub fn summary(&self, case: &Case, what: &str) -> String {
        let verdict = if self.passes { "pass" } else { "fail" };
        let why = if self.passes {
            format!(
                "rel_l2 {:.3e}, max_abs {:.3e}, {} of {} beyond tolerance",
                self.metrics.rel_l2,
                self.metrics.max_abs,
                self.metrics.beyond_tolerance,
                self.metrics.count
            )
        } else {
            format!(
                "{}; max_abs {:.3e}",
                self.failed.join("; "),
                self.metrics.max_abs
            )
        };
        format!(
            "xray: replay {verdict}: {what} for {} against the reference: {why} (tolerance {})",
            case.label(),
            case.tolerance.source
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tolerance::Tolerance;

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_shape_vec(shape.to_vec(), v).unwrap()
    }

    fn make(dir: &Path, replace: bool) -> Result<(), CaseError> {
        let mut files = CaseFiles::default();
        let x = files.add(
            "input.0.npy",
            &t(&[2, 2], vec![1., 2., 3., 4.]),
            Some(Layout::TokenMajor),
        )?;
        let w = files.add(
            &weight_file("m.fc.weight")?,
            &t(&[2, 2], vec![1., 0., 0., 1.]),
            None,
        )?;
        let r = files.add(
            "reference.npy",
            &t(&[2, 2], vec![1., 2., 3., 4.]),
            Some(Layout::TokenMajor),
        )?;
        let engine = t(&[2, 2], vec![1., 2., 3., 5.]);
        let e = files.add("engine.npy", &engine, Some(Layout::TokenMajor))?;
        let tol = Tolerance::default_f32();
        let m = compare(
            &t(&[2, 2], vec![1., 2., 3., 4.]).view(),
            &engine.view(),
            &tol,
        )
        .unwrap();
        let case = Case {
            schema: SCHEMA.into(),
            family: "whisper".into(),
            step: 0,
            point: "m.fc:out".into(),
            op: CaseOp {
                name: "l.fc".into(),
                kind: "linear".into(),
                params: serde_json::json!({"bias": false}),
                module: Some("m.fc".into()),
                output_edge: "l.fc.y".into(),
                output_checkpoint: None,
                output_points: vec!["m.fc:out".into()],
            },
            upstream: Upstream {
                file: None,
                class: Some("nn.Linear".into()),
                module: Some("m.fc".into()),
                model_class: None,
                transformers: None,
                known_from: vec![],
            },
            inputs: vec![CaseInput {
                port: "x".into(),
                edge: "x".into(),
                point: "m.fc:in".into(),
                tensor: x,
            }],
            weights: vec![CaseWeight {
                role: "weight".into(),
                key: "m.fc.weight".into(),
                tensor: w,
            }],
            reference: r,
            engine: CaseEngine {
                producer: "runtime".into(),
                tensor: e,
                passes: m.passes(&tol),
                metrics: m,
            },
            tolerance: ToleranceEvidence {
                bounds: tol,
                source: "default:f32".into(),
            },
            divergence: CaseDivergence {
                checkpoint: "out".into(),
                signature: None,
                detail: None,
            },
            source: CaseSource {
                evidence: "e.json".into(),
                reference_dump: "r".into(),
                engine_dump: "x".into(),
                model: "m".into(),
                weights_sha256: None,
                audio_sha256: None,
                written_by: "test".into(),
            },
            config: None,
        };
        write_case(&case, &files, dir, replace)
    }

    /// Written, read back, judged: the engine output fails, the reference passes; a changed or
    /// missing file, another schema and a wrong shape are errors naming what is wrong.
    #[test]
    fn round_trip_judge_and_refusals() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("case");
        make(&dir, false).unwrap();
        let c = load(&dir).unwrap();
        assert_eq!(c.weights[0].0, "m.fc.weight");
        assert!(dir.join("weights/m.fc.weight.npy").is_file());
        let bad = judge(&c, &c.engine, "engine").unwrap();
        assert!(!bad.passes && !bad.failed.is_empty(), "{bad:?}");
        assert!(bad
            .summary(&c.case, "engine")
            .starts_with("xray: replay fail"));
        assert!(judge(&c, &c.reference, "ref").unwrap().passes);
        let e = judge(&c, &t(&[4], vec![0.; 4]), "got.npy").unwrap_err();
        assert!(e.to_string().contains("shape [4]"), "{e}");
        // Existing case: refused without replace, replaced with it; a foreign dir refused.
        let e = make(&dir, false).unwrap_err();
        assert!(e.reason.contains("--force"), "{e}");
        make(&dir, true).unwrap();
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        let e = make(&dir, true).unwrap_err();
        assert!(e.reason.contains("notes.txt"), "{e}");
        let other = tmp.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("x"), "y").unwrap();
        assert!(make(&other, true)
            .unwrap_err()
            .reason
            .contains("not an X-Ray case"));
        std::fs::remove_file(dir.join("notes.txt")).unwrap();
        // A changed value, a missing file, another schema.
        std::fs::copy(dir.join("engine.npy"), dir.join("reference.npy")).unwrap();
        assert!(load(&dir).unwrap_err().reason.contains("content_sha256"));
        std::fs::remove_file(dir.join("reference.npy")).unwrap();
        assert!(load(&dir).unwrap_err().reason.contains("missing"));
        let mp = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&mp)
            .unwrap()
            .replace(SCHEMA, "xray.case/v0");
        std::fs::write(&mp, text).unwrap();
        assert!(load(&dir).unwrap_err().reason.contains("xray.case/v0"));
        assert!(weight_file("../x").is_err());
        assert!(!safe_relative("weights/../x") && !safe_relative("/abs"));
    }
}
