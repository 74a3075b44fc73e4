//! Deliberate faults for the self-test: realistic bring-up bugs planted behind one seam. The graph
//! executor asks the [`FaultPlan`] once per op for a patched kernel (parameter faults: epsilon,
//! attention scale, mask, RoPE offset) and once per produced edge for an output corruption (f16
//! rounding, a NaN, swapped heads, a layout leak). Host-level faults (a stale cross-attention cache)
//! are flags the model's decode loop reads. No kernel has a fault `if` of its own.

use crate::graph::{Edge, Kernel, Layout, Op, Tensor};

/// A parameter fault: the op runs with a wrong parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamFault {
    /// LayerNorm / RMSNorm epsilon replaced.
    Eps(f32),
    /// Attention softmax scale replaced by this value.
    AttnScale(f32),
    /// Attention with the causal mask forced on (`true`) or off (`false`).
    Causal(bool),
    /// RoPE positions shifted by this many positions.
    RopeOffset(i64),
    /// A residual branch dropped (the op returns its first input unchanged).
    SkipBranch,
}

/// An output fault: the produced tensor is corrupted.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFault {
    /// Round every element to f16 and back.
    RoundF16,
    /// Round every element to bf16 and back.
    RoundBf16,
    /// Write one NaN at this flat index.
    Nan(usize),
    /// Swap two heads of a head-major tensor.
    SwapHeads(usize, usize),
    /// A head-major edge carries the token-major buffer (the layout-leak bug).
    TokenMajorLeak,
    /// Every element multiplied by this factor.
    Scale(f32),
    /// Every element negated.
    Negate,
    /// Shifted by this many positions along the time/token axis (zero fill): the last axis for
    /// channel-major tensors, the first for token-major ones.
    Shift(i64),
}

/// What a planted fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Patch a kernel parameter of matching ops.
    Param(ParamFault),
    /// Corrupt matching edges.
    Output(OutputFault),
    /// A host-level behaviour flag read by the model loop (e.g. `stale_cross_cache`).
    Host(String),
}

/// One planted fault: what and where (an op-name glob for params, a checkpoint/edge glob for
/// outputs), optionally only at some steps.
#[derive(Debug, Clone)]
pub struct Planted {
    /// Catalogue name.
    pub name: String,
    /// The fault.
    pub kind: FaultKind,
    /// Op name glob (params) or checkpoint/edge name glob (outputs).
    pub target: String,
    /// Only at this step, if set.
    pub step: Option<usize>,
}

/// A set of planted faults.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// The faults.
    pub planted: Vec<Planted>,
}

fn glob_match(pattern: &str, s: &str) -> bool {
    globset::Glob::new(pattern)
        .map(|g| g.compile_matcher().is_match(s))
        .unwrap_or(false)
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// Whether a host flag is planted.
    pub fn host(&self, flag: &str) -> bool {
        self.planted
            .iter()
            .any(|p| matches!(&p.kind, FaultKind::Host(h) if h == flag))
    }

    /// A patched kernel for this op, if a parameter fault targets it.
    pub fn patch_kernel(&self, op: &Op) -> Option<Box<dyn Kernel>> {
        let mut out: Option<Box<dyn Kernel>> = None;
        for p in &self.planted {
            if let FaultKind::Param(pf) = &p.kind {
                if glob_match(&p.target, &op.name) {
                    let base: &dyn Kernel = out.as_deref().unwrap_or(op.kernel.as_ref());
                    if let Some(k) = base.with_param_fault(pf) {
                        out = Some(k);
                    }
                }
            }
        }
        out
    }

    /// Corrupt an op output if an output fault targets its edge (by checkpoint label or name).
    pub fn patch_output(&self, _op: &Op, _port: usize, edge: &Edge, step: usize, t: &mut Tensor) {
        for p in &self.planted {
            let FaultKind::Output(of) = &p.kind else {
                continue;
            };
            if p.step.is_some_and(|s| s != step) {
                continue;
            }
            let hit = edge
                .checkpoint
                .as_deref()
                .is_some_and(|c| glob_match(&p.target, c))
                || glob_match(&p.target, &edge.name);
            if hit {
                apply_output_fault(of, edge.layout, t);
            }
        }
    }
}

