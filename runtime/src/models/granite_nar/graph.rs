//! The Granite NAR graph, built once from config.json + preprocessor_config.json: frontend,
//! Conformer encoder with the self-conditioning bypass, capture concat and BPE-CTC head, the
//! windowed Q-Former projector, and the bidirectional Granite LM over `[audio | template]`. It
//! holds no weights. Op names are the contract's producers; weights are referenced by their hub
//! state-dict names.
//!
//! Two formulas run on it (see [`super::model`]): `encode` (feed `pcm`, want `enc.cat_out` and
//! `enc.ctc_bpe_logits`) and `edit` (feed `enc.cat_out` and the template ids, want
//! `dec.text_logits`); the host CTC-decodes the BPE head in between.
//!
//! Upstream: oracle/xray_oracle/granite_nar.py (`GraniteNarEncoder.forward`,
//! `GraniteNarProjector.forward`, `GraniteNARForConditionalGeneration.forward` / `decode_text`);
//! transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
//! (`GraniteSpeechConformerBlock` and its modules) and src/transformers/models/granite/
//! modeling_granite.py (`GraniteModel`, `GraniteDecoderLayer`, `GraniteAttention`, `GraniteMLP`).

use super::frontend::{PreprocessorConfig, StackFrames};
use super::kernels::{
    AddWindowPositions, AudioPrefix, ChannelSlice, Column, ConcatChannels, ConcatRows,
    DepthwiseConv, Glu, Identity, Pointwise, PosteriorPool, QueryInit, ShawBlockAttention,
    TailRows, WindowCrossAttention, WindowPad, MAX_CONCAT, SYM_BPE_FRAMES, SYM_ENC_FRAMES,
    SYM_MEL_FRAMES, SYM_N_AUDIO, SYM_N_TEXT, SYM_N_TOTAL, SYM_PROJ_ROWS, SYM_PROJ_TOKENS,
};
use super::{Derived, GraniteNarConfig, ENCODER_NORM_EPS};
use crate::error::{Result, RuntimeError};
use crate::graph::{Dim, EdgeId, Graph, GraphBuilder, Layout, Out};
use crate::kernels::activation::Softmax;
use crate::kernels::activation::{Scale, Silu, SwiGlu};
use crate::kernels::gqa::GqaAttention;
use crate::kernels::layer_norm::{BatchNorm, RmsNorm};
use crate::kernels::{Embedding, Gelu, Linear, MatmulStrategy};
use crate::models::common::{
    add, layer_norm, linear, merge_heads, named, op, split_heads, unary, Dense, Vb,
};
use crate::shape;

/// Names of the feeds and formula boundaries of the Granite NAR graph.
pub mod names {
    /// pcm samples feed `[samples]`.
    pub const PCM: &str = "pcm";
    /// Template token ids feed `[n_text]` (insertion slots around the hypothesis).
    pub const TEMPLATE_IDS: &str = "dec.template_ids";
    /// The capture concat `[enc_frames, cat_dim]` (encode output, edit feed).
    pub const CAT_OUT: &str = "enc.cat_out";
    /// BPE-CTC logits `[bpe_frames, bpe_vocab]`.
    pub const BPE_LOGITS: &str = "enc.ctc_bpe_logits";
    /// Raw lm_head logits of the text rows `[n_text, vocab]`.
    pub const TEXT_LOGITS: &str = "dec.text_logits";
    /// Op name of the self-conditioning bypass add (the fault catalogue's `ctc_bypass_skipped`
    /// target, `ParamFault::SkipBranch`).
    pub const BYPASS_OP: &str = "enc.self_cond.bypass_add";
    /// Op name of decoder layer `l`'s RoPE + attention core (the catalogue's target for
    /// `ParamFault::{Causal, AttnScale, RopeOffset}`).
    pub fn dec_attention(l: usize) -> String {
        format!("dec.layer.{l}.attn")
    }
}

