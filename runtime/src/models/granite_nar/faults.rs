//! The granite_nar fault catalogue: realistic bring-up bugs planted in this family's graph, each with
//! where the harness must localize it (`xray selftest` checks the origin and the signature).

use crate::faults::{num, CatalogueEntry, FaultKind, OutputFault, ParamFault};
use xray_core::SignatureKind;

/// This family's catalogue entries.
pub fn catalogue() -> Vec<CatalogueEntry> {
    use FaultKind::*;
    use OutputFault::*;
    use ParamFault::*;
    vec![
        CatalogueEntry {
            name: "logits_scaling_applied",
            family: super::NAME,
            description:
                "text logits divided by logits_scaling (the wrapper the NLE reference bypasses)",
            default_target: "dec.text_logits",
            step: None,
            expected_origin: ("dec.text_logits", 0),
            expected_signature: Some(SignatureKind::Scale),
            expected_op_signature: None,
            needs_second_input: false,
            build: |c| {
                Ok(Output(Scale(
                    1.0 / num(c, "text_config.logits_scaling")? as f32,
                )))
            },
        },
        CatalogueEntry {
            name: "bpe_head_sign_flip",
            family: super::NAME,
            description:
                "BPE-CTC head with the wrong sign: another hypothesis, so every dec.* shape changes",
            default_target: "enc.ctc_bpe_logits",
            step: None,
            expected_origin: ("enc.ctc_bpe_logits", 0),
            expected_signature: Some(SignatureKind::SignFlip),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(Negate)),
        },
        CatalogueEntry {
            name: "causal_mask_added",
            family: super::NAME,
            description:
                "bidirectional LM run with a causal mask (the transformers auto-mask trap)",
            default_target: "dec.layer.0.attn",
            step: None,
            expected_origin: ("dec.layer.0.attn_probs", 0),
            expected_signature: Some(SignatureKind::Mask),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Param(Causal(true))),
        },
        CatalogueEntry {
            name: "ctc_bypass_skipped",
            family: super::NAME,
            description:
                "self-conditioned CTC bypass not added back before the second half of the encoder",
            default_target: "enc.self_cond.bypass_add",
            step: None,
            expected_origin: ("enc.block.{sc_layer}.out", 0),
            expected_signature: None,
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Param(SkipBranch)),
        },
        CatalogueEntry {
            name: "rope_off_by_one",
            family: super::NAME,
            description: "RoPE positions shifted by one in decoder layer 1",
            default_target: "dec.layer.1.attn",
            step: None,
            expected_origin: ("dec.layer.1.attn_probs", 0),
            expected_signature: None,
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Param(RopeOffset(1))),
        },
        CatalogueEntry {
            name: "attn_scale_sqrt_d",
            family: super::NAME,
            description: "LM attention scaled by 1/sqrt(head_dim) instead of attention_multiplier",
            default_target: "dec.layer.0.attn",
            step: None,
            expected_origin: ("dec.layer.0.attn_probs", 0),
            expected_signature: None,
            expected_op_signature: None,
            needs_second_input: false,
            build: |c| {
                let m = num(c, "text_config.attention_multiplier")? as f32;
                Ok(Param(AttnScale(1.0 / granite_head_dim(c)?.sqrt() / m)))
            },
        },
        CatalogueEntry {
            name: "round_bf16",
            family: super::NAME,
            description: "projector output rounded to bf16",
            default_target: "proj.out",
            step: None,
            expected_origin: ("proj.out", 0),
            expected_signature: Some(SignatureKind::Rounding),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(RoundBf16)),
        },
    ]
}

fn granite_head_dim(c: &serde_json::Value) -> Result<f32, String> {
    Ok((num(c, "text_config.hidden_size")? / num(c, "text_config.num_attention_heads")?) as f32)
}
