//! `xray weights REFERENCE OTHER [--json FILE]`: two safetensors weight tables, tensor by tensor.
//!
//! For an engine that exposes little (CTranslate2: the memory and the logits) a bug in its
//! converted weights file is found at the whole encoder at best. Brought back to HF names (the
//! engine's converter run backwards, `fixtures/ct2_to_hf.py` for CTranslate2), its weights are
//! compared with the HF model's one tensor at a time, and each difference is explained with the
//! signatures the checkpoints use: a scale, a transpose (`permutation`), f16/bf16 rounding, rows
//! shifted, a few slices, another tensor of the reference (`wiring`: another layer's, K for V).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;
use xray_compare::metrics::compare;
use xray_compare::signatures::{explain_with, ExplainOptions, OpContext};
use xray_compare::tolerance::Tolerance;
use xray_runtime::weights::Weights;

/// Arguments of `xray weights`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The reference weights: a safetensors file, or a model directory holding
    /// model.safetensors.
    pub reference: PathBuf,
    /// The weights to judge (an engine's converted file brought back to HF names), as above.
    pub other: PathBuf,
    /// Write the comparison as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One tensor both tables hold that differs.
#[derive(Debug, Serialize)]
struct Differs {
    key: String,
    shape: Vec<usize>,
    /// Beyond f32 tolerance somewhere (false: only within it, e.g. one ULP).
    beyond_tolerance: bool,
    rel_l2: Option<f64>,
    max_abs: Option<f64>,
    /// The signature's name and detail (`scale`, `permutation`, `rounding`, `wiring`, ...).
    signature: String,
    detail: String,
}

/// The comparison.
#[derive(Debug, Serialize)]
struct Comparison {
    reference: String,
    other: String,
    reference_sha256: String,
    other_sha256: String,
    /// Tensors both hold, equal bit for bit.
    equal: usize,
    differs: Vec<Differs>,
    /// Keys only one side holds.
    only_reference: Vec<String>,
    only_other: Vec<String>,
    /// Keys both hold with other shapes: `[key, reference shape, other shape]`.
    shapes: Vec<(String, Vec<usize>, Vec<usize>)>,
}

/// `DIR/model.safetensors` for a directory, else the path.
fn file_of(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join("model.safetensors")
    } else {
        p.to_path_buf()
    }
}

/// Candidates for `wiring`: the reference's other tensors of the same shape, at most 24, the
/// nearest names first (most leading and trailing segments shared: the same module's other
/// parameter, `layers.3.norm.weight` for `layers.3.norm.bias`, and the same parameter of the
/// other layers, `layers.2.norm.bias`).
fn candidates<'a>(
    r: &'a Weights,
    key: &str,
    shape: &[usize],
) -> Vec<(String, &'a xray_core::Tensor)> {
    let shared = |k: &str| {
        let lead = k
            .split('.')
            .zip(key.split('.'))
            .take_while(|(a, b)| a == b)
            .count();
        let tail = k
            .rsplit('.')
            .zip(key.rsplit('.'))
            .take_while(|(a, b)| a == b)
            .count();
        (lead + tail, lead)
    };
    let mut v: Vec<(&str, &xray_core::Tensor)> = r
        .keys()
        .filter(|k| *k != key)
        .filter_map(|k| r.get(k).map(|t| (k, t)))
        .filter(|(_, t)| t.shape() == shape)
        .collect();
    v.sort_by(|a, b| shared(b.0).cmp(&shared(a.0)).then(a.0.cmp(b.0)));
    v.into_iter()
        .take(24)
        .map(|(k, t)| (k.to_string(), t))
        .collect()
}