/// Edge ids of the feeds and formula outputs, resolved once.
#[derive(Debug, Clone)]
pub struct GraniteEdges {
    /// pcm feed.
    pub pcm: EdgeId,
    /// template ids feed.
    pub template_ids: EdgeId,
    /// capture concat.
    pub cat_out: EdgeId,
    /// BPE-CTC logits.
    pub bpe_logits: EdgeId,
    /// text logits.
    pub text_logits: EdgeId,
}

/// One HF module as the graph declares it: its op name and its weight-key path. The graph's op
/// names follow HF's module tree, so [`Module::pp`] pushes a sub-module onto both.
#[derive(Debug, Clone)]
struct Module {
    op: String,
    vb: Vb,
}

impl Module {
    /// The module declared as op `op` with weights under `vb`.
    fn new(op: impl Into<String>, vb: Vb) -> Module {
        Module { op: op.into(), vb }
    }

    /// Layer `l` of a stack: op `{op}.{l}`, weights under `{vb}.{l}`.
    fn layer(op: &str, vb: &str, l: usize) -> Module {
        Module::new(format!("{op}.{l}"), Vb::root(vb).pp(l))
    }

    /// The sub-module `leaf`: op `{op}.{leaf}`, weights under `{vb}.{leaf}`.
    fn pp(&self, leaf: &str) -> Module {
        Module::new(self.op(leaf), self.vb.pp(leaf))
    }

    /// The weights of HF's sub-module `component`, under this module's op names (the graph does
    /// not name HF's `self_attn`, `mlp`, ... containers).
    fn weights_in(&self, component: &str) -> Module {
        Module::new(self.op.clone(), self.vb.pp(component))
    }

    /// The op name `{op}.{leaf}` (a weightless step of this module).
    fn op(&self, leaf: &str) -> String {
        format!("{}.{leaf}", self.op)
    }
}

/// The builder with its config facts and the per-module helpers.
struct B<'a> {
    g: GraphBuilder,
    cfg: &'a GraniteNarConfig,
}

