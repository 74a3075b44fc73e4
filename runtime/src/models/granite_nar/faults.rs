//! The granite_nar fault catalogue: realistic bring-up bugs planted in this family's graph, each with
//! where the harness must localize it (`xray selftest` checks the origin and the signature).

use crate::faults::{num, CatalogueEntry, FamilyFaults, FaultKind, OutputFault, ParamFault};
use xray_core::SignatureKind as Sig;

/// This family's catalogue entries.
pub fn catalogue() -> Vec<CatalogueEntry> {
    use FaultKind::*;
    use OutputFault::*;
    use ParamFault::*;
    let f = FamilyFaults(super::NAME);
    vec![
        f.fault(
            "logits_scaling_applied",
            "text logits divided by logits_scaling (the wrapper the NLE reference bypasses)",
            "dec.text_logits",
            ("dec.text_logits", 0),
            Some(Sig::Scale),
            |c| {
                Ok(Output(Scale(
                    1.0 / num(c, "text_config.logits_scaling")? as f32,
                )))
            },
        ),
        f.fault(
            "bpe_head_sign_flip",
            "BPE-CTC head with the wrong sign: another hypothesis, so every dec.* shape changes",
            "enc.ctc_bpe_logits",
            ("enc.ctc_bpe_logits", 0),
            Some(Sig::SignFlip),
            |_| Ok(Output(Negate)),
        ),
        f.fault(
            "causal_mask_added",
            "bidirectional LM run with a causal mask (the transformers auto-mask trap)",
            "dec.layer.0.attn",
            ("dec.layer.0.attn_probs", 0),
            Some(Sig::Mask),
            |_| Ok(Param(Causal(true))),
        ),
        f.fault(
            "ctc_bypass_skipped",
            "self-conditioned CTC bypass not added back before the second half of the encoder",
            "enc.self_cond.bypass_add",
            ("enc.block.{sc_layer}.out", 0),
            None,
            |_| Ok(Param(SkipBranch)),
        ),
        f.fault(
            "rope_off_by_one",
            "RoPE positions shifted by one in decoder layer 1",
            "dec.layer.1.attn",
            ("dec.layer.1.attn_probs", 0),
            None,
            |_| Ok(Param(RopeOffset(1))),
        ),
        f.fault(
            "attn_scale_sqrt_d",
            "LM attention scaled by 1/sqrt(head_dim) instead of attention_multiplier",
            "dec.layer.0.attn",
            ("dec.layer.0.attn_probs", 0),
            None,
            |c| {
                let m = num(c, "text_config.attention_multiplier")? as f32;
                Ok(Param(AttnScale(1.0 / granite_head_dim(c)?.sqrt() / m)))
            },
        ),
        f.fault(
            "round_bf16",
            "projector output rounded to bf16",
            "proj.out",
            ("proj.out", 0),
            Some(Sig::Rounding),
            |_| Ok(Output(RoundBf16)),
        ),
    ]
}

fn granite_head_dim(c: &serde_json::Value) -> Result<f32, String> {
    Ok((num(c, "text_config.hidden_size")? / num(c, "text_config.num_attention_heads")?) as f32)
}
