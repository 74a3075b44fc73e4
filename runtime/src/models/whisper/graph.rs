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
use crate::graph::{Dim, EdgeId, Graph, GraphBuilder, Layout, Out};
use crate::kernels::{
    AddTable, Attention, ChannelToToken, Conv1d, Embedding, Gelu, KvAppend, LayerNorm, Linear,
    MatmulStrategy, SplitHeads,
};
use crate::models::common::{
    add, conv1d, layer_norm, linear, merge_heads, named, op, split_heads, unary, Dense, Vb,
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

/// One attention stack's geometry: model width, heads, MLP width, matmul strategy and rows.
struct Geo {
    d: usize,
    heads: usize,
    head_dim: usize,
    ffn: usize,
    strategy: MatmulStrategy,
    rows: Dim,
}

impl Geo {
    /// A `d -> d` projection (q/k/v/out) with this stack's strategy.
    fn proj(&self, bias: bool) -> Dense {
        Dense::gemm(self.d, self.d, bias).with(self.strategy)
    }
}

/// `nn.LayerNorm(d, 1e-5)` under `vb`.
fn ln(g: &mut GraphBuilder, name: &str, vb: &Vb, x: EdgeId, geo: &Geo) -> Result<EdgeId> {
    layer_norm(g, name, vb, x, geo.d, LAYER_NORM_EPS, &geo.rows)
}

/// `WhisperAttention`'s q/k/v projections (k without bias) under `vb`, token-major.
/// Op names: `{p}.{side}q_proj` ..
fn qkv_proj(
    g: &mut GraphBuilder,
    p: &str,
    side: &str,
    vb: &Vb,
    x: EdgeId,
    geo: &Geo,
) -> Result<Vec<EdgeId>> {
    let mut proj = Vec::with_capacity(3);
    for (n, bias) in [("q", true), ("k", false), ("v", true)] {
        let name = format!("{p}.{side}{n}_proj");
        proj.push(linear(
            g,
            &name,
            &vb.pp(format!("{n}_proj")),
            x,
            geo.proj(bias),
            &geo.rows,
        )?);
    }
    Ok(proj)
}

/// Layer `vb`'s self-attention pre-norm (`{p}.self_attn_norm`) of `h` and [`qkv_proj`] of it.
fn self_attn_qkv(
    g: &mut GraphBuilder,
    p: &str,
    side: &str,
    vb: &Vb,
    h: EdgeId,
    geo: &Geo,
) -> Result<Vec<EdgeId>> {
    let norm = format!("{p}.self_attn_norm");
    let x = ln(g, &norm, &vb.pp("self_attn_layer_norm"), h, geo)?;
    qkv_proj(g, p, side, &vb.pp("self_attn"), x, geo)
}

/// The projections `proj` of [`qkv_proj`], each split to head-major.
/// Op names: `{p}.{side}q_to_head_major` ..
fn qkv_heads(
    g: &mut GraphBuilder,
    p: &str,
    side: &str,
    proj: Vec<EdgeId>,
    geo: &Geo,
) -> Result<Vec<EdgeId>> {
    let mut heads = Vec::with_capacity(3);
    for (n, e) in ["q", "k", "v"].into_iter().zip(proj) {
        let name = format!("{p}.{side}{n}_to_head_major");
        heads.push(split_heads(
            g,
            &name,
            e,
            geo.heads,
            &geo.rows,
            geo.head_dim,
        )?);
    }
    Ok(heads)
}

/// `WhisperAttention`'s head merge and `out_proj` under `vb`.
fn attn_out(
    g: &mut GraphBuilder,
    p: &str,
    side: &str,
    vb: &Vb,
    att: EdgeId,
    geo: &Geo,
) -> Result<EdgeId> {
    let merged = merge_heads(g, &format!("{p}.{side}merge_heads"), att, &geo.rows, geo.d)?;
    out_proj(g, p, side, vb, merged, geo)
}

/// `WhisperAttention`'s `out_proj` under `vb` over the token-major context.
fn out_proj(
    g: &mut GraphBuilder,
    p: &str,
    side: &str,
    vb: &Vb,
    merged: EdgeId,
    geo: &Geo,
) -> Result<EdgeId> {
    let name = format!("{p}.{side}out_proj");
    linear(
        g,
        &name,
        &vb.pp("out_proj"),
        merged,
        geo.proj(true),
        &geo.rows,
    )
}

/// The MLP half of a Whisper layer: `h + fc2(gelu(fc1(final_layer_norm(h))))`, layer path `vb`.
fn mlp(g: &mut GraphBuilder, p: &str, vb: &Vb, h: EdgeId, geo: &Geo) -> Result<EdgeId> {
    let (d, ffn, rows) = (geo.d, geo.ffn, &geo.rows);
    let x = ln(
        g,
        &format!("{p}.mlp_norm"),
        &vb.pp("final_layer_norm"),
        h,
        geo,
    )?;
    let fc1 = Dense::gemm(d, ffn, true).with(geo.strategy);
    let f1 = linear(g, &format!("{p}.fc1"), &vb.pp("fc1"), x, fc1, rows)?;
    let shape = vec![rows.clone(), ffn.into()];
    let ge = unary(g, &format!("{p}.gelu"), Gelu, f1, shape, Layout::TokenMajor)?;
    let fc2 = Dense::gemm(ffn, d, true).with(geo.strategy);
    let f2 = linear(g, &format!("{p}.fc2"), &vb.pp("fc2"), ge, fc2, rows)?;
    add(g, &format!("{p}.residual_mlp"), (h, f2), 1.0, rows, d)
}

/// `WhisperEncoderLayer` `i` (pre-LN, bidirectional self-attention, GEMM).
fn encoder_layer(g: &mut GraphBuilder, i: usize, h: EdgeId, geo: &Geo) -> Result<EdgeId> {
    let p = format!("encoder.layer.{i}");
    let vb = Vb::root("model.encoder.layers").pp(i);
    let sa = vb.pp("self_attn");
    // Token-major q/k/v and context: the fused attention reads the projections as they are
    // (the split and merge of 1500 x 384 operands were copies on every layer).
    let qkv = self_attn_qkv(g, &p, "", &vb, h, geo)?;
    let attention = Attention {
        heads: Some(geo.heads),
        ..Attention::new((geo.head_dim as f32).powf(-0.5), false, geo.strategy)
    };
    let shape = vec![geo.rows.clone(), geo.d.into()];
    let att = g.op1(
        &format!("{p}.self_attn"),
        Box::new(attention),
        &qkv,
        &[],
        shape,
        Layout::TokenMajor,
    )?;
    let o = out_proj(g, &p, "", &sa, att, geo)?;
    let r = add(
        g,
        &format!("{p}.residual_attn"),
        (h, o),
        1.0,
        &geo.rows,
        geo.d,
    )?;
    let h = mlp(g, &p, &vb, r, geo)?;
    g.checkpoint(h, &format!("audio.encoder.layer.{i}.out"))?;
    Ok(h)
}

/// The edges one decoder layer adds to the graph's interface.
struct DecoderLayerEdges {
    out: EdgeId,
    self_cache: [EdgeId; 4],
    cross: [EdgeId; 2],
}

/// `WhisperDecoderLayer` `i`: causal self-attention over the cache feed, cross-attention over the
/// encoder memory (its K/V projected into the head-major cross cache), MLP.
fn decoder_layer(
    g: &mut GraphBuilder,
    i: usize,
    h: EdgeId,
    memory: EdgeId,
    enc_tokens: usize,
    geo: &Geo,
) -> Result<DecoderLayerEdges> {
    let p = format!("decoder.layer.{i}");
    let vb = Vb::root("model.decoder.layers").pp(i);
    let (dh, dhd, d) = (geo.heads, geo.head_dim, geo.d);
    let scale = (dhd as f32).powf(-0.5);
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
    let sa = vb.pp("self_attn");
    let proj = self_attn_qkv(g, &p, "self_", &vb, h, geo)?;
    let hm = qkv_heads(g, &p, "self_", proj, geo)?;
    let mut cache = Vec::with_capacity(2);
    for (n, past, new, out_name, append) in [
        ("k", kp, hm[1], names::self_k(i), KvAppend::keys()),
        ("v", vp, hm[2], names::self_v(i), KvAppend::values()),
    ] {
        let shape = shape![dh, "past+tokens", dhd];
        let op = format!("{p}.self_{n}_append");
        cache.push(
            g.op(
                &op,
                Box::new(append),
                &[past, new],
                &[],
                vec![named(&out_name, shape, Layout::HeadMajor)],
            )?[0],
        );
        // The cache after the call is the attention module's `:keys` / `:values` point.
        g.hf_module(&op, sa.path())?;
    }
    let (k_all, v_all) = (cache[0], cache[1]);
    g.output(k_all);
    g.output(v_all);
    let sa_out = g.op(
        &format!("{p}.self_attn"),
        Box::new(Attention {
            probs: true,
            ..Attention::new(scale, true, geo.strategy)
        }),
        &[hm[0], k_all, v_all],
        &[],
        vec![
            Out::new(shape![dh, "tokens", dhd], Layout::HeadMajor),
            Out::new(shape![dh, "tokens", "past+tokens"], Layout::HeadMajor),
        ],
    )?;
    g.checkpoint(sa_out[1], &format!("audio.{p}.self_attention.probs"))?;
    let so = attn_out(g, &p, "self_", &sa, sa_out[0], geo)?;
    g.checkpoint(so, &format!("audio.{p}.self_attention.output"))?;
    let r1 = add(g, &format!("{p}.residual_self"), (h, so), 1.0, &geo.rows, d)?;

    // Cross-attention: q from the decoder stream; K/V projected from the encoder memory into
    // the head-major projection cache (produced at prefill, fed at decode steps).
    let ca_vb = vb.pp("encoder_attn");
    let x = ln(
        g,
        &format!("{p}.cross_attn_norm"),
        &vb.pp("encoder_attn_layer_norm"),
        r1,
        geo,
    )?;
    let cq = linear(
        g,
        &format!("{p}.cross_q_proj"),
        &ca_vb.pp("q_proj"),
        x,
        geo.proj(true),
        &geo.rows,
    )?;
    let cqh = split_heads(
        g,
        &format!("{p}.cross_q_to_head_major"),
        cq,
        dh,
        &geo.rows,
        dhd,
    )?;
    let enc_rows = Dim::from(enc_tokens);
    let mut kv = Vec::with_capacity(2);
    for (n, bias) in [("k", false), ("v", true)] {
        let name = format!("{p}.cross_{n}_proj");
        kv.push(linear(
            g,
            &name,
            &ca_vb.pp(format!("{n}_proj")),
            memory,
            Dense::gemm(d, d, bias),
            &enc_rows,
        )?);
    }
    let mut cross = Vec::with_capacity(2);
    for (n, e, out_name) in [
        ("k", kv[0], names::cross_k(i)),
        ("v", kv[1], names::cross_v(i)),
    ] {
        cross.push(
            g.op(
                &format!("{p}.cross_{n}_to_head_major"),
                Box::new(SplitHeads { heads: dh }),
                &[e],
                &[],
                vec![named(
                    &out_name,
                    shape![dh, enc_tokens, dhd],
                    Layout::HeadMajor,
                )],
            )?[0],
        );
    }
    let (ckh, cvh) = (cross[0], cross[1]);
    g.checkpoint(ckh, &format!("audio.{p}.cross_k"))?;
    g.checkpoint(cvh, &format!("audio.{p}.cross_v"))?;
    g.output(ckh);
    g.output(cvh);
    let ca = g.op1(
        &format!("{p}.cross_attn"),
        Box::new(Attention::new(scale, false, geo.strategy)),
        &[cqh, ckh, cvh],
        &[],
        shape![dh, "tokens", dhd],
        Layout::HeadMajor,
    )?;
    g.checkpoint(ca, &format!("audio.{p}.cross_attention.output"))?;
    let co = attn_out(g, &p, "cross_", &ca_vb, ca, geo)?;
    g.checkpoint(co, &format!("audio.{p}.cross_attention.out_proj"))?;
    let r2 = add(
        g,
        &format!("{p}.residual_cross"),
        (r1, co),
        1.0,
        &geo.rows,
        d,
    )?;

    let out = mlp(g, &p, &vb, r2, geo)?;
    g.checkpoint(out, &format!("audio.{p}.out"))?;
    Ok(DecoderLayerEdges {
        out,
        self_cache: [kp, vp, k_all, v_all],
        cross: [ckh, cvh],
    })
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

    // ---- Frontend: pcm -> log-mel (transformers WhisperFeatureExtractor).
    let pcm = g.feed(names::PCM, shape!["samples"], Layout::Plain)?;
    let mel = g.op(
        "frontend.log_mel",
        Box::new(pre.log_mel(pre_path)?),
        &[pcm],
        &[],
        vec![named(
            names::MEL,
            shape![n_mels, frames],
            Layout::ChannelMajor,
        )],
    )?[0];
    g.checkpoint(mel, "audio.frontend.mel")?;

    // ---- Encoder stem. Upstream: WhisperEncoder.forward.
    let enc = Vb::root("model.encoder");
    // conv1 (stride 1) and conv2 (stride 2), each followed by its GELU.
    let cm = Layout::ChannelMajor;
    let mut x = mel;
    for (c, stride, c_in, frames_out) in [("conv1", 1, n_mels, frames), ("conv2", 2, d, s)] {
        let conv = Conv1d {
            kernel: 3,
            stride,
            padding: 1,
        };
        let name = format!("encoder.{c}");
        let y = conv1d(
            &mut g,
            &name,
            &enc.pp(c),
            x,
            conv,
            (c_in, d),
            frames_out.into(),
        )?;
        g.checkpoint(y, &format!("audio.{name}.out"))?;
        let gelu = format!("{name}_gelu");
        x = unary(&mut g, &gelu, Gelu, y, shape![d, frames_out], cm)?;
    }
    let tm = unary(
        &mut g,
        "encoder.to_token_major",
        ChannelToToken,
        x,
        shape![s, d],
        Layout::TokenMajor,
    )?;
    let pos = [(enc.pp("embed_positions").key("weight"), vec![s, d])];
    let mut h = op(
        &mut g,
        "encoder.embed_positions",
        AddTable,
        &[tm],
        &pos,
        &s.into(),
        d,
    )?;

    // ---- Encoder layers (pre-LN). Upstream: WhisperEncoderLayer.forward.
    let geo = Geo {
        d,
        heads: cfg.encoder_attention_heads,
        head_dim: cfg.encoder_head_dim(),
        ffn: cfg.encoder_ffn_dim,
        strategy: MatmulStrategy::Gemm,
        rows: s.into(),
    };
    for i in 0..cfg.encoder_layers {
        h = encoder_layer(&mut g, i, h, &geo)?;
    }
    let norm = enc.pp("layer_norm");
    let memory = g.op(
        "encoder.final_norm",
        Box::new(LayerNorm::new(LAYER_NORM_EPS)),
        &[h],
        &[(&norm.key("weight"), vec![d]), (&norm.key("bias"), vec![d])],
        vec![named(names::MEMORY, shape![s, d], Layout::TokenMajor)],
    )?[0];
    g.checkpoint(memory, "audio.encoder.memory")?;
    g.output(memory);

    // ---- Decoder embeddings. Upstream: WhisperDecoder.forward (positions = embed_positions.weight[position_ids]).
    let dec = Vb::root("model.decoder");
    let t = Dim::sym("tokens");
    let ids = g.feed(names::INPUT_IDS, shape!["tokens"], Layout::Plain)?;
    let pos = g.feed(names::POSITION_IDS, shape!["tokens"], Layout::Plain)?;
    // Feeds are checkpoints too: what each step was fed (HF: embed_tokens' input, embed_positions'
    // `position_ids`).
    g.checkpoint(ids, "audio.decoder.input_ids")?;
    g.checkpoint(pos, "audio.decoder.position_ids")?;
    let embed_key = dec.pp("embed_tokens").key("weight");
    let tok_w = [(embed_key.clone(), vec![vocab, d])];
    let tok = op(
        &mut g,
        "decoder.embed_tokens",
        Embedding,
        &[ids],
        &tok_w,
        &t,
        d,
    )?;
    let pos_w = [(
        dec.pp("embed_positions").key("weight"),
        vec![cfg.max_target_positions, d],
    )];
    let pe = op(
        &mut g,
        "decoder.embed_positions",
        Embedding,
        &[pos],
        &pos_w,
        &t,
        d,
    )?;
    let mut h = add(&mut g, "decoder.embed_add", (tok, pe), 1.0, &t, d)?;

    // ---- Decoder layers. Upstream: WhisperDecoderLayer.forward, WhisperAttention.forward.
    let geo = Geo {
        d,
        heads: cfg.decoder_attention_heads,
        head_dim: cfg.decoder_head_dim(),
        ffn: cfg.decoder_ffn_dim,
        strategy: MatmulStrategy::RowStable,
        rows: t.clone(),
    };
    let mut self_cache = Vec::new();
    let mut cross = Vec::new();
    for i in 0..cfg.decoder_layers {
        let layer = decoder_layer(&mut g, i, h, memory, s, &geo)?;
        h = layer.out;
        self_cache.push(layer.self_cache);
        cross.push(layer.cross);
    }
    let x = ln(&mut g, "decoder.final_norm", &dec.pp("layer_norm"), h, &geo)?;
    // proj_out is tied to the token embedding unless config.json says otherwise.
    // Upstream: WhisperForConditionalGeneration (`_tied_weights_keys`, `proj_out`, bias=False).
    let proj_key = if cfg.tie_word_embeddings {
        embed_key
    } else {
        Vb::root("proj_out").key("weight")
    };
    let logits = g.op(
        "decoder.proj_out",
        Box::new(Linear::new(false, MatmulStrategy::RowStable)),
        &[x],
        &[(&proj_key, vec![vocab, d])],
        vec![named(
            names::LOGITS,
            shape!["tokens", vocab],
            Layout::TokenMajor,
        )],
    )?[0];
    // The logits are `proj_out`'s output whichever key holds its weight.
    g.hf_module("decoder.proj_out", "proj_out")?;
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