/// Compares. Exit 0 when every tensor both hold is equal bit for bit and the keys and shapes
/// agree, 1 otherwise, 2 on input errors (a file that is not safetensors, an output that is an
/// input).
pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let (rf, of) = (file_of(&a.reference), file_of(&a.other));
    let mut outputs = super::Outputs::default();
    outputs.file_if("json", a.json.as_deref());
    outputs
        .input("reference weights", &rf)
        .input("other weights", &of);
    outputs.check()?;
    let r = Weights::load(&rf)?;
    let o = Weights::load(&of)?;
    let mut keys: Vec<&str> = r.keys().collect();
    keys.sort_unstable();
    let mut c = Comparison {
        reference: rf.display().to_string(),
        other: of.display().to_string(),
        reference_sha256: r.sha256().to_string(),
        other_sha256: o.sha256().to_string(),
        equal: 0,
        differs: vec![],
        only_reference: vec![],
        only_other: vec![],
        shapes: vec![],
    };
    let tol = Tolerance::default_f32();
    for k in keys {
        let rt = r.get(k).expect("a listed key");
        let Some(ot) = o.get(k) else {
            c.only_reference.push(k.to_string());
            continue;
        };
        if rt.shape() != ot.shape() {
            c.shapes
                .push((k.to_string(), rt.shape().to_vec(), ot.shape().to_vec()));
            continue;
        }
        if rt
            .iter()
            .zip(ot.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits())
        {
            c.equal += 1;
            continue;
        }
        let m = compare(&rt.view(), &ot.view(), &tol).ok();
        let cands = candidates(&r, k, rt.shape());
        let oc = OpContext {
            candidates: cands.iter().map(|(n, t)| (n.clone(), t.view())).collect(),
            ..Default::default()
        };
        let x = explain_with(&rt.view(), &ot.view(), &ExplainOptions::default(), &oc);
        c.differs.push(Differs {
            key: k.to_string(),
            shape: rt.shape().to_vec(),
            beyond_tolerance: m.as_ref().is_none_or(|m| m.beyond_tolerance > 0),
            rel_l2: m.as_ref().map(|m| m.rel_l2),
            max_abs: m.as_ref().map(|m| m.max_abs),
            signature: x.signature.as_str().to_string(),
            detail: x.detail,
        });
    }
    let mut only_other: Vec<String> = o
        .keys()
        .filter(|k| r.get(k).is_none())
        .map(String::from)
        .collect();
    only_other.sort_unstable();
    c.only_other = only_other;
    for d in &c.differs {
        super::note(&format!(
            "xray: {} {:?} differs{}: rel_l2 {}: {}",
            d.key,
            d.shape,
            if d.beyond_tolerance {
                ""
            } else {
                " (within f32 tolerance)"
            },
            d.rel_l2.map_or("-".into(), |v| format!("{v:.2e}")),
            d.detail
        ));
    }
    for (k, rs, os) in &c.shapes {
        super::note(&format!(
            "xray: {k}: shape {rs:?} in the reference, {os:?} in the other"
        ));
    }
    for (side, list) in [("reference", &c.only_reference), ("other", &c.only_other)] {
        if !list.is_empty() {
            super::note(&format!(
                "xray: only in the {side}: {} ({} key(s))",
                list.iter().take(8).cloned().collect::<Vec<_>>().join(", "),
                list.len()
            ));
        }
    }
    let same = c.differs.is_empty()
        && c.shapes.is_empty()
        && c.only_reference.is_empty()
        && c.only_other.is_empty();
    super::note(&format!(
        "xray: weights: {} equal, {} differ ({} beyond f32 tolerance), {} other shape(s), {} only in the reference, {} only in the other: {}",
        c.equal,
        c.differs.len(),
        c.differs.iter().filter(|d| d.beyond_tolerance).count(),
        c.shapes.len(),
        c.only_reference.len(),
        c.only_other.len(),
        if same { "the same" } else { "not the same" }
    ));
    if let Some(p) = &a.json {
        let mut text = serde_json::to_string_pretty(&c)?;
        text.push('\n');
        outputs.write_file("json", p, text.as_bytes());
    }
    outputs.finish()?;
    Ok(if same {
        ExitCode::SUCCESS
    } else {
        super::exit_fail()
    })
}
