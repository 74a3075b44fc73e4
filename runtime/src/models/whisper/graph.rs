//! The Whisper graph, built once from config.json + preprocessor_config.json: frontend, encoder,
//! decoder with explicit self-attention cache feeds/outputs and the cross-attention K/V projection
//! cache edges. It holds no weights and no caches. Op names are the contract's producers.
//!
//! Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
//! (`WhisperEncoder`, `WhisperEncoderLayer`, `WhisperDecoder`, `WhisperDecoderLayer`,
//! `WhisperForConditionalGeneration.forward`).

use std::path::Path;

use super::{PreprocessorConfig, WhisperConfig, LAYER_NORM_EPS};
use crate::error::Result;
use crate::graph::{EdgeId, Graph, GraphBuilder, Layout};
use crate::kernels::{
    Add, AddTable, Attention, ChannelToToken, Conv1d, Embedding, Gelu, KvAppend, LayerNorm, Linear,
    MatmulStrategy, MergeHeads, SplitHeads,
};
use crate::shape;

/// Names of the feeds and formula outputs of the Whisper graph.
pub mod names {
    /// pcm samples feed `[samples]`.
    pub const PCM: &str = "pcm";
    /// log-mel `[mel_bins, frames]` (feed it to skip the frontend).
    pub const MEL: &str = "frontend.mel";
    /// encoder memory `[enc_tokens, d_model]`.
    pub const MEMORY: &str = "encoder.memory";
    /// decoder token ids feed `[tokens]`.
    pub const INPUT_IDS: &str = "decoder.input_ids";
    /// decoder position ids feed `[tokens]` (`past .. past + tokens`).
    pub const POSITION_IDS: &str = "decoder.position_ids";
    /// logits `[tokens, vocab]`.
    pub const LOGITS: &str = "decoder.logits";
    /// Self-attention K cache in (`[heads, past, head_dim]`) of layer `i`.
    pub fn self_k_past(i: usize) -> String {
        format!("decoder.layer.{i}.self_k_past")
    }
    /// Self-attention V cache in of layer `i`.
    pub fn self_v_past(i: usize) -> String {
        format!("decoder.layer.{i}.self_v_past")
    }
    /// Self-attention K cache out (`[heads, past+tokens, head_dim]`) of layer `i`.
    pub fn self_k(i: usize) -> String {
        format!("decoder.layer.{i}.self_k")
    }
    /// Self-attention V cache out of layer `i`.
    pub fn self_v(i: usize) -> String {
        format!("decoder.layer.{i}.self_v")
    }
    /// Cross-attention K projection cache (`[heads, enc_tokens, head_dim]`) of layer `i`.
    pub fn cross_k(i: usize) -> String {
        format!("decoder.layer.{i}.cross_k")
    }
    /// Cross-attention V projection cache of layer `i`.
    pub fn cross_v(i: usize) -> String {
        format!("decoder.layer.{i}.cross_v")
    }
}

/// Edge ids of the feeds and outputs, resolved once.
#[derive(Debug, Clone)]
pub struct WhisperEdges {
    /// pcm feed.
    pub pcm: EdgeId,
    /// log-mel.
    pub mel: EdgeId,
    /// encoder memory.
    pub memory: EdgeId,
    /// token ids feed.
    pub input_ids: EdgeId,
    /// position ids feed.
    pub position_ids: EdgeId,
    /// logits.
    pub logits: EdgeId,
    /// per layer: self K past, self V past, self K out, self V out.
    pub self_cache: Vec<[EdgeId; 4]>,
    /// per layer: cross K, cross V.
    pub cross: Vec<[EdgeId; 2]>,
}

fn out(name: &str, shape: crate::graph::Shape, layout: Layout) -> crate::graph::Out {
    crate::graph::Out {
        name: Some(name.to_string()),
        shape,
        layout,
    }
}

