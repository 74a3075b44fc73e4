//! The whisper fault catalogue: realistic bring-up bugs planted in this family's graph, each with
//! where the harness must localize it (`xray selftest` checks the origin and the signature).

use crate::faults::{num, CatalogueEntry, FaultKind, KernelFault, OutputFault, ParamFault};
use xray_core::SignatureKind;

/// This family's catalogue entries.
pub fn catalogue() -> Vec<CatalogueEntry> {
    use FaultKind::*;
    use KernelFault::*;
    use OutputFault::*;
    use ParamFault::*;
    vec![
        CatalogueEntry {
            name: "cross_k_token_major",
            family: super::NAME,
            description:
                "cross-attention K cache left token-major where the consumer reads head-major",
            default_target: "audio.decoder.layer.1.cross_k",
            step: None,
            expected_origin: ("audio.decoder.layer.1.cross_k", 0),
            expected_signature: Some(SignatureKind::Permutation),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(TokenMajorLeak)),
        },
        CatalogueEntry {
            name: "attn_scale_dropped",
            family: super::NAME,
            description:
                "cross-attention softmax without the 1/sqrt(head_dim) scale (scores unscaled)",
            default_target: "decoder.layer.1.cross_attn",
            step: None,
            expected_origin: ("audio.decoder.layer.1.cross_attention.output", 0),
            expected_signature: None,
            expected_op_signature: None,
            needs_second_input: false,
            build: |c| {
                let d = num(c, "d_model")? / num(c, "decoder_attention_heads")?;
                Ok(Param(AttnScale(d.sqrt() as f32)))
            },
        },
        CatalogueEntry {
            name: "causal_mask_dropped",
            family: super::NAME,
            description:
                "decoder self-attention without its causal mask (prefill sees future tokens)",
            default_target: "decoder.layer.0.self_attn",
            step: None,
            expected_origin: ("audio.decoder.layer.0.self_attention.probs", 0),
            expected_signature: Some(SignatureKind::Mask),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Param(Causal(false))),
        },
        CatalogueEntry {
            name: "causal_mask_added",
            family: super::NAME,
            description: "encoder self-attention with a causal mask it must not have",
            default_target: "encoder.layer.0.self_attn",
            step: None,
            expected_origin: ("audio.encoder.layer.0.out", 0),
            expected_signature: None,
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Param(Causal(true))),
        },
        CatalogueEntry {
            name: "stale_cross_cache",
            family: super::NAME,
            description:
                "cross-attention K/V cache not invalidated when new encoder memory is installed",
            default_target: "",
            step: None,
            expected_origin: ("audio.decoder.layer.0.cross_attention.output", 1),
            expected_signature: None,
            expected_op_signature: None,
            needs_second_input: true,
            build: |_| Ok(Host(super::decode::STALE_CROSS_CACHE.into())),
        },
        CatalogueEntry {
            name: "position_ahead",
            family: super::NAME,
            description:
                "decode loop feeds the position one ahead of the cache length from step 3 on (a position counter advanced twice)",
            default_target: "",
            step: None,
            expected_origin: ("audio.decoder.position_ids", 3),
            expected_signature: Some(SignatureKind::Shift),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Host(super::decode::POSITION_AHEAD.into())),
        },
        CatalogueEntry {
            name: "layernorm_eps",
            family: super::NAME,
            description: "LayerNorm epsilon 1e-1 instead of 1e-5 (encoder layer 1, MLP norm)",
            default_target: "encoder.layer.1.mlp_norm",
            step: None,
            expected_origin: ("audio.encoder.layer.1.out", 0),
            expected_signature: None,
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Param(Eps(1e-1))),
        },
        CatalogueEntry {
            name: "round_f16",
            family: super::NAME,
            description: "encoder memory rounded to f16 (a half-precision buffer in the bridge)",
            default_target: "audio.encoder.memory",
            step: None,
            expected_origin: ("audio.encoder.memory", 0),
            expected_signature: Some(SignatureKind::Rounding),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(RoundF16)),
        },
        CatalogueEntry {
            name: "round_bf16",
            family: super::NAME,
            description: "decoder layer 0 cross-attention context rounded to bf16",
            default_target: "audio.decoder.layer.0.cross_attention.output",
            step: None,
            expected_origin: ("audio.decoder.layer.0.cross_attention.output", 0),
            expected_signature: Some(SignatureKind::Rounding),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(RoundBf16)),
        },
        CatalogueEntry {
            name: "nan_one",
            family: super::NAME,
            description: "one NaN written into decoder layer 1's output at decode step 2",
            default_target: "audio.decoder.layer.1.out",
            step: Some(2),
            expected_origin: ("audio.decoder.layer.1.out", 2),
            expected_signature: Some(SignatureKind::NonFinite),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(Nan(5))),
        },
        CatalogueEntry {
            name: "swap_heads",
            family: super::NAME,
            description: "heads 0 and 1 swapped in decoder layer 1's cross-attention context",
            default_target: "audio.decoder.layer.1.cross_attention.output",
            step: None,
            expected_origin: ("audio.decoder.layer.1.cross_attention.output", 0),
            expected_signature: Some(SignatureKind::Subset),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(SwapHeads(0, 1))),
        },
        CatalogueEntry {
            name: "out_proj_sign_flip",
            family: super::NAME,
            description:
                "decoder layer 0 cross-attention output projection with the wrong sign convention",
            default_target: "audio.decoder.layer.0.cross_attention.out_proj",
            step: None,
            expected_origin: ("audio.decoder.layer.0.cross_attention.out_proj", 0),
            expected_signature: Some(SignatureKind::SignFlip),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(Negate)),
        },
        CatalogueEntry {
            name: "conv_pad_off_by_one",
            family: super::NAME,
            description: "conv1 output shifted one frame late (padding applied on the wrong side)",
            default_target: "audio.encoder.conv1.out",
            step: None,
            expected_origin: ("audio.encoder.conv1.out", 0),
            expected_signature: Some(SignatureKind::Shift),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Output(Shift(1))),
        },
        CatalogueEntry {
            name: "decode_temperature",
            family: super::NAME,
            description:
                "decoder layer 1 self-attention scores scaled by 1.25 at decode step 1 (a temperature)",
            default_target: "decoder.layer.1.self_attn",
            step: Some(1),
            expected_origin: ("audio.decoder.layer.1.self_attention.probs", 1),
            expected_signature: Some(SignatureKind::Temperature),
            expected_op_signature: None,
            needs_second_input: false,
            build: |c| {
                let d = num(c, "d_model")? / num(c, "decoder_attention_heads")?;
                Ok(Param(AttnScale((1.25 / d.sqrt()) as f32)))
            },
        },
        CatalogueEntry {
            name: "layernorm_unbiased_var",
            family: super::NAME,
            description:
                "encoder final LayerNorm with the unbiased variance (divides by n-1, torch.var's default)",
            default_target: "encoder.final_norm",
            step: None,
            expected_origin: ("audio.encoder.memory", 0),
            expected_signature: Some(SignatureKind::RowAffine),
            expected_op_signature: None,
            needs_second_input: false,
            build: |_| Ok(Kernel(LayerNormUnbiasedVar)),
        },
        CatalogueEntry {
            name: "mel_clamp_floor",
            family: super::NAME,
            description: "log-mel dynamic-range floor at max-7 instead of max-8",
            default_target: "audio.frontend.mel",
            step: None,
            expected_origin: ("audio.frontend.mel", 0),
            expected_signature: Some(SignatureKind::Clamp),
            expected_op_signature: None,
            needs_second_input: false,
            // y = (max(l, M - 8) + 4) / 4: a floor at M - 7 is y_max - 7/4 in y.
            build: |_| Ok(Output(FloorBelowMax(7.0 / 4.0))),
        },
        CatalogueEntry {
            name: "cross_k_wrong_layer",
            family: super::NAME,
            description: "decoder layer 1 cross-attention K projection reading layer 0's weight",
            default_target: "decoder.layer.1.cross_k_proj",
            step: None,
            expected_origin: ("audio.decoder.layer.1.cross_k", 0),
            expected_signature: Some(SignatureKind::Wiring),
            expected_op_signature: Some(SignatureKind::Wiring),
            needs_second_input: false,
            build: |_| {
                Ok(WeightKey {
                    role: "weight".into(),
                    key: "model.decoder.layers.0.encoder_attn.k_proj.weight".into(),
                })
            },
        },
        CatalogueEntry {
            name: "gelu_tanh",
            family: super::NAME,
            description: "encoder layer 1 GELU computed with the tanh approximation instead of erf",
            default_target: "encoder.layer.1.gelu",
            step: None,
            expected_origin: ("audio.encoder.layer.1.out", 0),
            expected_signature: None,
            expected_op_signature: Some(SignatureKind::Elementwise),
            needs_second_input: false,
            build: |_| Ok(Kernel(GeluTanh)),
        },
        CatalogueEntry {
            name: "out_proj_int8",
            family: super::NAME,
            description:
                "encoder layer 1 self-attention out_proj weight rounded to int8, one scale per row",
            default_target: "encoder.layer.1.out_proj",
            step: None,
            expected_origin: ("audio.encoder.layer.1.out", 0),
            expected_signature: None,
            expected_op_signature: Some(SignatureKind::GridQuantization),
            needs_second_input: false,
            build: |_| Ok(Kernel(WeightGridPerRow(8))),
        },
    ]
}