/// Apply an output fault in place.
pub fn apply_output_fault(f: &OutputFault, layout: Layout, t: &mut Tensor) {
    match f {
        OutputFault::RoundF16 => t.mapv_inplace(|v| half::f16::from_f32(v).to_f32()),
        OutputFault::RoundBf16 => t.mapv_inplace(|v| half::bf16::from_f32(v).to_f32()),
        OutputFault::Nan(i) => {
            if let Some(v) = t.iter_mut().nth(*i) {
                *v = f32::NAN;
            }
        }
        OutputFault::SwapHeads(a, b) => {
            if t.ndim() == 3 && *a < t.shape()[0] && *b < t.shape()[0] && a != b {
                let ta = t.index_axis(ndarray::Axis(0), *a).to_owned();
                let tb = t.index_axis(ndarray::Axis(0), *b).to_owned();
                t.index_axis_mut(ndarray::Axis(0), *a).assign(&tb);
                t.index_axis_mut(ndarray::Axis(0), *b).assign(&ta);
            }
        }
        OutputFault::Scale(f) => t.mapv_inplace(|v| v * f),
        OutputFault::Negate => t.mapv_inplace(|v| -v),
        OutputFault::Shift(k) => {
            let axis = if layout == Layout::ChannelMajor {
                t.ndim().saturating_sub(1)
            } else {
                0
            };
            if t.ndim() > 0 {
                let n = t.shape()[axis] as i64;
                let src = t.clone();
                t.fill(0.0);
                for i in 0..n {
                    let j = i - k;
                    if (0..n).contains(&j) {
                        t.index_axis_mut(ndarray::Axis(axis), i as usize)
                            .assign(&src.index_axis(ndarray::Axis(axis), j as usize));
                    }
                }
            }
        }
        OutputFault::TokenMajorLeak => {
            if layout == Layout::HeadMajor && t.ndim() == 3 {
                // The consumer reads head-major [H, T, D], but the buffer holds [T, H*D] rows.
                let (h, tt, d) = (t.shape()[0], t.shape()[1], t.shape()[2]);
                let token_major = t
                    .view()
                    .permuted_axes(ndarray::IxDyn(&[1, 0, 2]))
                    .as_standard_layout()
                    .into_owned();
                if let Ok(flat) = token_major.into_shape_with_order(ndarray::IxDyn(&[h, tt, d])) {
                    *t = flat;
                }
            }
        }
    }
}

