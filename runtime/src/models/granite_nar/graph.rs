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
    AddWindowPositions, AudioPrefix, BatchNorm, ChannelSlice, Column, ConcatChannels, ConcatRows,
    DepthwiseConv, Glu, GqaAttention, Identity, Pointwise, PosteriorPool, QueryInit, RmsNorm,
    Scale, ShawBlockAttention, Silu, Softmax, SwiGlu, TailRows, WindowCrossAttention, WindowPad,
    MAX_CONCAT, SYM_BPE_FRAMES, SYM_ENC_FRAMES, SYM_MEL_FRAMES, SYM_N_AUDIO, SYM_N_TEXT,
    SYM_N_TOTAL, SYM_PROJ_ROWS, SYM_PROJ_TOKENS,
};
use super::{Derived, GraniteNarConfig, ENCODER_NORM_EPS};
use crate::error::{Result, RuntimeError};
use crate::graph::{Dim, EdgeId, Graph, GraphBuilder, Kernel, Layout, Out};
use crate::kernels::{Embedding, Gelu, LayerNorm, Linear, MatmulStrategy, MergeHeads, SplitHeads};
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

/// The builder with its config facts and the per-op helpers.
struct B<'a> {
    g: GraphBuilder,
    cfg: &'a GraniteNarConfig,
}

fn named(name: &str, shape: crate::graph::Shape, layout: Layout) -> Out {
    Out {
        name: Some(name.to_string()),
        shape,
        layout,
    }
}