impl B<'_> {
    /// `nn.Linear(n_in, n_out, bias)` as the module `m` (GEMM).
    fn linear(
        &mut self,
        m: &Module,
        x: EdgeId,
        (n_in, n_out, bias): (usize, usize, bool),
        rows: &Dim,
    ) -> Result<EdgeId> {
        let dense = Dense::gemm(n_in, n_out, bias);
        linear(&mut self.g, &m.op, &m.vb, x, dense, rows)
    }

    /// `nn.LayerNorm(d, eps)` as the module `m`.
    fn layer_norm(
        &mut self,
        m: &Module,
        x: EdgeId,
        (d, eps): (usize, f32),
        rows: &Dim,
    ) -> Result<EdgeId> {
        layer_norm(&mut self.g, &m.op, &m.vb, x, d, eps, rows)
    }

    /// `GraniteRMSNorm(d, rms_norm_eps)` as the module `m`.
    fn rms_norm(&mut self, m: &Module, x: EdgeId, d: usize, rows: &Dim) -> Result<EdgeId> {
        let eps = self.cfg.text_config.rms_norm_eps as f32;
        let w = [(m.vb.key("weight"), vec![d])];
        op(&mut self.g, &m.op, RmsNorm::new(eps), &[x], &w, rows, d)
    }

    /// Residual `a + scale * b`.
    fn add(
        &mut self,
        name: &str,
        a: EdgeId,
        b: EdgeId,
        scale: f32,
        rows: &Dim,
        d: usize,
    ) -> Result<EdgeId> {
        add(&mut self.g, name, (a, b), scale, rows, d)
    }

    /// Conformer feed-forward `down(silu(up(LN(x))))` and the macaron half-step residual.
    ///
    /// Upstream: transformers v5.24.0 modeling_granite_speech.py `GraniteSpeechConformerFeedForward`.
    fn conformer_ff(&mut self, m: &Module, h: EdgeId) -> Result<EdgeId> {
        let enc = &self.cfg.encoder_config;
        let (d, inner) = (enc.hidden_dim, enc.hidden_dim * enc.feedforward_mult);
        let t = Dim::sym(SYM_ENC_FRAMES);
        let x = self.layer_norm(&m.pp("pre_norm"), h, (d, ENCODER_NORM_EPS), &t)?;
        let x = self.linear(&m.pp("up_proj"), x, (d, inner, true), &t)?;
        let x = op(&mut self.g, &m.op("silu"), Silu, &[x], &[], &t, inner)?;
        let x = self.linear(&m.pp("down_proj"), x, (inner, d, true), &t)?;
        self.add(&m.op("residual"), h, x, 0.5, &t, d)
    }

    /// Conformer block-local Shaw attention and its residual.
    ///
    /// Upstream: transformers v5.24.0 modeling_granite_speech.py `GraniteSpeechConformerAttention.forward`.
    fn conformer_attention(&mut self, m: &Module, h: EdgeId) -> Result<EdgeId> {
        let enc = &self.cfg.encoder_config;
        let d = enc.hidden_dim;
        let inner = enc.num_heads * enc.dim_head;
        let t = Dim::sym(SYM_ENC_FRAMES);
        let shaw = ShawBlockAttention {
            heads: enc.num_heads,
            dim_head: enc.dim_head,
            context: enc.context_size,
            max_pos_emb: enc.max_pos_emb,
            scale: (enc.dim_head as f32).powf(-0.5),
            causal: false,
        };
        let rel = [(
            m.vb.pp("rel_pos_emb").key("weight"),
            vec![2 * enc.max_pos_emb + 1, enc.dim_head],
        )];
        let x = self.layer_norm(&m.pp("pre_norm"), h, (d, ENCODER_NORM_EPS), &t)?;
        let q = self.linear(&m.pp("to_q"), x, (d, inner, false), &t)?;
        let kv = self.linear(&m.pp("to_kv"), x, (d, 2 * inner, false), &t)?;
        let a = op(&mut self.g, &m.op("shaw"), shaw, &[q, kv], &rel, &t, inner)?;
        let a = self.linear(&m.pp("to_out"), a, (inner, d, true), &t)?;
        self.add(&m.op("residual"), h, a, 1.0, &t, d)
    }

    /// Conformer conv module `down(silu(bn(depthwise(glu(up(LN(x)))))))` and its residual.
    ///
    /// Upstream: transformers v5.24.0 modeling_granite_speech.py `GraniteSpeechConformerConvModule.forward`.
    fn conformer_conv(&mut self, m: &Module, h: EdgeId) -> Result<EdgeId> {
        let enc = &self.cfg.encoder_config;
        let d = enc.hidden_dim;
        let conv_inner = d * enc.conv_expansion_factor;
        let kernel = enc.conv_kernel_size;
        let t = Dim::sym(SYM_ENC_FRAMES);
        let x = self.layer_norm(&m.pp("norm"), h, (d, ENCODER_NORM_EPS), &t)?;
        // A pointwise (kernel 1) conv with bias, `c_in -> c_out`, as the sub-module `leaf`.
        let pointwise = |b: &mut Self, leaf: &str, x: EdgeId, (c_in, c_out): (usize, usize)| {
            let vb = m.vb.pp(leaf);
            let w = [
                (vb.key("weight"), vec![c_out, c_in, 1]),
                (vb.key("bias"), vec![c_out]),
            ];
            op(
                &mut b.g,
                &m.op(leaf),
                Pointwise { bias: true },
                &[x],
                &w,
                &t,
                c_out,
            )
        };
        let x = pointwise(self, "up_conv", x, (d, 2 * conv_inner))?;
        let x = op(&mut self.g, &m.op("glu"), Glu, &[x], &[], &t, conv_inner)?;
        let dw = [(
            m.vb.pp("depth_conv").pp("conv").key("weight"),
            vec![conv_inner, 1, kernel],
        )];
        let depthwise = DepthwiseConv { kernel };
        let x = op(
            &mut self.g,
            &m.op("depth_conv"),
            depthwise,
            &[x],
            &dw,
            &t,
            conv_inner,
        )?;
        let bn_vb = m.vb.pp("batch_norm");
        let bn: Vec<(String, Vec<usize>)> = ["weight", "bias", "running_mean", "running_var"]
            .iter()
            .map(|r| (bn_vb.key(r), vec![conv_inner]))
            .collect();
        let batch_norm = BatchNorm::new(ENCODER_NORM_EPS);
        let x = op(
            &mut self.g,
            &m.op("batch_norm"),
            batch_norm,
            &[x],
            &bn,
            &t,
            conv_inner,
        )?;
        let x = op(&mut self.g, &m.op("silu"), Silu, &[x], &[], &t, conv_inner)?;
        let x = pointwise(self, "down_conv", x, (conv_inner, d))?;
        self.add(&m.op("residual"), h, x, 1.0, &t, d)
    }

    /// One Conformer block: FF1 (half step) -> block-local Shaw attention -> conv module -> FF2
    /// (half step) -> post LayerNorm.
    ///
    /// Upstream: transformers v5.24.0 modeling_granite_speech.py `GraniteSpeechConformerBlock.forward`.
    fn conformer_block(&mut self, l: usize, h: EdgeId) -> Result<EdgeId> {
        let d = self.cfg.encoder_config.hidden_dim;
        let t = Dim::sym(SYM_ENC_FRAMES);
        let m = Module::layer("enc.block", "encoder.layers", l);
        let h = self.conformer_ff(&m.pp("ff1"), h)?;
        let h = self.conformer_attention(&m.pp("attn"), h)?;
        let h = self.conformer_conv(&m.pp("conv"), h)?;
        let h = self.conformer_ff(&m.pp("ff2"), h)?;
        let ln = (d, ENCODER_NORM_EPS);
        let out = self.layer_norm(&m.pp("post_norm"), h, ln, &t)?;
        self.g.checkpoint(out, &format!("enc.block.{l}.out"))?;
        Ok(out)
    }

    /// One Q-Former layer over the windowed keys/values `kv`: pre-LN cross-attention, pre-LN MLP.
    ///
    /// Upstream: oracle granite_nar.py `GraniteNarQFormerLayer.forward`,
    /// `GraniteNarCrossAttention.forward`.
    fn qformer_layer(
        &mut self,
        l: usize,
        q: EdgeId,
        kv: EdgeId,
        n_query: usize,
        mlp: usize,
    ) -> Result<EdgeId> {
        let prj = &self.cfg.projector_config;
        let (hp, heads, block) = (prj.hidden_size, prj.num_heads, prj.block_size);
        let (ab, mb) = (prj.attn_bias, prj.mlp_bias);
        let ln = (hp, prj.layernorm_eps as f32);
        let rows = Dim::sym(SYM_PROJ_ROWS);
        let toks = Dim::sym(SYM_PROJ_TOKENS);
        let m = Module::layer("proj.qformer.layer", "projector.qformer.layers", l);
        let ca = m.weights_in("cross_attention");
        let x = self.layer_norm(&m.pp("attn_norm"), q, ln, &toks)?;
        let qq = self.linear(&ca.pp("q_proj"), x, (hp, hp, ab), &toks)?;
        let kk = self.linear(&ca.pp("k_proj"), kv, (hp, hp, ab), &rows)?;
        let vv = self.linear(&ca.pp("v_proj"), kv, (hp, hp, ab), &rows)?;
        let att = WindowCrossAttention {
            heads,
            n_query,
            block,
            scale: ((hp / heads) as f32).powf(-0.5),
        };
        let a = op(
            &mut self.g,
            &m.op("cross_attn"),
            att,
            &[qq, kk, vv],
            &[],
            &toks,
            hp,
        )?;
        let a = self.linear(&ca.pp("o_proj"), a, (hp, hp, ab), &toks)?;
        let q = self.add(&m.op("residual_attn"), q, a, 1.0, &toks, hp)?;
        let x = self.layer_norm(&m.pp("mlp_norm"), q, ln, &toks)?;
        let mm = m.weights_in("mlp");
        let x = self.linear(&mm.pp("fc1"), x, (hp, mlp, mb), &toks)?;
        let x = op(&mut self.g, &m.op("silu"), Silu, &[x], &[], &toks, mlp)?;
        let x = self.linear(&mm.pp("fc2"), x, (mlp, hp, mb), &toks)?;
        self.add(&m.op("residual_mlp"), q, x, 1.0, &toks, hp)
    }

    /// One bidirectional Granite LM layer: RMSNorm -> GQA self-attention with RoPE -> scaled
    /// residual; RMSNorm -> SwiGLU MLP -> scaled residual.
    ///
    /// Upstream: transformers v5.24.0 modeling_granite.py `GraniteDecoderLayer.forward`,
    /// `GraniteAttention.forward`, `GraniteMLP.forward`.
    fn lm_layer(&mut self, l: usize, h: EdgeId, der: &Derived) -> Result<EdgeId> {
        let txt = &self.cfg.text_config;
        let dm = txt.hidden_size;
        let (hq, hk, hd) = (txt.num_attention_heads, der.kv_heads, der.head_dim);
        let rm = txt.residual_multiplier as f32;
        let (ab, mb, inter) = (txt.attention_bias, txt.mlp_bias, txt.intermediate_size);
        let att = GqaAttention {
            scale: txt.attention_multiplier as f32,
            causal: false,
            rope_theta: der.rope_theta as f32,
            query_pos_offset: 0,
        };
        let n_total = Dim::sym(SYM_N_TOTAL);
        let m = Module::layer("dec.layer", "language_model.model.layers", l);
        let sa = m.weights_in("self_attn");
        let x = self.rms_norm(&m.pp("input_layernorm"), h, dm, &n_total)?;
        let heads = [("q", hq), ("k", hk), ("v", hk)];
        let mut proj = Vec::with_capacity(heads.len());
        for (nm, nh) in heads {
            let dims = (dm, nh * hd, ab);
            proj.push(self.linear(&sa.pp(&format!("{nm}_proj")), x, dims, &n_total)?);
        }
        let mut hm = Vec::with_capacity(heads.len());
        for ((nm, nh), e) in heads.into_iter().zip(proj) {
            let name = m.op(&format!("{nm}_heads"));
            hm.push(split_heads(&mut self.g, &name, e, nh, &n_total, hd)?);
        }
        let att_out = self.g.op(
            &names::dec_attention(l),
            Box::new(att),
            &hm,
            &[],
            vec![
                Out::new(
                    vec![hq.into(), n_total.clone(), hd.into()],
                    Layout::HeadMajor,
                ),
                Out::new(
                    vec![hq.into(), n_total.clone(), n_total.clone()],
                    Layout::HeadMajor,
                ),
            ],
        )?;
        self.g
            .checkpoint(att_out[1], &format!("dec.layer.{l}.attn_probs"))?;
        let merge = m.op("merge_heads");
        let a = merge_heads(&mut self.g, &merge, att_out[0], &n_total, hq * hd)?;
        let a = self.linear(&sa.pp("o_proj"), a, (hq * hd, dm, ab), &n_total)?;
        let h = self.add(&m.op("residual_attn"), h, a, rm, &n_total, dm)?;
        let post = m.pp("post_attention_layernorm");
        let x = self.rms_norm(&post, h, dm, &n_total)?;
        let mlp = m.weights_in("mlp");
        let gt = self.linear(&mlp.pp("gate_proj"), x, (dm, inter, mb), &n_total)?;
        let up = self.linear(&mlp.pp("up_proj"), x, (dm, inter, mb), &n_total)?;
        let swiglu = m.op("swiglu");
        let x = op(
            &mut self.g,
            &swiglu,
            SwiGlu,
            &[gt, up],
            &[],
            &n_total,
            inter,
        )?;
        let x = self.linear(&mlp.pp("down_proj"), x, (inter, dm, mb), &n_total)?;
        let h = self.add(&m.op("residual_mlp"), h, x, rm, &n_total, dm)?;
        self.g.checkpoint(h, &format!("dec.layer.{l}.out"))?;
        Ok(h)
    }
}

