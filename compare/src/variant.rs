//! Reference variants: a model-level counterfactual for engines that expose no op-level tensors.
//! The HF reference run with its weights on a named grid (`xray oracle --weights-variant int8`:
//! per-row symmetric int8 as CTranslate2 quantizes; `f16`, `bf16`, ...) is a second reference;
//! each observed checkpoint of the engine is measured against both. With `d_ref = engine -
//! reference`, `d_var = engine - variant` and `d_vr = variant - reference` (norms relative to the
//! reference's), the variant **explains** `1 - ||d_var||^2 / ||d_ref||^2` of the engine's squared
//! difference, and the engine is **consistent with the variant** at a checkpoint it fails against
//! the reference when `||d_var|| <= ||d_vr||`: it sits no farther from the variant than the
//! variant's own departure from the reference (the variant's noise), while it is outside the
//! f32 reference's tolerance.

use serde::{Deserialize, Serialize};
use xray_core::contract::Contract;
use xray_core::dump::Dump;
use xray_core::Step;

use crate::align::{comparable_up_to, token_alignment, DumpPairs};
use crate::align::{Pair, PairSource};
use crate::evidence::Evidence;
use crate::localize::Status;
use crate::suppression::Suppression;
use crate::Error;

/// One checkpoint measured against the reference and the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantCheckpoint {
    /// Checkpoint name.
    pub name: String,
    /// Step.
    pub step: Step,
    /// The engine's status against the reference.
    pub status: Status,
    /// `||engine - reference|| / ||reference||`.
    pub engine_vs_reference: f64,
    /// `||engine - variant|| / ||reference||`.
    pub engine_vs_variant: f64,
    /// `||variant - reference|| / ||reference||`: the variant's own departure (its noise).
    pub variant_vs_reference: f64,
    /// `1 - ||engine - variant||^2 / ||engine - reference||^2` (negative: the engine is farther
    /// from the variant than from the reference; `null` when the engine equals the reference).
    pub explained: Option<f64>,
    /// The engine fails against the reference and `engine_vs_variant <= variant_vs_reference`.
    pub consistent: bool,
}

/// The engine against one reference variant (`reference_variants` in the evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantEvidence {
    /// The scheme (`int8`, `int8_w8a8`, `f16`, ...), from the variant dump's
    /// `extra.reference_variant`.
    pub scheme: String,
    /// What the scheme changes.
    pub description: String,
    /// The variant dump.
    pub dump: String,
    /// Every checkpoint both compared (the variant's steps up to where its tokens part from the
    /// reference's, the engine's comparable steps).
    pub checkpoints: Vec<VariantCheckpoint>,
    /// The first divergence measured against the variant, when it is among them.
    pub origin: Option<VariantCheckpoint>,
    /// Over the failing checkpoints: `1 - sum ||d_var||^2 / sum ||d_ref||^2` (each term relative
    /// to its reference's norm).
    pub explained_failing: Option<f64>,
    /// How many failing checkpoints are consistent with the variant, of how many failing.
    pub consistent_failing: (usize, usize),
    /// One sentence: how much the variant explains at the origin, and whether the engine is
    /// consistent with it.
    pub summary: String,
}

fn norms(r: &[f32], g_r: &[f32], v: &[f32], g_v: &[f32]) -> (f64, f64, f64, f64) {
    let (mut nr, mut d1, mut d2, mut d3) = (0f64, 0f64, 0f64, 0f64);
    for i in 0..r.len() {
        let (r, gr, v, gv) = (r[i] as f64, g_r[i] as f64, v[i] as f64, g_v[i] as f64);
        let (a, b) = (gr - r, gv - v);
        nr += r * r;
        d1 += a * a;
        d2 += b * b;
        // Ids a declaration compared away (the engine's value replaced by each reference's)
        // count for neither side.
        if !(a == 0.0 && b == 0.0) {
            d3 += (v - r) * (v - r);
        }
    }
    (nr, d1, d2, d3)
}