impl B<'_> {
    fn op(
        &mut self,
        name: &str,
        k: impl Kernel + 'static,
        ins: &[EdgeId],
        ws: &[(String, Vec<usize>)],
        rows: &Dim,
        cols: usize,
    ) -> Result<EdgeId> {
        let ws: Vec<(&str, Vec<usize>)> = ws.iter().map(|(k, s)| (k.as_str(), s.clone())).collect();
        self.g.op1(
            name,
            Box::new(k),
            ins,
            &ws,
            vec![rows.clone(), cols.into()],
            Layout::TokenMajor,
        )
    }

    /// `nn.Linear(n_in, n_out, bias)` under HF key `key`.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &mut self,
        name: &str,
        x: EdgeId,
        key: &str,
        n_in: usize,
        n_out: usize,
        bias: bool,
        rows: &Dim,
    ) -> Result<EdgeId> {
        let mut w = vec![(format!("{key}.weight"), vec![n_out, n_in])];
        if bias {
            w.push((format!("{key}.bias"), vec![n_out]));
        }
        self.op(
            name,
            Linear::new(bias, MatmulStrategy::Gemm),
            &[x],
            &w,
            rows,
            n_out,
        )
    }

    /// `nn.LayerNorm(d, eps)` under HF key `key`.
    fn layer_norm(
        &mut self,
        name: &str,
        x: EdgeId,
        key: &str,
        d: usize,
        eps: f32,
        rows: &Dim,
    ) -> Result<EdgeId> {
        let w = [
            (format!("{key}.weight"), vec![d]),
            (format!("{key}.bias"), vec![d]),
        ];
        self.op(name, LayerNorm::new(eps), &[x], &w, rows, d)
    }

    fn rms_norm(
        &mut self,
        name: &str,
        x: EdgeId,
        key: &str,
        d: usize,
        rows: &Dim,
    ) -> Result<EdgeId> {
        let eps = self.cfg.text_config.rms_norm_eps as f32;
        self.op(
            name,
            RmsNorm { eps },
            &[x],
            &[(format!("{key}.weight"), vec![d])],
            rows,
            d,
        )
    }

    fn add(
        &mut self,
        name: &str,
        a: EdgeId,
        b: EdgeId,
        scale: f32,
        rows: &Dim,
        d: usize,
    ) -> Result<EdgeId> {
        self.op(
            name,
            crate::kernels::add::Add::scaled(scale),
            &[a, b],
            &[],
            rows,
            d,
        )
    }

    /// Conformer feed-forward `down(silu(up(LN(x))))` and the macaron half-step residual.
    ///
    /// Upstream: transformers v5.24.0 modeling_granite_speech.py `GraniteSpeechConformerFeedForward`.
    fn conformer_ff(&mut self, p: &str, k: &str, h: EdgeId) -> Result<EdgeId> {
        let enc = &self.cfg.encoder_config;
        let (d, inner) = (enc.hidden_dim, enc.hidden_dim * enc.feedforward_mult);
        let t = Dim::sym(SYM_ENC_FRAMES);
        let x = self.layer_norm(
            &format!("{p}.pre_norm"),
            h,
            &format!("{k}.pre_norm"),
            d,
            ENCODER_NORM_EPS,
            &t,
        )?;
        let x = self.linear(
            &format!("{p}.up_proj"),
            x,
            &format!("{k}.up_proj"),
            d,
            inner,
            true,
            &t,
        )?;
        let x = self.op(&format!("{p}.silu"), Silu, &[x], &[], &t, inner)?;
        let x = self.linear(
            &format!("{p}.down_proj"),
            x,
            &format!("{k}.down_proj"),
            inner,
            d,
            true,
            &t,
        )?;
        self.add(&format!("{p}.residual"), h, x, 0.5, &t, d)
    }

    /// One Conformer block: FF1 (half step) -> block-local Shaw attention -> conv module -> FF2
    /// (half step) -> post LayerNorm.
    ///
    /// Upstream: transformers v5.24.0 modeling_granite_speech.py `GraniteSpeechConformerBlock.forward`,
    /// `GraniteSpeechConformerAttention.forward`, `GraniteSpeechConformerConvModule.forward`.
    fn conformer_block(&mut self, l: usize, h: EdgeId) -> Result<EdgeId> {
        let enc = self.cfg.encoder_config.clone();
        let d = enc.hidden_dim;
        let inner = enc.num_heads * enc.dim_head;
        let conv_inner = d * enc.conv_expansion_factor;
        let t = Dim::sym(SYM_ENC_FRAMES);
        let (p, k) = (format!("enc.block.{l}"), format!("encoder.layers.{l}"));
        let h = self.conformer_ff(&format!("{p}.ff1"), &format!("{k}.ff1"), h)?;

        // Attention.
        let x = self.layer_norm(
            &format!("{p}.attn.pre_norm"),
            h,
            &format!("{k}.attn.pre_norm"),
            d,
            ENCODER_NORM_EPS,
            &t,
        )?;
        let q = self.linear(
            &format!("{p}.attn.to_q"),
            x,
            &format!("{k}.attn.to_q"),
            d,
            inner,
            false,
            &t,
        )?;
        let kv = self.linear(
            &format!("{p}.attn.to_kv"),
            x,
            &format!("{k}.attn.to_kv"),
            d,
            2 * inner,
            false,
            &t,
        )?;
        let shaw = ShawBlockAttention {
            heads: enc.num_heads,
            dim_head: enc.dim_head,
            context: enc.context_size,
            max_pos_emb: enc.max_pos_emb,
            scale: (enc.dim_head as f32).powf(-0.5),
            causal: false,
        };
        let rel = [(
            format!("{k}.attn.rel_pos_emb.weight"),
            vec![2 * enc.max_pos_emb + 1, enc.dim_head],
        )];
        let a = self.op(&format!("{p}.attn.shaw"), shaw, &[q, kv], &rel, &t, inner)?;
        let a = self.linear(
            &format!("{p}.attn.to_out"),
            a,
            &format!("{k}.attn.to_out"),
            inner,
            d,
            true,
            &t,
        )?;
        let h = self.add(&format!("{p}.attn.residual"), h, a, 1.0, &t, d)?;

        // Conv module.
        let x = self.layer_norm(
            &format!("{p}.conv.norm"),
            h,
            &format!("{k}.conv.norm"),
            d,
            ENCODER_NORM_EPS,
            &t,
        )?;
        let up = [
            (
                format!("{k}.conv.up_conv.weight"),
                vec![2 * conv_inner, d, 1],
            ),
            (format!("{k}.conv.up_conv.bias"), vec![2 * conv_inner]),
        ];
        let x = self.op(
            &format!("{p}.conv.up_conv"),
            Pointwise { bias: true },
            &[x],
            &up,
            &t,
            2 * conv_inner,
        )?;
        let x = self.op(&format!("{p}.conv.glu"), Glu, &[x], &[], &t, conv_inner)?;
        let dw = [(
            format!("{k}.conv.depth_conv.conv.weight"),
            vec![conv_inner, 1, enc.conv_kernel_size],
        )];
        let x = self.op(
            &format!("{p}.conv.depth_conv"),
            DepthwiseConv {
                kernel: enc.conv_kernel_size,
            },
            &[x],
            &dw,
            &t,
            conv_inner,
        )?;
        let bn: Vec<(String, Vec<usize>)> = ["weight", "bias", "running_mean", "running_var"]
            .iter()
            .map(|r| (format!("{k}.conv.batch_norm.{r}"), vec![conv_inner]))
            .collect();
        let x = self.op(
            &format!("{p}.conv.batch_norm"),
            BatchNorm {
                eps: ENCODER_NORM_EPS,
            },
            &[x],
            &bn,
            &t,
            conv_inner,
        )?;
        let x = self.op(&format!("{p}.conv.silu"), Silu, &[x], &[], &t, conv_inner)?;
        let down = [
            (format!("{k}.conv.down_conv.weight"), vec![d, conv_inner, 1]),
            (format!("{k}.conv.down_conv.bias"), vec![d]),
        ];
        let x = self.op(
            &format!("{p}.conv.down_conv"),
            Pointwise { bias: true },
            &[x],
            &down,
            &t,
            d,
        )?;
        let h = self.add(&format!("{p}.conv.residual"), h, x, 1.0, &t, d)?;

        let h = self.conformer_ff(&format!("{p}.ff2"), &format!("{k}.ff2"), h)?;
        let out = self.layer_norm(
            &format!("{p}.post_norm"),
            h,
            &format!("{k}.post_norm"),
            d,
            ENCODER_NORM_EPS,
            &t,
        )?;
        self.g.checkpoint(out, &format!("enc.block.{l}.out"))?;
        Ok(out)
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
    let mel = b.op(
        "frontend.log_mel",
        pre.log_mel()?,
        &[pcm],
        &[],
        &Dim::sym(SYM_MEL_FRAMES),
        n_mels,
    )?;
    let mel_in = b.op(
        "frontend.stack_frames",
        StackFrames,
        &[mel],
        &[],
        &t,
        2 * n_mels,
    )?;
    b.g.checkpoint(mel_in, "enc.mel_in")?;

    // ---- Encoder. Upstream: oracle granite_nar.py `GraniteNarEncoder.forward`.
    let mut h = b.linear(
        "enc.input_linear",
        mel_in,
        "encoder.input_linear",
        enc.input_dim,
        d,
        true,
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
            let logits = b.linear(
                "enc.self_cond.ctc_out",
                h,
                "encoder.out",
                d,
                enc.output_dim,
                true,
                &t,
            )?;
            b.g.checkpoint(logits, "enc.ctc_logits")?;
            let probs = b.op(
                "enc.self_cond.softmax",
                Softmax,
                &[logits],
                &[],
                &t,
                enc.output_dim,
            )?;
            let bp = b.g.op1(
                "enc.self_cond.blank_prob",
                Box::new(Column { index: 0 }),
                &[probs],
                &[],
                vec![t.clone()],
                Layout::Plain,
            )?;
            b.g.checkpoint(bp, "enc.mid_blank_probs")?;
            blank = Some(bp);
            let mid = b.linear(
                "enc.self_cond.out_mid",
                probs,
                "encoder.out_mid",
                enc.output_dim,
                d,
                true,
                &t,
            )?;
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
    let pooled = b.op(
        "enc.bpe_ctc.pool",
        PosteriorPool {
            window: enc.bpe_pooling_window,
        },
        &[h, blank],
        &[],
        &bpe_rows,
        d,
    )?;
    let bw = [
        (
            "encoder.out_bpe.weight".to_string(),
            vec![der.bpe_output_dim, d],
        ),
        ("encoder.out_bpe.bias".to_string(), vec![der.bpe_output_dim]),
    ];
    let bpe_logits = b.g.op(
        "enc.bpe_ctc.out",
        Box::new(Linear::new(true, MatmulStrategy::Gemm)),
        &[pooled],
        &bw.iter()
            .map(|(k, s)| (k.as_str(), s.clone()))
            .collect::<Vec<_>>(),
        vec![named(
            names::BPE_LOGITS,
            vec![bpe_rows, der.bpe_output_dim.into()],
            Layout::TokenMajor,
        )],
    )?[0];
    b.g.checkpoint(bpe_logits, "enc.ctc_bpe_logits")?;

    // ---- Projector. Upstream: oracle granite_nar.py `GraniteNarProjector.forward`,
    // `GraniteNarQFormerLayer.forward`, `GraniteNarCrossAttention.forward`.
    let eps = prj.layernorm_eps as f32;
    let hp = prj.hidden_size;
    let e = prj.encoder_dim;
    let mut slices = Vec::with_capacity(caps.len());
    for j in 0..caps.len() {
        let s = b.op(
            &format!("proj.slice.{j}"),
            ChannelSlice {
                start: j * e,
                len: e,
            },
            &[cat_out],
            &[],
            &t,
            e,
        )?;
        slices.push(b.layer_norm(
            &format!("proj.layer_norm.{j}"),
            s,
            &format!("projector.layer_norms.{j}"),
            e,
            eps,
            &t,
        )?);
    }
    let x = b.op(
        "proj.norm_concat",
        ConcatChannels { n: slices.len() },
        &slices,
        &[],
        &t,
        cat_dim,
    )?;
    let x = b.linear(
        "proj.layer_projector",
        x,
        "projector.layer_projector",
        cat_dim,
        hp,
        true,
        &t,
    )?;
    let x = b.op("proj.gelu", Gelu, &[x], &[], &t, hp)?;
    let rows = Dim::sym(SYM_PROJ_ROWS);
    let toks = Dim::sym(SYM_PROJ_TOKENS);
    let win = b.op(
        "proj.window_pad",
        WindowPad {
            block: prj.block_size,
        },
        &[x],
        &[],
        &rows,
        hp,
    )?;
    let kv = b.op(
        "proj.kv_positions",
        AddWindowPositions,
        &[win],
        &[(
            "projector.window_positions".into(),
            vec![1, prj.block_size, hp],
        )],
        &rows,
        hp,
    )?;
    let mut q = b.op(
        "proj.query_init",
        QueryInit {
            downsample: prj.downsample_rate,
        },
        &[win],
        &[("projector.query".into(), vec![1, der.n_query, hp])],
        &toks,
        hp,
    )?;
    let heads = prj.num_heads;
    for l in 0..prj.num_layers {
        let (p, k) = (
            format!("proj.qformer.layer.{l}"),
            format!("projector.qformer.layers.{l}"),
        );
        let x = b.layer_norm(
            &format!("{p}.attn_norm"),
            q,
            &format!("{k}.attn_norm"),
            hp,
            eps,
            &toks,
        )?;
        let qq = b.linear(
            &format!("{p}.q_proj"),
            x,
            &format!("{k}.cross_attention.q_proj"),
            hp,
            hp,
            prj.attn_bias,
            &toks,
        )?;
        let kk = b.linear(
            &format!("{p}.k_proj"),
            kv,
            &format!("{k}.cross_attention.k_proj"),
            hp,
            hp,
            prj.attn_bias,
            &rows,
        )?;
        let vv = b.linear(
            &format!("{p}.v_proj"),
            kv,
            &format!("{k}.cross_attention.v_proj"),
            hp,
            hp,
            prj.attn_bias,
            &rows,
        )?;
        let att = WindowCrossAttention {
            heads,
            n_query: der.n_query,
            block: prj.block_size,
            scale: ((hp / heads) as f32).powf(-0.5),
        };
        let a = b.op(
            &format!("{p}.cross_attn"),
            att,
            &[qq, kk, vv],
            &[],
            &toks,
            hp,
        )?;
        let a = b.linear(
            &format!("{p}.o_proj"),
            a,
            &format!("{k}.cross_attention.o_proj"),
            hp,
            hp,
            prj.attn_bias,
            &toks,
        )?;
        q = b.add(&format!("{p}.residual_attn"), q, a, 1.0, &toks, hp)?;
        let x = b.layer_norm(
            &format!("{p}.mlp_norm"),
            q,
            &format!("{k}.mlp_norm"),
            hp,
            eps,
            &toks,
        )?;
        let x = b.linear(
            &format!("{p}.fc1"),
            x,
            &format!("{k}.mlp.fc1"),
            hp,
            der.proj_mlp,
            prj.mlp_bias,
            &toks,
        )?;
        let x = b.op(&format!("{p}.silu"), Silu, &[x], &[], &toks, der.proj_mlp)?;
        let x = b.linear(
            &format!("{p}.fc2"),
            x,
            &format!("{k}.mlp.fc2"),
            der.proj_mlp,
            hp,
            prj.mlp_bias,
            &toks,
        )?;
        q = b.add(&format!("{p}.residual_mlp"), q, x, 1.0, &toks, hp)?;
    }
    // The reference captures `projector.qformer`'s output; this identity marks the stack's end.
    let qf = b.op("proj.qformer", Identity, &[q], &[], &toks, hp)?;
    b.g.checkpoint(qf, "proj.qformer.out")?;
    let x = b.layer_norm("proj.out_norm", qf, "projector.out_norm", hp, eps, &toks)?;
    let proj_out = b.linear(
        "proj.out_linear",
        x,
        "projector.out_linear",
        hp,
        prj.llm_dim,
        true,
        &toks,
    )?;
    b.g.checkpoint(proj_out, "proj.out")?;

    // ---- Decoder: bidirectional Granite LM. Upstream: oracle granite_nar.py `decode_text`;
    // transformers v5.24.0 modeling_granite.py `GraniteModel.forward`, `GraniteDecoderLayer.forward`.
    let dm = txt.hidden_size;
    let n_text = Dim::sym(SYM_N_TEXT);
    let n_total = Dim::sym(SYM_N_TOTAL);
    let ids =
        b.g.feed(names::TEMPLATE_IDS, vec![n_text.clone()], Layout::Plain)?;
    let divisor = cfg
        .scale_projected_embeddings
        .then_some(txt.embedding_multiplier as f32);
    let audio = b.op(
        "dec.audio_prefix",
        AudioPrefix {
            downsample: prj.downsample_rate,
            divisor,
        },
        &[proj_out, cat_out],
        &[],
        &Dim::sym(SYM_N_AUDIO),
        dm,
    )?;
    let embed_key = "language_model.model.embed_tokens.weight".to_string();
    let text = b.op(
        "dec.embed_tokens",
        Embedding,
        &[ids],
        &[(embed_key.clone(), vec![txt.vocab_size, dm])],
        &n_text,
        dm,
    )?;
    let flat = b.op(
        "dec.flat_concat",
        ConcatRows,
        &[audio, text],
        &[],
        &n_total,
        dm,
    )?;
    b.g.checkpoint(flat, "dec.flat_embeds")?;
    let mut h = b.op(
        "dec.embed_scale",
        Scale {
            factor: txt.embedding_multiplier as f32,
        },
        &[flat],
        &[],
        &n_total,
        dm,
    )?;
    let (hq, hk, hd) = (txt.num_attention_heads, der.kv_heads, der.head_dim);
    let rm = txt.residual_multiplier as f32;
    for l in 0..txt.num_hidden_layers {
        let (p, k) = (
            format!("dec.layer.{l}"),
            format!("language_model.model.layers.{l}"),
        );
        let x = b.rms_norm(
            &format!("{p}.input_layernorm"),
            h,
            &format!("{k}.input_layernorm"),
            dm,
            &n_total,
        )?;
        let ab = txt.attention_bias;
        let qx = b.linear(
            &format!("{p}.q_proj"),
            x,
            &format!("{k}.self_attn.q_proj"),
            dm,
            hq * hd,
            ab,
            &n_total,
        )?;
        let kx = b.linear(
            &format!("{p}.k_proj"),
            x,
            &format!("{k}.self_attn.k_proj"),
            dm,
            hk * hd,
            ab,
            &n_total,
        )?;
        let vx = b.linear(
            &format!("{p}.v_proj"),
            x,
            &format!("{k}.self_attn.v_proj"),
            dm,
            hk * hd,
            ab,
            &n_total,
        )?;
        let mut hm = Vec::with_capacity(3);
        for (nm, e, nh) in [("q", qx, hq), ("k", kx, hk), ("v", vx, hk)] {
            hm.push(b.g.op1(
                &format!("{p}.{nm}_heads"),
                Box::new(SplitHeads { heads: nh }),
                &[e],
                &[],
                vec![nh.into(), n_total.clone(), hd.into()],
                Layout::HeadMajor,
            )?);
        }
        let att = GqaAttention {
            scale: txt.attention_multiplier as f32,
            causal: false,
            rope_theta: der.rope_theta as f32,
            query_pos_offset: 0,
        };
        let att_out = b.g.op(
            &names::dec_attention(l),
            Box::new(att),
            &[hm[0], hm[1], hm[2]],
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
        b.g.checkpoint(att_out[1], &format!("dec.layer.{l}.attn_probs"))?;
        let a = att_out[0];
        let a = b.op(
            &format!("{p}.merge_heads"),
            MergeHeads,
            &[a],
            &[],
            &n_total,
            hq * hd,
        )?;
        let a = b.linear(
            &format!("{p}.o_proj"),
            a,
            &format!("{k}.self_attn.o_proj"),
            hq * hd,
            dm,
            ab,
            &n_total,
        )?;
        h = b.add(&format!("{p}.residual_attn"), h, a, rm, &n_total, dm)?;
        let x = b.rms_norm(
            &format!("{p}.post_attention_layernorm"),
            h,
            &format!("{k}.post_attention_layernorm"),
            dm,
            &n_total,
        )?;
        let (mb, inter) = (txt.mlp_bias, txt.intermediate_size);
        let gt = b.linear(
            &format!("{p}.gate_proj"),
            x,
            &format!("{k}.mlp.gate_proj"),
            dm,
            inter,
            mb,
            &n_total,
        )?;
        let up = b.linear(
            &format!("{p}.up_proj"),
            x,
            &format!("{k}.mlp.up_proj"),
            dm,
            inter,
            mb,
            &n_total,
        )?;
        let x = b.op(
            &format!("{p}.swiglu"),
            SwiGlu,
            &[gt, up],
            &[],
            &n_total,
            inter,
        )?;
        let x = b.linear(
            &format!("{p}.down_proj"),
            x,
            &format!("{k}.mlp.down_proj"),
            inter,
            dm,
            mb,
            &n_total,
        )?;
        h = b.add(&format!("{p}.residual_mlp"), h, x, rm, &n_total, dm)?;
        b.g.checkpoint(h, &format!("dec.layer.{l}.out"))?;
    }
    let x = b.rms_norm("dec.norm", h, "language_model.model.norm", dm, &n_total)?;
    let x = b.op("dec.text_rows", TailRows, &[x, ids], &[], &n_text, dm)?;
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
    for e in [cat_out, bpe_logits, text_logits] {
        g.output(e);
    }
    // Tied to embed_tokens (the reference ties it and ignores a stored copy); BatchNorm's step
    // counters are training state.
    g.allow_unused("language_model.lm_head.weight");
    for l in 0..enc.num_layers {
        g.allow_unused(&format!(
            "encoder.layers.{l}.conv.batch_norm.num_batches_tracked"
        ));
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