/// Build the graph from a checked config.
pub fn build(
    cfg: &GraniteNarConfig,
    der: &Derived,
    pre: &PreprocessorConfig,
) -> Result<(Graph, GraniteEdges)> {
    let enc = &cfg.encoder_config;
    let prj = &cfg.projector_config;
    let txt = &cfg.text_config;
    if der.captures.is_empty() || der.captures.len() > MAX_CONCAT {
        return Err(RuntimeError::Graph(format!(
            "encoder_layer_indices has {} entries; 1..={MAX_CONCAT} supported",
            der.captures.len()
        )));
    }
    let mut b = B {
        g: GraphBuilder::new(super::NAME),
        cfg,
    };
    let t = Dim::sym(SYM_ENC_FRAMES);
    let d = enc.hidden_dim;
    let n_mels = pre.mel_bins();

    // ---- Frontend.
    let pcm = b.g.feed(names::PCM, shape!["samples"], Layout::Plain)?;
    let mel_rows = Dim::sym(SYM_MEL_FRAMES);
    let mel = op(
        &mut b.g,
        "frontend.log_mel",
        pre.log_mel()?,
        &[pcm],
        &[],
        &mel_rows,
        n_mels,
    )?;
    let mel_in = op(
        &mut b.g,
        "frontend.stack_frames",
        StackFrames,
        &[mel],
        &[],
        &t,
        2 * n_mels,
    )?;
    b.g.checkpoint(mel_in, "enc.mel_in")?;

    // ---- Encoder. Upstream: oracle granite_nar.py `GraniteNarEncoder.forward`.
    let ev = Vb::root("encoder");
    let input = (enc.input_dim, d, true);
    let mut h = b.linear(
        &Module::new("enc", ev.clone()).pp("input_linear"),
        mel_in,
        input,
        &t,
    )?;
    b.g.checkpoint(h, "enc.input_linear.out")?;
    // HF hidden states: [input_linear out, block 1 out, ..., block n out]; the self-conditioning
    // block's entry is the value after the bypass add.
    let mut hidden = vec![h];
    let mut blank = None;
    for l in 0..enc.num_layers {
        h = b.conformer_block(l, h)?;
        if l + 1 == der.sc_layer {
            let ctc = (d, enc.output_dim, true);
            let ctc_out = Module::new("enc.self_cond.ctc_out", ev.pp("out"));
            let logits = b.linear(&ctc_out, h, ctc, &t)?;
            b.g.checkpoint(logits, "enc.ctc_logits")?;
            let probs = op(
                &mut b.g,
                "enc.self_cond.softmax",
                Softmax,
                &[logits],
                &[],
                &t,
                enc.output_dim,
            )?;
            let bp = unary(
                &mut b.g,
                "enc.self_cond.blank_prob",
                Column { index: 0 },
                probs,
                vec![t.clone()],
                Layout::Plain,
            )?;
            b.g.checkpoint(bp, "enc.mid_blank_probs")?;
            blank = Some(bp);
            let mid_dims = (enc.output_dim, d, true);
            let out_mid = Module::new("enc.self_cond.out_mid", ev.pp("out_mid"));
            let mid = b.linear(&out_mid, probs, mid_dims, &t)?;
            h = b.add(names::BYPASS_OP, h, mid, 1.0, &t, d)?;
        }
        hidden.push(h);
    }
    let blank = blank.ok_or_else(|| {
        RuntimeError::Graph(format!(
            "self_conditioning_layer {} never reached",
            der.sc_layer
        ))
    })?;
    let caps: Vec<EdgeId> = der.captures.iter().map(|&i| hidden[i]).collect();
    let cat_dim = caps.len() * d;
    let cat_out = b.g.op(
        "enc.capture_concat",
        Box::new(ConcatChannels { n: caps.len() }),
        &caps,
        &[],
        vec![named(
            names::CAT_OUT,
            vec![t.clone(), cat_dim.into()],
            Layout::TokenMajor,
        )],
    )?[0];
    b.g.checkpoint(cat_out, "enc.cat_out")?;
    let bpe_rows = Dim::sym(SYM_BPE_FRAMES);
    let pool = PosteriorPool {
        window: enc.bpe_pooling_window,
    };
    let pooled = op(
        &mut b.g,
        "enc.bpe_ctc.pool",
        pool,
        &[h, blank],
        &[],
        &bpe_rows,
        d,
    )?;
    let bpe = ev.pp("out_bpe");
    let bpe_logits = b.g.op(
        "enc.bpe_ctc.out",
        Box::new(Linear::new(true, MatmulStrategy::Gemm)),
        &[pooled],
        &[
            (&bpe.key("weight"), vec![der.bpe_output_dim, d]),
            (&bpe.key("bias"), vec![der.bpe_output_dim]),
        ],
        vec![named(
            names::BPE_LOGITS,
            vec![bpe_rows, der.bpe_output_dim.into()],
            Layout::TokenMajor,
        )],
    )?[0];
    b.g.checkpoint(bpe_logits, "enc.ctc_bpe_logits")?;

    // ---- Projector. Upstream: oracle granite_nar.py `GraniteNarProjector.forward`.
    let pv = Vb::root("projector");
    let ln = (prj.encoder_dim, prj.layernorm_eps as f32);
    let hp = prj.hidden_size;
    let e = prj.encoder_dim;
    let mut slices = Vec::with_capacity(caps.len());
    for j in 0..caps.len() {
        let slice = ChannelSlice {
            start: j * e,
            len: e,
        };
        let s = op(
            &mut b.g,
            &format!("proj.slice.{j}"),
            slice,
            &[cat_out],
            &[],
            &t,
            e,
        )?;
        let norm = pv.pp("layer_norms").pp(j);
        let norm = Module::new(format!("proj.layer_norm.{j}"), norm);
        slices.push(b.layer_norm(&norm, s, ln, &t)?);
    }
    let concat = ConcatChannels { n: slices.len() };
    let x = op(
        &mut b.g,
        "proj.norm_concat",
        concat,
        &slices,
        &[],
        &t,
        cat_dim,
    )?;
    let pm = Module::new("proj", pv.clone());
    let x = b.linear(&pm.pp("layer_projector"), x, (cat_dim, hp, true), &t)?;
    let x = op(&mut b.g, "proj.gelu", Gelu, &[x], &[], &t, hp)?;
    let rows = Dim::sym(SYM_PROJ_ROWS);
    let toks = Dim::sym(SYM_PROJ_TOKENS);
    let pad = WindowPad {
        block: prj.block_size,
    };
    let win = op(&mut b.g, "proj.window_pad", pad, &[x], &[], &rows, hp)?;
    let wpos = [(pv.key("window_positions"), vec![1, prj.block_size, hp])];
    let kv = op(
        &mut b.g,
        "proj.kv_positions",
        AddWindowPositions,
        &[win],
        &wpos,
        &rows,
        hp,
    )?;
    let init = QueryInit {
        downsample: prj.downsample_rate,
    };
    let query = [(pv.key("query"), vec![1, der.n_query, hp])];
    let mut q = op(&mut b.g, "proj.query_init", init, &[win], &query, &toks, hp)?;
    for l in 0..prj.num_layers {
        q = b.qformer_layer(l, q, kv, der.n_query, der.proj_mlp)?;
    }
    // The reference captures `projector.qformer`'s output; this identity marks the stack's end.
    let qf = op(&mut b.g, "proj.qformer", Identity, &[q], &[], &toks, hp)?;
    b.g.checkpoint(qf, "proj.qformer.out")?;
    let out_ln = (hp, prj.layernorm_eps as f32);
    let x = b.layer_norm(&pm.pp("out_norm"), qf, out_ln, &toks)?;
    let out_dims = (hp, prj.llm_dim, true);
    let proj_out = b.linear(&pm.pp("out_linear"), x, out_dims, &toks)?;
    b.g.checkpoint(proj_out, "proj.out")?;

    // ---- Decoder: bidirectional Granite LM. Upstream: oracle granite_nar.py `decode_text`;
    // transformers v5.24.0 modeling_granite.py `GraniteModel.forward`.
    let lm = Vb::root("language_model.model");
    let dm = txt.hidden_size;
    let n_text = Dim::sym(SYM_N_TEXT);
    let n_total = Dim::sym(SYM_N_TOTAL);
    let ids =
        b.g.feed(names::TEMPLATE_IDS, vec![n_text.clone()], Layout::Plain)?;
    let divisor = cfg
        .scale_projected_embeddings
        .then_some(txt.embedding_multiplier as f32);
    let prefix = AudioPrefix {
        downsample: prj.downsample_rate,
        divisor,
    };
    let n_audio = Dim::sym(SYM_N_AUDIO);
    let audio = op(
        &mut b.g,
        "dec.audio_prefix",
        prefix,
        &[proj_out, cat_out],
        &[],
        &n_audio,
        dm,
    )?;
    let embed_key = lm.pp("embed_tokens").key("weight");
    let embed = [(embed_key.clone(), vec![txt.vocab_size, dm])];
    let text = op(
        &mut b.g,
        "dec.embed_tokens",
        Embedding,
        &[ids],
        &embed,
        &n_text,
        dm,
    )?;
    let flat = op(
        &mut b.g,
        "dec.flat_concat",
        ConcatRows,
        &[audio, text],
        &[],
        &n_total,
        dm,
    )?;
    b.g.checkpoint(flat, "dec.flat_embeds")?;
    let scale = Scale {
        factor: txt.embedding_multiplier as f32,
    };
    let mut h = op(
        &mut b.g,
        "dec.embed_scale",
        scale,
        &[flat],
        &[],
        &n_total,
        dm,
    )?;
    for l in 0..txt.num_hidden_layers {
        h = b.lm_layer(l, h, der)?;
    }
    let x = b.rms_norm(&Module::new("dec", lm.clone()).pp("norm"), h, dm, &n_total)?;
    let x = op(
        &mut b.g,
        "dec.text_rows",
        TailRows,
        &[x, ids],
        &[],
        &n_text,
        dm,
    )?;
    // Tied lm_head: the embedding table, no bias, no `/ logits_scaling` (the NAR model calls
    // `lm_head` directly).
    let text_logits = b.g.op(
        "dec.lm_head",
        Box::new(Linear::new(false, MatmulStrategy::Gemm)),
        &[x],
        &[(embed_key.as_str(), vec![txt.vocab_size, dm])],
        vec![named(
            names::TEXT_LOGITS,
            vec![n_text, txt.vocab_size.into()],
            Layout::TokenMajor,
        )],
    )?[0];
    b.g.checkpoint(text_logits, "dec.text_logits")?;

    let mut g = b.g;
    // The tied head reads the embedding table's key but mirrors HF's `language_model.lm_head`.
    g.hf_module("dec.lm_head", "language_model.lm_head")?;
    for e in [cat_out, bpe_logits, text_logits] {
        g.output(e);
    }
    // Tied to embed_tokens (the reference ties it and ignores a stored copy); BatchNorm's step
    // counters are training state.
    g.allow_unused("language_model.lm_head.weight");
    for l in 0..enc.num_layers {
        let bn = Vb::root("encoder.layers").pp(l).pp("conv").pp("batch_norm");
        g.allow_unused(&bn.key("num_batches_tracked"));
    }
    let graph = g.build()?;
    let edges = GraniteEdges {
        pcm: graph.edge_id(names::PCM)?,
        template_ids: graph.edge_id(names::TEMPLATE_IDS)?,
        cat_out: graph.edge_id(names::CAT_OUT)?,
        bpe_logits: graph.edge_id(names::BPE_LOGITS)?,
        text_logits: graph.edge_id(names::TEXT_LOGITS)?,
    };
    Ok((graph, edges))
}