/// Measures the dump under test against `variant` as well as `reference` at every checkpoint
/// `ev` observed (full dumps; the entries' declarations applied to both references alike).
pub fn compare_variant(
    contract: &Contract,
    reference: &Dump,
    got: &Dump,
    variant: &Dump,
    suppression: Option<&Suppression>,
    ev: &Evidence,
) -> Result<VariantEvidence, Error> {
    let err = |reason: String| Error::Manifest {
        dump: variant.dir.display().to_string(),
        reason,
    };
    let meta = variant.manifest.extra.get("reference_variant").ok_or_else(|| {
        err("no extra.reference_variant: not a reference variant (make one with `xray oracle --weights-variant SCHEME`)".into())
    })?;
    let text = |k: &str| meta.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let scheme =
        text("scheme").ok_or_else(|| err("extra.reference_variant.scheme is missing".into()))?;
    for (what, a, b) in [
        (
            "weights_sha256",
            &variant.manifest.weights_sha256,
            &reference.manifest.weights_sha256,
        ),
        (
            "audio_sha256",
            &variant.manifest.audio_sha256,
            &reference.manifest.audio_sha256,
        ),
        (
            "family",
            &variant.manifest.family,
            &reference.manifest.family,
        ),
    ] {
        if a != b {
            return Err(err(format!(
                "{what} {a} differs from the reference's {b}: a variant must be of the reference's model and audio"
            )));
        }
    }
    if variant.manifest.stats_only || reference.manifest.stats_only || got.manifest.stats_only {
        return Err(err("reference variants need full dumps".into()));
    }
    // The variant runs free: its steps after its tokens part from the reference's compare
    // nothing.
    let up_to = comparable_up_to(token_alignment(contract, reference, variant)?.as_ref());
    let mut with_ref = DumpPairs::new(contract, reference, got, None);
    with_ref.apply_declarations(suppression)?;
    let mut with_var = DumpPairs::new(contract, variant, got, None);
    with_var.apply_declarations(suppression)?;
    let mut out = Vec::new();
    for c in &ev.checkpoints {
        if !c.status.is_observed() || up_to.is_some_and(|k| c.step > k) {
            continue;
        }
        let (
            Pair::Tensors {
                reference: r,
                runtime: gr,
                ..
            },
            Pair::Tensors {
                reference: v,
                runtime: gv,
                ..
            },
        ) = (
            with_ref.pair(&c.name, c.step),
            with_var.pair(&c.name, c.step),
        )
        else {
            continue;
        };
        if r.shape() != v.shape() {
            continue;
        }
        let flat = |a: &ndarray::ArrayViewD<f32>| a.iter().copied().collect::<Vec<f32>>();
        let (nr, d1, d2, d3) = norms(&flat(&r), &flat(&gr), &flat(&v), &flat(&gv));
        let scale = nr.sqrt().max(f64::MIN_POSITIVE);
        let failing = c.status.is_divergent();
        let (evr, evv, vr) = (d1.sqrt() / scale, d2.sqrt() / scale, d3.sqrt() / scale);
        out.push(VariantCheckpoint {
            name: c.name.clone(),
            step: c.step,
            status: c.status,
            engine_vs_reference: evr,
            engine_vs_variant: evv,
            variant_vs_reference: vr,
            explained: (d1 > 0.0).then(|| 1.0 - d2 / d1),
            consistent: failing && evv <= vr,
        });
    }
    let failing: Vec<&VariantCheckpoint> = out.iter().filter(|c| c.status.is_divergent()).collect();
    let (s1, s2) = failing.iter().fold((0.0, 0.0), |(a, b), c| {
        (
            a + c.engine_vs_reference.powi(2),
            b + c.engine_vs_variant.powi(2),
        )
    });
    let explained_failing = (s1 > 0.0).then(|| 1.0 - s2 / s1);
    let consistent_failing = (
        failing.iter().filter(|c| c.consistent).count(),
        failing.len(),
    );
    let origin = ev.first_divergence.as_ref().and_then(|fd| {
        out.iter()
            .find(|c| c.name == fd.checkpoint && c.step == fd.step)
            .cloned()
    });
    let label = format!("{scheme} reference variant");
    let summary = match &origin {
        Some(o) => format!("{label}: at the origin {} the engine is rel_l2 {:.2e} from the reference and {:.2e} from the variant (the variant is {:.2e} from the reference): the variant explains {:.0}% of the squared difference; {}{}", xray_core::key(&o.name, o.step), o.engine_vs_reference, o.engine_vs_variant, o.variant_vs_reference, 100.0 * o.explained.unwrap_or(0.0).max(0.0), if o.consistent {
                format!("consistent with {}", scheme_phrase(&scheme))
            } else {
                format!(
                    "not consistent with {} alone (the engine is farther from the variant than the variant is from the reference)",
                    scheme_phrase(&scheme)
                )
            }, explained_failing.map_or(String::new(), |x| format!(
                "; over the {} failing checkpoints compared it explains {:.0}% ({} of them consistent)",
                consistent_failing.1,
                100.0 * x.max(0.0),
                consistent_failing.0
            )),),
        None => format!(
            "{label}: the origin is not among the {} checkpoints compared with the variant{}",
            out.len(),
            explained_failing.map_or(String::new(), |x| format!(
                "; over the {} failing ones it explains {:.0}%",
                consistent_failing.1,
                100.0 * x.max(0.0)
            ))
        ),
    };
    Ok(VariantEvidence {
        scheme,
        description: text("description").unwrap_or_default(),
        dump: variant.dir.display().to_string(),
        checkpoints: out,
        origin,
        explained_failing,
        consistent_failing,
        summary,
    })
}

/// "int8 weight quantization", "f16 weights", ...
fn scheme_phrase(scheme: &str) -> String {
    match scheme {
        "int8" => "int8 weight quantization".into(),
        "int8_conv" => "int8 weight quantization (convolutions included)".into(),
        "int8_w8a8" => "int8 weight and activation quantization".into(),
        other => format!("{other} weights"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_skip_ids_compared_away() {
        // id 1 was replaced on both sides (declared suppression): the variant's difference there
        // does not count.
        let r = [1.0, 2.0, 3.0];
        let v = [1.5, 9.0, 3.0];
        let (g_r, g_v) = ([1.4, 2.0, 3.0], [1.4, 9.0, 3.0]);
        let (nr, d1, d2, d3) = norms(&r, &g_r, &v, &g_v);
        assert_eq!(nr, 14.0);
        assert!(
            (d1 - 0.16).abs() < 1e-6 && (d2 - 0.01).abs() < 1e-6,
            "{d1} {d2}"
        );
        assert!((d3 - 0.25).abs() < 1e-9, "{d3}");
    }
}
