//! The whisper fault catalogue: realistic bring-up bugs planted in this family's graph, each with
//! where the harness must localize it (`xray selftest` checks the origin and the signature).

use crate::faults::{
    num, CatalogueEntry, FamilyFaults, FaultKind, KernelFault, OutputFault, ParamFault,
};
use xray_core::SignatureKind as Sig;

/// This family's catalogue entries.
pub fn catalogue() -> Vec<CatalogueEntry> {
    use FaultKind::*;
    use KernelFault::*;
    use OutputFault::*;
    use ParamFault::*;
    let f = FamilyFaults(super::NAME);
    vec![
        f.fault(
            "cross_k_token_major",
            "cross-attention K cache left token-major where the consumer reads head-major",
            "audio.decoder.layer.1.cross_k",
            ("audio.decoder.layer.1.cross_k", 0),
            Some(Sig::Permutation),
            |_| Ok(Output(TokenMajorLeak)),
        ),
        f.fault(
            "attn_scale_dropped",
            "cross-attention softmax without the 1/sqrt(head_dim) scale (scores unscaled)",
            "decoder.layer.1.cross_attn",
            ("audio.decoder.layer.1.cross_attention.output", 0),
            None,
            |c| {
                let d = num(c, "d_model")? / num(c, "decoder_attention_heads")?;
                Ok(Param(AttnScale(d.sqrt() as f32)))
            },
        ),
        f.fault(
            "causal_mask_dropped",
            "decoder self-attention without its causal mask (prefill sees future tokens)",
            "decoder.layer.0.self_attn",
            ("audio.decoder.layer.0.self_attention.probs", 0),
            Some(Sig::Mask),
            |_| Ok(Param(Causal(false))),
        ),
        f.fault(
            "causal_mask_added",
            "encoder self-attention with a causal mask it must not have",
            "encoder.layer.0.self_attn",
            ("audio.encoder.layer.0.out", 0),
            None,
            |_| Ok(Param(Causal(true))),
        ),
        f.fault(
            "stale_cross_cache",
            "cross-attention K/V cache not invalidated when new encoder memory is installed",
            "",
            ("audio.decoder.layer.0.cross_attention.output", 1),
            None,
            |_| Ok(Host(super::decode::STALE_CROSS_CACHE.into())),
        )
        .second_input(),
        f.fault(
            "position_ahead",
            "decode loop feeds the position one ahead of the cache length from step 3 on (a position counter advanced twice)",
            "",
            ("audio.decoder.position_ids", 3),
            Some(Sig::Shift),
            |_| Ok(Host(super::decode::POSITION_AHEAD.into())),
        ),
        f.fault(
            "layernorm_eps",
            "LayerNorm epsilon 1e-1 instead of 1e-5 (encoder layer 1, MLP norm)",
            "encoder.layer.1.mlp_norm",
            ("audio.encoder.layer.1.out", 0),
            None,
            |_| Ok(Param(Eps(1e-1))),
        ),
        f.fault(
            "round_f16",
            "encoder memory rounded to f16 (a half-precision buffer in the bridge)",
            "audio.encoder.memory",
            ("audio.encoder.memory", 0),
            Some(Sig::Rounding),
            |_| Ok(Output(RoundF16)),
        ),
        f.fault(
            "round_bf16",
            "decoder layer 0 cross-attention context rounded to bf16",
            "audio.decoder.layer.0.cross_attention.output",
            ("audio.decoder.layer.0.cross_attention.output", 0),
            Some(Sig::Rounding),
            |_| Ok(Output(RoundBf16)),
        ),
        f.fault(
            "nan_one",
            "one NaN written into decoder layer 1's output at decode step 2",
            "audio.decoder.layer.1.out",
            ("audio.decoder.layer.1.out", 2),
            Some(Sig::NonFinite),
            |_| Ok(Output(Nan(5))),
        )
        .at_step(2),
        f.fault(
            "swap_heads",
            "heads 0 and 1 swapped in decoder layer 1's cross-attention context",
            "audio.decoder.layer.1.cross_attention.output",
            ("audio.decoder.layer.1.cross_attention.output", 0),
            Some(Sig::Subset),
            |_| Ok(Output(SwapHeads(0, 1))),
        ),
        f.fault(
            "out_proj_sign_flip",
            "decoder layer 0 cross-attention output projection with the wrong sign convention",
            "audio.decoder.layer.0.cross_attention.out_proj",
            ("audio.decoder.layer.0.cross_attention.out_proj", 0),
            Some(Sig::SignFlip),
            |_| Ok(Output(Negate)),
        ),
        f.fault(
            "conv_pad_off_by_one",
            "conv1 output shifted one frame late (padding applied on the wrong side)",
            "audio.encoder.conv1.out",
            ("audio.encoder.conv1.out", 0),
            Some(Sig::Shift),
            |_| Ok(Output(Shift(1))),
        ),
        f.fault(
            "decode_temperature",
            "decoder layer 1 self-attention scores scaled by 1.25 at decode step 1 (a temperature)",
            "decoder.layer.1.self_attn",
            ("audio.decoder.layer.1.self_attention.probs", 1),
            Some(Sig::Temperature),
            |c| {
                let d = num(c, "d_model")? / num(c, "decoder_attention_heads")?;
                Ok(Param(AttnScale((1.25 / d.sqrt()) as f32)))
            },
        )
        .at_step(1),
        f.fault(
            "layernorm_unbiased_var",
            "encoder final LayerNorm with the unbiased variance (divides by n-1, torch.var's default)",
            "encoder.final_norm",
            ("audio.encoder.memory", 0),
            Some(Sig::RowAffine),
            |_| Ok(Kernel(LayerNormUnbiasedVar)),
        ),
        // y = (max(l, M - 8) + 4) / 4: a floor at M - 7 is y_max - 7/4 in y.
        f.fault(
            "mel_clamp_floor",
            "log-mel dynamic-range floor at max-7 instead of max-8",
            "audio.frontend.mel",
            ("audio.frontend.mel", 0),
            Some(Sig::Clamp),
            |_| Ok(Output(FloorBelowMax(7.0 / 4.0))),
        ),
        f.fault(
            "cross_k_wrong_layer",
            "decoder layer 1 cross-attention K projection reading layer 0's weight",
            "decoder.layer.1.cross_k_proj",
            ("audio.decoder.layer.1.cross_k", 0),
            Some(Sig::Wiring),
            |_| {
                Ok(WeightKey {
                    role: "weight".into(),
                    key: "model.decoder.layers.0.encoder_attn.k_proj.weight".into(),
                })
            },
        )
        .op_signature(Sig::Wiring),
        f.fault(
            "gelu_tanh",
            "encoder layer 1 GELU computed with the tanh approximation instead of erf",
            "encoder.layer.1.gelu",
            ("audio.encoder.layer.1.out", 0),
            None,
            |_| Ok(Kernel(GeluTanh)),
        )
        .op_signature(Sig::Elementwise),
        f.fault(
            "out_proj_int8",
            "encoder layer 1 self-attention out_proj weight rounded to int8, one scale per row",
            "encoder.layer.1.out_proj",
            ("audio.encoder.layer.1.out", 0),
            None,
            |_| Ok(Kernel(WeightGridPerRow(8))),
        )
        .op_signature(Sig::GridQuantization),
    ]
}