/// A catalogue entry: a realistic bring-up bug with where it is planted by default and where the
/// harness must localize it (the self-test checks exactly that name and step).
#[derive(Debug, Clone)]
pub struct CatalogueEntry {
    /// Fault name (`--inject NAME`).
    pub name: &'static str,
    /// Family it applies to.
    pub family: &'static str,
    /// What bug it imitates.
    pub description: &'static str,
    /// Default target: an op-name glob (parameter faults) or an edge/checkpoint glob (outputs).
    pub default_target: &'static str,
    /// Only at this step (None: every step).
    pub step: Option<usize>,
    /// The checkpoint and step where the harness must put the origin for the default target.
    pub expected_origin: (&'static str, usize),
    /// The signature the harness must name for it (empty: any; the self-test checks it).
    pub expected_signature: &'static str,
    /// Needs a previous input through the same model (stale-state bugs).
    pub needs_second_input: bool,
    build: fn(&serde_json::Value) -> Result<FaultKind, String>,
}

impl CatalogueEntry {
    /// The fault for a model config; a config key the fault needs and the config lacks is an
    /// error naming it.
    pub fn kind(&self, config: &serde_json::Value) -> crate::Result<FaultKind> {
        (self.build)(config)
            .map_err(|e| crate::RuntimeError::Fault(format!("fault '{}': {e}", self.name)))
    }
}

/// A number from config.json by dotted key, or an error naming the key.
fn num(c: &serde_json::Value, key: &str) -> Result<f64, String> {
    key.split('.')
        .fold(Some(c), |v, k| v.and_then(|v| v.get(k)))
        .and_then(|v| v.as_f64())
        .ok_or_else(|| format!("config.json has no number at '{key}'"))
}

fn granite_head_dim(c: &serde_json::Value) -> Result<f32, String> {
    Ok((num(c, "text_config.hidden_size")? / num(c, "text_config.num_attention_heads")?) as f32)
}

/// The fault catalogue.
pub fn catalogue() -> Vec<CatalogueEntry> {
    use FaultKind::*;
    use OutputFault::*;
    use ParamFault::*;
    vec![
        CatalogueEntry {
            name: "cross_k_token_major",
            family: "whisper",
            description:
                "cross-attention K cache left token-major where the consumer reads head-major",
            default_target: "audio.decoder.layer.1.cross_k",
            step: None,
            expected_origin: ("audio.decoder.layer.1.cross_k", 0),
            expected_signature: "permutation",
            needs_second_input: false,
            build: |_| Ok(Output(TokenMajorLeak)),
        },
        CatalogueEntry {
            name: "attn_scale_dropped",
            family: "whisper",
            description:
                "cross-attention softmax without the 1/sqrt(head_dim) scale (scores unscaled)",
            default_target: "decoder.layer.1.cross_attn",
            step: None,
            expected_origin: ("audio.decoder.layer.1.cross_attention.output", 0),
            expected_signature: "",
            needs_second_input: false,
            build: |c| {
                let d = num(c, "d_model")? / num(c, "decoder_attention_heads")?;
                Ok(Param(AttnScale(d.sqrt() as f32)))
            },
        },
        CatalogueEntry {
            name: "causal_mask_dropped",
            family: "whisper",
            description:
                "decoder self-attention without its causal mask (prefill sees future tokens)",
            default_target: "decoder.layer.0.self_attn",
            step: None,
            expected_origin: ("audio.decoder.layer.0.self_attention.probs", 0),
            expected_signature: "mask",
            needs_second_input: false,
            build: |_| Ok(Param(Causal(false))),
        },
        CatalogueEntry {
            name: "causal_mask_added",
            family: "whisper",
            description: "encoder self-attention with a causal mask it must not have",
            default_target: "encoder.layer.0.self_attn",
            step: None,
            expected_origin: ("audio.encoder.layer.0.out", 0),
            expected_signature: "",
            needs_second_input: false,
            build: |_| Ok(Param(Causal(true))),
        },
        CatalogueEntry {
            name: "stale_cross_cache",
            family: "whisper",
            description:
                "cross-attention K/V cache not invalidated when new encoder memory is installed",
            default_target: "",
            step: None,
            expected_origin: ("audio.decoder.layer.0.cross_attention.output", 1),
            expected_signature: "",
            needs_second_input: true,
            build: |_| Ok(Host("stale_cross_cache".into())),
        },
        CatalogueEntry {
            name: "layernorm_eps",
            family: "whisper",
            description: "LayerNorm epsilon 1e-1 instead of 1e-5 (encoder layer 1, MLP norm)",
            default_target: "encoder.layer.1.mlp_norm",
            step: None,
            expected_origin: ("audio.encoder.layer.1.out", 0),
            expected_signature: "",
            needs_second_input: false,
            build: |_| Ok(Param(Eps(1e-1))),
        },
        CatalogueEntry {
            name: "round_f16",
            family: "whisper",
            description: "encoder memory rounded to f16 (a half-precision buffer in the bridge)",
            default_target: "audio.encoder.memory",
            step: None,
            expected_origin: ("audio.encoder.memory", 0),
            expected_signature: "rounding",
            needs_second_input: false,
            build: |_| Ok(Output(RoundF16)),
        },
        CatalogueEntry {
            name: "round_bf16",
            family: "whisper",
            description: "decoder layer 0 cross-attention context rounded to bf16",
            default_target: "audio.decoder.layer.0.cross_attention.output",
            step: None,
            expected_origin: ("audio.decoder.layer.0.cross_attention.output", 0),
            expected_signature: "rounding",
            needs_second_input: false,
            build: |_| Ok(Output(RoundBf16)),
        },
        CatalogueEntry {
            name: "nan_one",
            family: "whisper",
            description: "one NaN written into decoder layer 1's output at decode step 2",
            default_target: "audio.decoder.layer.1.out",
            step: Some(2),
            expected_origin: ("audio.decoder.layer.1.out", 2),
            expected_signature: "non_finite",
            needs_second_input: false,
            build: |_| Ok(Output(Nan(5))),
        },
        CatalogueEntry {
            name: "swap_heads",
            family: "whisper",
            description: "heads 0 and 1 swapped in decoder layer 1's cross-attention context",
            default_target: "audio.decoder.layer.1.cross_attention.output",
            step: None,
            expected_origin: ("audio.decoder.layer.1.cross_attention.output", 0),
            expected_signature: "subset",
            needs_second_input: false,
            build: |_| Ok(Output(SwapHeads(0, 1))),
        },
        CatalogueEntry {
            name: "out_proj_sign_flip",
            family: "whisper",
            description:
                "decoder layer 0 cross-attention output projection with the wrong sign convention",
            default_target: "audio.decoder.layer.0.cross_attention.out_proj",
            step: None,
            expected_origin: ("audio.decoder.layer.0.cross_attention.out_proj", 0),
            expected_signature: "sign_flip",
            needs_second_input: false,
            build: |_| Ok(Output(Negate)),
        },
        CatalogueEntry {
            name: "conv_pad_off_by_one",
            family: "whisper",
            description: "conv1 output shifted one frame late (padding applied on the wrong side)",
            default_target: "audio.encoder.conv1.out",
            step: None,
            expected_origin: ("audio.encoder.conv1.out", 0),
            expected_signature: "shift",
            needs_second_input: false,
            build: |_| Ok(Output(Shift(1))),
        },
        CatalogueEntry {
            name: "logits_scaling_applied",
            family: "granite_nar",
            description:
                "text logits divided by logits_scaling (the wrapper the NLE reference bypasses)",
            default_target: "dec.text_logits",
            step: None,
            expected_origin: ("dec.text_logits", 0),
            expected_signature: "scale",
            needs_second_input: false,
            build: |c| {
                Ok(Output(Scale(
                    1.0 / num(c, "text_config.logits_scaling")? as f32,
                )))
            },
        },
        CatalogueEntry {
            name: "bpe_head_sign_flip",
            family: "granite_nar",
            description:
                "BPE-CTC head with the wrong sign: another hypothesis, so every dec.* shape changes",
            default_target: "enc.ctc_bpe_logits",
            step: None,
            expected_origin: ("enc.ctc_bpe_logits", 0),
            expected_signature: "sign_flip",
            needs_second_input: false,
            build: |_| Ok(Output(Negate)),
        },
        CatalogueEntry {
            name: "causal_mask_added",
            family: "granite_nar",
            description:
                "bidirectional LM run with a causal mask (the transformers auto-mask trap)",
            default_target: "dec.layer.0.attn",
            step: None,
            expected_origin: ("dec.layer.0.attn_probs", 0),
            expected_signature: "mask",
            needs_second_input: false,
            build: |_| Ok(Param(Causal(true))),
        },
        CatalogueEntry {
            name: "ctc_bypass_skipped",
            family: "granite_nar",
            description:
                "self-conditioned CTC bypass not added back before the second half of the encoder",
            default_target: "enc.self_cond.bypass_add",
            step: None,
            expected_origin: ("enc.block.SC.out", 0),
            expected_signature: "",
            needs_second_input: false,
            build: |_| Ok(Param(SkipBranch)),
        },
        CatalogueEntry {
            name: "rope_off_by_one",
            family: "granite_nar",
            description: "RoPE positions shifted by one in decoder layer 1",
            default_target: "dec.layer.1.attn",
            step: None,
            expected_origin: ("dec.layer.1.attn_probs", 0),
            expected_signature: "",
            needs_second_input: false,
            build: |_| Ok(Param(RopeOffset(1))),
        },
        CatalogueEntry {
            name: "attn_scale_sqrt_d",
            family: "granite_nar",
            description: "LM attention scaled by 1/sqrt(head_dim) instead of attention_multiplier",
            default_target: "dec.layer.0.attn",
            step: None,
            expected_origin: ("dec.layer.0.attn_probs", 0),
            expected_signature: "",
            needs_second_input: false,
            build: |c| {
                let m = num(c, "text_config.attention_multiplier")? as f32;
                Ok(Param(AttnScale(1.0 / granite_head_dim(c)?.sqrt() / m)))
            },
        },
        CatalogueEntry {
            name: "round_bf16",
            family: "granite_nar",
            description: "projector output rounded to bf16",
            default_target: "proj.out",
            step: None,
            expected_origin: ("proj.out", 0),
            expected_signature: "rounding",
            needs_second_input: false,
            build: |_| Ok(Output(RoundBf16)),
        },
    ]
}

/// Resolve `NAME` or `NAME@TARGET` for a family into a planted fault.
pub fn plant(spec: &str, family: &str, config: &serde_json::Value) -> crate::Result<Planted> {
    let (name, target) = match spec.split_once('@') {
        Some((n, t)) => (n, Some(t)),
        None => (spec, None),
    };
    let e = catalogue()
        .into_iter()
        .find(|e| e.name == name && e.family == family)
        .ok_or_else(|| {
            let names: Vec<&str> = catalogue()
                .iter()
                .filter(|e| e.family == family)
                .map(|e| e.name)
                .collect();
            crate::RuntimeError::Fault(format!(
                "no fault '{name}' for family {family}; known: {}",
                names.join(", ")
            ))
        })?;
    Ok(Planted {
        name: name.to_string(),
        kind: e.kind(config)?,
        target: target.unwrap_or(e.default_target).to_string(),
        step: e.step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fault that needs a config number the config lacks is refused, naming the key.
    #[test]
    fn missing_config_key_fails_closed() {
        let e = plant(
            "attn_scale_dropped",
            "whisper",
            &serde_json::json!({"d_model": 384}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("decoder_attention_heads"), "{e}");
        let ok = plant(
            "attn_scale_dropped",
            "whisper",
            &serde_json::json!({"d_model": 384, "decoder_attention_heads": 6}),
        )
        .unwrap();
        assert!(matches!(ok.kind, FaultKind::Param(ParamFault::AttnScale(s)) if s == 8.0));
        let e = plant(
            "logits_scaling_applied",
            "granite_nar",
            &serde_json::json!({}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("text_config.logits_scaling"), "{e}");
    }
}