/// Build the graph. `weights_file` is only used for the graph's family label; weights are bound
/// later by [`Graph::check_weights`].
pub fn build(
    cfg: &WhisperConfig,
    pre: &PreprocessorConfig,
    pre_path: &Path,
) -> Result<(Graph, WhisperEdges)> {
    let mut g = GraphBuilder::new(super::NAME);
    let d = cfg.d_model;
    let n_mels = cfg.num_mel_bins;
    let s = cfg.max_source_positions;
    let frames = 2 * s;
    let vocab = cfg.vocab_size;
    let gemm = MatmulStrategy::Gemm;
    let stable = MatmulStrategy::RowStable;
    let ln = |g: &mut GraphBuilder,
              name: &str,
              x: EdgeId,
              key: &str,
              rows: crate::graph::Dim|
     -> Result<EdgeId> {
        g.op1(
            name,
            Box::new(LayerNorm::new(LAYER_NORM_EPS)),
            &[x],
            &[
                (&format!("{key}.weight"), vec![d]),
                (&format!("{key}.bias"), vec![d]),
            ],
            vec![rows, d.into()],
            Layout::TokenMajor,
        )
    };
    #[allow(clippy::too_many_arguments)]
    let linear = |g: &mut GraphBuilder,
                  name: &str,
                  x: EdgeId,
                  key: &str,
                  n_in: usize,
                  n_out: usize,
                  bias: bool,
                  strat: MatmulStrategy,
                  rows: crate::graph::Dim|
     -> Result<EdgeId> {
        let mut w = vec![(format!("{key}.weight"), vec![n_out, n_in])];
        if bias {
            w.push((format!("{key}.bias"), vec![n_out]));
        }
        let w: Vec<(&str, Vec<usize>)> = w.iter().map(|(k, s)| (k.as_str(), s.clone())).collect();
        g.op1(
            name,
            Box::new(Linear::new(bias, strat)),
            &[x],
            &w,
            vec![rows, n_out.into()],
            Layout::TokenMajor,
        )
    };

    // ---- Frontend: pcm -> log-mel (transformers WhisperFeatureExtractor).
    let pcm = g.feed(names::PCM, shape!["samples"], Layout::Plain)?;
    let mel = g.op(
        "frontend.log_mel",
        Box::new(pre.log_mel(pre_path)?),
        &[pcm],
        &[],
        vec![out(
            names::MEL,
            shape![n_mels, frames],
            Layout::ChannelMajor,
        )],
    )?[0];
    g.checkpoint(mel, "audio.frontend.mel")?;

    // ---- Encoder stem. Upstream: WhisperEncoder.forward.
    let conv1 = g.op1(
        "encoder.conv1",
        Box::new(Conv1d {
            kernel: 3,
            stride: 1,
            padding: 1,
        }),
        &[mel],
        &[
            ("model.encoder.conv1.weight", vec![d, n_mels, 3]),
            ("model.encoder.conv1.bias", vec![d]),
        ],
        shape![d, frames],
        Layout::ChannelMajor,
    )?;
    g.checkpoint(conv1, "audio.encoder.conv1.out")?;
    let a1 = g.op1(
        "encoder.conv1_gelu",
        Box::new(Gelu),
        &[conv1],
        &[],
        shape![d, frames],
        Layout::ChannelMajor,
    )?;
    let conv2 = g.op1(
        "encoder.conv2",
        Box::new(Conv1d {
            kernel: 3,
            stride: 2,
            padding: 1,
        }),
        &[a1],
        &[
            ("model.encoder.conv2.weight", vec![d, d, 3]),
            ("model.encoder.conv2.bias", vec![d]),
        ],
        shape![d, s],
        Layout::ChannelMajor,
    )?;
    g.checkpoint(conv2, "audio.encoder.conv2.out")?;
    let a2 = g.op1(
        "encoder.conv2_gelu",
        Box::new(Gelu),
        &[conv2],
        &[],
        shape![d, s],
        Layout::ChannelMajor,
    )?;
    let tm = g.op1(
        "encoder.to_token_major",
        Box::new(ChannelToToken),
        &[a2],
        &[],
        shape![s, d],
        Layout::TokenMajor,
    )?;
    let mut h = g.op1(
        "encoder.embed_positions",
        Box::new(AddTable),
        &[tm],
        &[("model.encoder.embed_positions.weight", vec![s, d])],
        shape![s, d],
        Layout::TokenMajor,
    )?;

    // ---- Encoder layers (pre-LN). Upstream: WhisperEncoderLayer.forward.
    let eh = cfg.encoder_attention_heads;
    let ehd = cfg.encoder_head_dim();
    let escale = (ehd as f32).powf(-0.5);
    for i in 0..cfg.encoder_layers {
        let p = format!("encoder.layer.{i}");
        let k = format!("model.encoder.layers.{i}");
        let x = ln(
            &mut g,
            &format!("{p}.self_attn_norm"),
            h,
            &format!("{k}.self_attn_layer_norm"),
            s.into(),
        )?;
        let q = linear(
            &mut g,
            &format!("{p}.q_proj"),
            x,
            &format!("{k}.self_attn.q_proj"),
            d,
            d,
            true,
            gemm,
            s.into(),
        )?;
        let kk = linear(
            &mut g,
            &format!("{p}.k_proj"),
            x,
            &format!("{k}.self_attn.k_proj"),
            d,
            d,
            false,
            gemm,
            s.into(),
        )?;
        let v = linear(
            &mut g,
            &format!("{p}.v_proj"),
            x,
            &format!("{k}.self_attn.v_proj"),
            d,
            d,
            true,
            gemm,
            s.into(),
        )?;
        let mut heads = Vec::new();
        for (n, e) in [("q", q), ("k", kk), ("v", v)] {
            heads.push(g.op1(
                &format!("{p}.{n}_to_head_major"),
                Box::new(SplitHeads { heads: eh }),
                &[e],
                &[],
                shape![eh, s, ehd],
                Layout::HeadMajor,
            )?);
        }
        let att = g.op1(
            &format!("{p}.self_attn"),
            Box::new(Attention {
                scale: escale,
                causal: false,
                strategy: gemm,
                probs: false,
            }),
            &heads,
            &[],
            shape![eh, s, ehd],
            Layout::HeadMajor,
        )?;
        let merged = g.op1(
            &format!("{p}.merge_heads"),
            Box::new(MergeHeads),
            &[att],
            &[],
            shape![s, d],
            Layout::TokenMajor,
        )?;
        let o = linear(
            &mut g,
            &format!("{p}.out_proj"),
            merged,
            &format!("{k}.self_attn.out_proj"),
            d,
            d,
            true,
            gemm,
            s.into(),
        )?;
        let r = g.op1(
            &format!("{p}.residual_attn"),
            Box::new(Add::new()),
            &[h, o],
            &[],
            shape![s, d],
            Layout::TokenMajor,
        )?;
        let x = ln(
            &mut g,
            &format!("{p}.mlp_norm"),
            r,
            &format!("{k}.final_layer_norm"),
            s.into(),
        )?;
        let f1 = linear(
            &mut g,
            &format!("{p}.fc1"),
            x,
            &format!("{k}.fc1"),
            d,
            cfg.encoder_ffn_dim,
            true,
            gemm,
            s.into(),
        )?;
        let ge = g.op1(
            &format!("{p}.gelu"),
            Box::new(Gelu),
            &[f1],
            &[],
            shape![s, cfg.encoder_ffn_dim],
            Layout::TokenMajor,
        )?;
        let f2 = linear(
            &mut g,
            &format!("{p}.fc2"),
            ge,
            &format!("{k}.fc2"),
            cfg.encoder_ffn_dim,
            d,
            true,
            gemm,
            s.into(),
        )?;
        h = g.op1(
            &format!("{p}.residual_mlp"),
            Box::new(Add::new()),
            &[r, f2],
            &[],
            shape![s, d],
            Layout::TokenMajor,
        )?;
        g.checkpoint(h, &format!("audio.encoder.layer.{i}.out"))?;
    }
    let memory = g.op(
        "encoder.final_norm",
        Box::new(LayerNorm::new(LAYER_NORM_EPS)),
        &[h],
        &[
            ("model.encoder.layer_norm.weight", vec![d]),
            ("model.encoder.layer_norm.bias", vec![d]),
        ],
        vec![out(names::MEMORY, shape![s, d], Layout::TokenMajor)],
    )?[0];
    g.checkpoint(memory, "audio.encoder.memory")?;
    g.output(memory);

    // ---- Decoder embeddings. Upstream: WhisperDecoder.forward (positions = embed_positions.weight[position_ids]).
    let t = || crate::graph::Dim::sym("tokens");
    let ids = g.feed(names::INPUT_IDS, shape!["tokens"], Layout::Plain)?;
    let pos = g.feed(names::POSITION_IDS, shape!["tokens"], Layout::Plain)?;
    let tok = g.op1(
        "decoder.embed_tokens",
        Box::new(Embedding),
        &[ids],
        &[("model.decoder.embed_tokens.weight", vec![vocab, d])],
        shape!["tokens", d],
        Layout::TokenMajor,
    )?;
    let pe = g.op1(
        "decoder.embed_positions",
        Box::new(Embedding),
        &[pos],
        &[(
            "model.decoder.embed_positions.weight",
            vec![cfg.max_target_positions, d],
        )],
        shape!["tokens", d],
        Layout::TokenMajor,
    )?;
    let mut h = g.op1(
        "decoder.embed_add",
        Box::new(Add::new()),
        &[tok, pe],
        &[],
        shape!["tokens", d],
        Layout::TokenMajor,
    )?;

    // ---- Decoder layers. Upstream: WhisperDecoderLayer.forward, WhisperAttention.forward.
    let dh = cfg.decoder_attention_heads;
    let dhd = cfg.decoder_head_dim();
    let dscale = (dhd as f32).powf(-0.5);
    let mut self_cache = Vec::new();
    let mut cross = Vec::new();
    for i in 0..cfg.decoder_layers {
        let p = format!("decoder.layer.{i}");
        let k = format!("model.decoder.layers.{i}");
        // Self-attention with the cache as feed in / output out.
        let kp = g.feed(
            &names::self_k_past(i),
            shape![dh, "past", dhd],
            Layout::HeadMajor,
        )?;
        let vp = g.feed(
            &names::self_v_past(i),
            shape![dh, "past", dhd],
            Layout::HeadMajor,
        )?;
        let x = ln(
            &mut g,
            &format!("{p}.self_attn_norm"),
            h,
            &format!("{k}.self_attn_layer_norm"),
            t(),
        )?;
        let q = linear(
            &mut g,
            &format!("{p}.self_q_proj"),
            x,
            &format!("{k}.self_attn.q_proj"),
            d,
            d,
            true,
            stable,
            t(),
        )?;
        let kn = linear(
            &mut g,
            &format!("{p}.self_k_proj"),
            x,
            &format!("{k}.self_attn.k_proj"),
            d,
            d,
            false,
            stable,
            t(),
        )?;
        let vn = linear(
            &mut g,
            &format!("{p}.self_v_proj"),
            x,
            &format!("{k}.self_attn.v_proj"),
            d,
            d,
            true,
            stable,
            t(),
        )?;
        let mut hm = Vec::new();
        for (n, e) in [("q", q), ("k", kn), ("v", vn)] {
            hm.push(g.op1(
                &format!("{p}.self_{n}_to_head_major"),
                Box::new(SplitHeads { heads: dh }),
                &[e],
                &[],
                shape![dh, "tokens", dhd],
                Layout::HeadMajor,
            )?);
        }
        let k_all = g.op(
            &format!("{p}.self_k_append"),
            Box::new(KvAppend),
            &[kp, hm[1]],
            &[],
            vec![out(
                &names::self_k(i),
                shape![dh, "past+tokens", dhd],
                Layout::HeadMajor,
            )],
        )?[0];
        let v_all = g.op(
            &format!("{p}.self_v_append"),
            Box::new(KvAppend),
            &[vp, hm[2]],
            &[],
            vec![out(
                &names::self_v(i),
                shape![dh, "past+tokens", dhd],
                Layout::HeadMajor,
            )],
        )?[0];
        g.output(k_all);
        g.output(v_all);
        let sa_out = g.op(
            &format!("{p}.self_attn"),
            Box::new(Attention {
                scale: dscale,
                causal: true,
                strategy: stable,
                probs: true,
            }),
            &[hm[0], k_all, v_all],
            &[],
            vec![
                crate::graph::Out::new(shape![dh, "tokens", dhd], Layout::HeadMajor),
                crate::graph::Out::new(shape![dh, "tokens", "past+tokens"], Layout::HeadMajor),
            ],
        )?;
        let sa = sa_out[0];
        g.checkpoint(sa_out[1], &format!("audio.{p}.self_attention.probs"))?;
        let sm = g.op1(
            &format!("{p}.self_merge_heads"),
            Box::new(MergeHeads),
            &[sa],
            &[],
            shape!["tokens", d],
            Layout::TokenMajor,
        )?;
        let so = linear(
            &mut g,
            &format!("{p}.self_out_proj"),
            sm,
            &format!("{k}.self_attn.out_proj"),
            d,
            d,
            true,
            stable,
            t(),
        )?;
        g.checkpoint(so, &format!("audio.{p}.self_attention.output"))?;
        let r1 = g.op1(
            &format!("{p}.residual_self"),
            Box::new(Add::new()),
            &[h, so],
            &[],
            shape!["tokens", d],
            Layout::TokenMajor,
        )?;

        // Cross-attention: q from the decoder stream; K/V projected from the encoder memory into
        // the head-major projection cache (produced at prefill, fed at decode steps).
        let x = ln(
            &mut g,
            &format!("{p}.cross_attn_norm"),
            r1,
            &format!("{k}.encoder_attn_layer_norm"),
            t(),
        )?;
        let cq = linear(
            &mut g,
            &format!("{p}.cross_q_proj"),
            x,
            &format!("{k}.encoder_attn.q_proj"),
            d,
            d,
            true,
            stable,
            t(),
        )?;
        let cqh = g.op1(
            &format!("{p}.cross_q_to_head_major"),
            Box::new(SplitHeads { heads: dh }),
            &[cq],
            &[],
            shape![dh, "tokens", dhd],
            Layout::HeadMajor,
        )?;
        let ck = linear(
            &mut g,
            &format!("{p}.cross_k_proj"),
            memory,
            &format!("{k}.encoder_attn.k_proj"),
            d,
            d,
            false,
            gemm,
            s.into(),
        )?;
        let cv = linear(
            &mut g,
            &format!("{p}.cross_v_proj"),
            memory,
            &format!("{k}.encoder_attn.v_proj"),
            d,
            d,
            true,
            gemm,
            s.into(),
        )?;
        let ckh = g.op(
            &format!("{p}.cross_k_to_head_major"),
            Box::new(SplitHeads { heads: dh }),
            &[ck],
            &[],
            vec![out(
                &names::cross_k(i),
                shape![dh, s, dhd],
                Layout::HeadMajor,
            )],
        )?[0];
        let cvh = g.op(
            &format!("{p}.cross_v_to_head_major"),
            Box::new(SplitHeads { heads: dh }),
            &[cv],
            &[],
            vec![out(
                &names::cross_v(i),
                shape![dh, s, dhd],
                Layout::HeadMajor,
            )],
        )?[0];
        g.checkpoint(ckh, &format!("audio.{p}.cross_k"))?;
        g.checkpoint(cvh, &format!("audio.{p}.cross_v"))?;
        g.output(ckh);
        g.output(cvh);
        let ca = g.op1(
            &format!("{p}.cross_attn"),
            Box::new(Attention {
                scale: dscale,
                causal: false,
                strategy: stable,
                probs: false,
            }),
            &[cqh, ckh, cvh],
            &[],
            shape![dh, "tokens", dhd],
            Layout::HeadMajor,
        )?;
        g.checkpoint(ca, &format!("audio.{p}.cross_attention.output"))?;
        let cm = g.op1(
            &format!("{p}.cross_merge_heads"),
            Box::new(MergeHeads),
            &[ca],
            &[],
            shape!["tokens", d],
            Layout::TokenMajor,
        )?;
        let co = linear(
            &mut g,
            &format!("{p}.cross_out_proj"),
            cm,
            &format!("{k}.encoder_attn.out_proj"),
            d,
            d,
            true,
            stable,
            t(),
        )?;
        g.checkpoint(co, &format!("audio.{p}.cross_attention.out_proj"))?;
        let r2 = g.op1(
            &format!("{p}.residual_cross"),
            Box::new(Add::new()),
            &[r1, co],
            &[],
            shape!["tokens", d],
            Layout::TokenMajor,
        )?;

        // MLP.
        let x = ln(
            &mut g,
            &format!("{p}.mlp_norm"),
            r2,
            &format!("{k}.final_layer_norm"),
            t(),
        )?;
        let f1 = linear(
            &mut g,
            &format!("{p}.fc1"),
            x,
            &format!("{k}.fc1"),
            d,
            cfg.decoder_ffn_dim,
            true,
            stable,
            t(),
        )?;
        let ge = g.op1(
            &format!("{p}.gelu"),
            Box::new(Gelu),
            &[f1],
            &[],
            shape!["tokens", cfg.decoder_ffn_dim],
            Layout::TokenMajor,
        )?;
        let f2 = linear(
            &mut g,
            &format!("{p}.fc2"),
            ge,
            &format!("{k}.fc2"),
            cfg.decoder_ffn_dim,
            d,
            true,
            stable,
            t(),
        )?;
        h = g.op1(
            &format!("{p}.residual_mlp"),
            Box::new(Add::new()),
            &[r2, f2],
            &[],
            shape!["tokens", d],
            Layout::TokenMajor,
        )?;
        g.checkpoint(h, &format!("audio.{p}.out"))?;
        self_cache.push([kp, vp, k_all, v_all]);
        cross.push([ckh, cvh]);
    }
    let x = ln(
        &mut g,
        "decoder.final_norm",
        h,
        "model.decoder.layer_norm",
        t(),
    )?;
    // proj_out is tied to the token embedding unless config.json says otherwise.
    // Upstream: WhisperForConditionalGeneration (`_tied_weights_keys`, `proj_out`, bias=False).
    let proj_key = if cfg.tie_word_embeddings {
        "model.decoder.embed_tokens.weight"
    } else {
        "proj_out.weight"
    };
    let logits = g.op(
        "decoder.proj_out",
        Box::new(Linear::new(false, stable)),
        &[x],
        &[(proj_key, vec![vocab, d])],
        vec![out(
            names::LOGITS,
            shape!["tokens", vocab],
            Layout::TokenMajor,
        )],
    )?[0];
    g.checkpoint(logits, "audio.decoder.logits")?;
    g.output(logits);
    if cfg.tie_word_embeddings {
        // HF ties proj_out.weight to embed_tokens after loading: a proj_out.weight in the file is
        // ignored by HF, so it is the one key allowed to go unused.
        g.allow_unused("proj_out.weight");
    }
    let graph = g.build()?;
    let edges = WhisperEdges {
        pcm,
        mel,
        memory,
        input_ids: ids,
        position_ids: pos,
        logits,
        self_cache,
        cross,
    };
    Ok((graph, edges))
}
