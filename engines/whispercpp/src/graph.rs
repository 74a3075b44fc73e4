//! Node recognition: which ggml nodes of a whisper.cpp graph are X-Ray's checkpoints.
//!
//! whisper.cpp names six tensors (`mel`, `embd`, `position`, `KQ_mask`, `embd_conv`, `embd_enc`);
//! every other node is `node_N` or unnamed. The checkpoints are found by the graph's dataflow
//! instead: starting from the graph's output (the last node) and walking *backwards* along each
//! node's sources, every step asserting the op and the shape the model's config implies (a layer
//! output is `ADD(ADD(MUL_MAT(w2, GELU(ADD(MUL_MAT(w1, LN(x)), b1))), b2), x)`; a LayerNorm is
//! `ADD(MUL(NORM(x), g), b)`; ...). Counts are asserted too (one block per configured layer, one
//! cache write per layer and cache). A graph that does not match is an error naming the node
//! (`node_412 (MUL [384, 1500]) is not the ADD expected for encoder.layer.2.out`), never a guess.
//!
//! This module is plain Rust over a snapshot of the graph ([`Graph`], made in `ffi`), so the
//! recognition is testable on synthetic graphs.

use std::collections::HashMap;

use xray_core::Layout;

/// Index of a tensor in a [`Graph`].
pub type Id = usize;

/// One tensor of a graph (a node, or a leaf a node reads), as ggml describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's address (identity within one compute call).
    pub ptr: usize,
    /// `ggml_op_desc`: the op name (`MUL_MAT`, `ADD`, ...), the unary op for `UNARY` (`GELU`).
    pub op: String,
    /// ggml type name (`f32`, `f16`, `i32`, ...).
    pub ty: String,
    /// ggml's `ne` (innermost first).
    pub ne: [i64; 4],
    /// The tensor's name (empty when unnamed).
    pub name: String,
    /// Sources (`src[0..]`, up to the last non-null).
    pub src: Vec<Option<Id>>,
    /// The tensor a view reads (`view_src`).
    pub view_src: Option<Id>,
    /// Byte offset of a view into `view_src`.
    pub view_offs: usize,
    /// Index in the graph's node list (None for a leaf).
    pub node: Option<usize>,
}

/// A snapshot of one graph handed to `ggml_backend_sched_graph_compute`.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    /// Every tensor the nodes reference.
    pub t: Vec<TensorInfo>,
    /// The node list, in compute order.
    pub nodes: Vec<Id>,
}

impl Graph {
    /// The tensor named `name` (first match), if any.
    pub fn named(&self, name: &str) -> Option<Id> {
        self.t.iter().position(|t| t.name == name)
    }

    /// How a node is named in errors: its ggml name, or `node_N`, with op, type and shape.
    pub fn describe(&self, id: Id) -> String {
        let t = &self.t[id];
        let who = if !t.name.is_empty() {
            t.name.clone()
        } else if let Some(i) = t.node {
            format!("node_{i}")
        } else {
            "leaf".into()
        };
        format!("{who} ({} {} {:?})", t.op, t.ty, t.ne)
    }

    /// Ids of the nodes whose op is `op`.
    pub fn nodes_with(&self, op: &str) -> Vec<Id> {
        self.nodes
            .iter()
            .copied()
            .filter(|&i| self.t[i].op == op)
            .collect()
    }
}

/// Which whisper.cpp graph a compute call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `whisper_build_graph_conv`: mel -> conv1 -> GELU -> conv2 -> GELU (`embd_conv`).
    Conv,
    /// `whisper_build_graph_encoder`: positions, the blocks, the final LayerNorm.
    Encoder,
    /// `whisper_build_graph_cross`: each decoder layer's cross K/V written to the cache.
    Cross,
    /// `whisper_build_graph_decoder`: one decode call (prefill or one token).
    Decoder,
}

/// The model's dimensions (from config.json), against which every shape is asserted.
#[derive(Debug, Clone, PartialEq)]
pub struct Dims {
    /// Mel bins.
    pub n_mels: i64,
    /// Mel frames fed to the encoder (2 x encoder positions).
    pub frames: i64,
    /// Encoder positions.
    pub n_audio_ctx: i64,
    /// Model width.
    pub d_model: i64,
    /// Encoder heads.
    pub enc_heads: i64,
    /// Decoder heads.
    pub dec_heads: i64,
    /// Encoder layers.
    pub enc_layers: usize,
    /// Decoder layers.
    pub dec_layers: usize,
    /// Encoder FFN width.
    pub enc_ffn: i64,
    /// Decoder FFN width.
    pub dec_ffn: i64,
    /// Vocabulary.
    pub vocab: i64,
}

/// How a tapped tensor becomes a dump tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Reshape the C-order values (`[ne3, ne2, ne1, ne0]`) to this shape.
    As(Vec<usize>),
    /// Attention probabilities `[heads, tokens, n_kv]`: keep the first `keep` columns (the
    /// positions that exist; the rest of whisper.cpp's padded KV window is masked, asserted 0).
    CropKv {
        /// Heads.
        heads: usize,
        /// Query rows.
        tokens: usize,
        /// Padded KV length ggml computed.
        n_kv: usize,
        /// Columns kept (`past + tokens`).
        keep: usize,
    },
}

/// One tensor to capture: a contract checkpoint or an op-level point.
#[derive(Debug, Clone, PartialEq)]
pub struct Tap {
    /// The node (or input leaf).
    pub id: Id,
    /// Dump name (`audio.encoder.layer.2.out`, `model.encoder.layers.2.fc2:out`).
    pub name: String,
    /// Layout of the dump tensor.
    pub layout: Layout,
    /// Shape handling.
    pub shape: Shape,
    /// True for an op-level point (`{module}:in|out`), false for a contract checkpoint.
    pub point: bool,
    /// X-Ray's name of the op that produced it (`encoder.layer.2.residual_mlp`).
    pub op: String,
}

/// An op whisper.cpp computes below f32 (the precision record of the dump).
#[derive(Debug, Clone, PartialEq)]
pub struct Reduced {
    /// X-Ray's name for the op (`encoder.layer.0.gelu`, `decoder.layer.1.cross_attn`).
    pub op: String,
    /// The ggml node.
    pub id: Id,
    /// What is reduced, from the ggml source (file and function named).
    pub why: String,
}

/// What recognition found in one graph.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// Tensors to capture.
    pub taps: Vec<Tap>,
    /// Input leaves to read before the compute (their values are set by then).
    pub inputs: Vec<Tap>,
    /// Ops computed below f32.
    pub reduced: Vec<Reduced>,
}

/// A graph that does not match the expected pattern: the message names the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch(pub String);

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type R<T> = Result<T, Mismatch>;

/// One op-level point: the tensor, the HF module, its side (`in`, `out`) and the runtime op.
type PointRow = (Id, String, &'static str, String);

/// Which graph this is, from the tensors whisper.cpp names and the ops present.
pub fn kind(g: &Graph) -> R<Kind> {
    if g.named("mel").is_some() {
        Ok(Kind::Conv)
    } else if g.named("embd").is_some() && g.named("position").is_some() {
        Ok(Kind::Decoder)
    } else if !g.nodes_with("NORM").is_empty() {
        Ok(Kind::Encoder)
    } else if !g.nodes_with("CPY").is_empty() && g.nodes_with("SOFT_MAX").is_empty() {
        Ok(Kind::Cross)
    } else {
        Err(Mismatch(format!(
            "a graph of {} nodes that is none of whisper.cpp's conv, encoder, cross or decoder graphs",
            g.nodes.len()
        )))
    }
}

/// Context of one recognition.
pub struct Recognizer<'g> {
    g: &'g Graph,
    d: &'g Dims,
    flash: bool,
    ops: bool,
    found: Found,
}

/// ggml `ne` of a 2-D `[rows, cols]` row-major matrix.
fn ne2(cols: i64, rows: i64) -> [i64; 4] {
    [cols, rows, 1, 1]
}

/// What [`Recognizer::attention`] finds: the Linear ADD of q, the SOFT_MAX node when not flash, k
/// and v as read.
type Attention = (Id, Option<Id>, Id, Id);

impl<'g> Recognizer<'g> {
    /// `flash`: whisper.cpp runs with flash attention; `ops`: also tap the op-level points.
    pub fn new(g: &'g Graph, d: &'g Dims, flash: bool, ops: bool) -> Recognizer<'g> {
        Recognizer {
            g,
            d,
            flash,
            ops,
            found: Found::default(),
        }
    }

    fn t(&self, id: Id) -> &TensorInfo {
        &self.g.t[id]
    }

    fn want(&self, id: Id, op: &str, what: &str) -> R<Id> {
        if self.t(id).op == op {
            Ok(id)
        } else {
            Err(Mismatch(format!(
                "{} is not the {op} expected for {what}",
                self.g.describe(id)
            )))
        }
    }

    fn src(&self, id: Id, i: usize, what: &str) -> R<Id> {
        self.t(id).src.get(i).copied().flatten().ok_or_else(|| {
            Mismatch(format!(
                "{} has no source {i} ({what})",
                self.g.describe(id)
            ))
        })
    }

    /// `src(id, i)` asserted to be `op`.
    fn arg(&self, id: Id, i: usize, op: &str, what: &str) -> R<Id> {
        let s = self.src(id, i, what)?;
        self.want(s, op, what)
    }

    fn shape(&self, id: Id, ne: [i64; 4], what: &str) -> R<()> {
        if self.t(id).ne == ne {
            Ok(())
        } else {
            Err(Mismatch(format!(
                "{} has shape {:?}, expected {ne:?} for {what}",
                self.g.describe(id),
                self.t(id).ne
            )))
        }
    }

    fn same(&self, a: Id, b: Id, what: &str) -> R<()> {
        if a == b {
            Ok(())
        } else {
            Err(Mismatch(format!(
                "{what}: {} is not {}",
                self.g.describe(a),
                self.g.describe(b)
            )))
        }
    }

    fn tap(&mut self, id: Id, name: String, layout: Layout, shape: Vec<usize>, op: &str) {
        self.found.taps.push(Tap {
            id,
            name,
            layout,
            shape: Shape::As(shape),
            point: false,
            op: op.into(),
        });
    }

    fn point(&mut self, id: Id, module: String, side: &str, shape: Vec<usize>, op: &str) {
        if !self.ops {
            return;
        }
        let layout = if module.ends_with(".conv1") || module.ends_with(".conv2") {
            Layout::ChannelMajor
        } else {
            Layout::TokenMajor
        };
        self.found.taps.push(Tap {
            id,
            name: format!("{module}:{side}"),
            layout,
            shape: Shape::As(shape),
            point: true,
            op: op.into(),
        });
    }

    /// [`Self::point`] for each `(id, module, side, op)` of `points`, in order, all of `shape`.
    fn points(&mut self, shape: &[usize], points: impl IntoIterator<Item = PointRow>) {
        for (id, module, side, op) in points {
            self.point(id, module, side, shape.to_vec(), &op);
        }
    }

    /// The op-level points of one block's self-attention, in the runtime's op names (`side`: `""`
    /// in the encoder, `"self_"` in the decoder): the pre-norm's input `inp` and output `ln` (the
    /// q/k/v projections' input), the q/k/v projections' outputs, the context `ctx` (out_proj's
    /// input) and out_proj's output `proj`, all of `shape`.
    fn self_attn_points(
        &mut self,
        p: &str,
        module: &str,
        side: &str,
        [inp, ln, q, k, v, ctx, proj]: [Id; 7],
        shape: &[usize],
    ) {
        let norm = format!("{module}.self_attn_layer_norm");
        let norm_op = format!("{p}.self_attn_norm");
        let a = |leaf: &str| format!("{module}.self_attn.{leaf}");
        let op = |leaf: &str| format!("{p}.{side}{leaf}");
        let points = [
            (inp, norm.clone(), "in", format!("{p}.input")),
            (ln, a("q_proj"), "in", norm_op.clone()),
            (ln, a("k_proj"), "in", norm_op.clone()),
            (ln, a("v_proj"), "in", norm_op.clone()),
            (ln, norm, "out", norm_op),
            (q, a("q_proj"), "out", op("q_proj")),
            (k, a("k_proj"), "out", op("k_proj")),
            (v, a("v_proj"), "out", op("v_proj")),
            (ctx, a("out_proj"), "in", op("merge_heads")),
            (proj, a("out_proj"), "out", op("out_proj")),
        ];
        self.points(shape, points);
    }

    fn reduced(&mut self, op: String, id: Id, why: impl Into<String>) {
        self.found.reduced.push(Reduced {
            op,
            id,
            why: why.into(),
        });
    }

    /// A MUL_MAT whose weight (src0) is f16: ggml converts src1 to src0's `vec_dot_type` (f16)
    /// before the dot products (ggml-cpu/ggml-cpu.c, `ggml_compute_forward_mul_mat`).
    fn note_matmul(&mut self, id: Id, op: String) {
        let s0 = self.t(id).src.first().copied().flatten();
        let s1 = self.t(id).src.get(1).copied().flatten();
        let ty = |s: Option<Id>| s.map(|s| self.t(s).ty.clone()).unwrap_or_default();
        let (a, b) = (ty(s0), ty(s1));
        if a == "f16" || b == "f16" {
            self.reduced(
                op,
                id,
                format!(
                    "MUL_MAT of {a} x {b}: the f32 operand is rounded to f16 (vec_dot_type of f16) \
                     before f16 dot products accumulated in f32 \
                     (ggml-cpu/ggml-cpu.c ggml_compute_forward_mul_mat, ggml_vec_dot_f16)"
                ),
            );
        }
    }

    /// `ADD(MUL(NORM(x), g), b)` ending at `out`; returns `x`.
    fn layer_norm(&mut self, out: Id, width: i64, rows: i64, what: &str) -> R<Id> {
        self.want(out, "ADD", what)?;
        self.shape(out, ne2(width, rows), what)?;
        let mul = self.arg(out, 0, "MUL", what)?;
        let norm = self.arg(mul, 0, "NORM", what)?;
        self.src(norm, 0, what)
    }

    /// `ADD(MUL_MAT(w, x), b)` ending at `out` (a Linear with bias); returns (matmul, x).
    fn linear(&mut self, out: Id, width: i64, rows: i64, what: &str) -> R<(Id, Id)> {
        self.want(out, "ADD", what)?;
        self.shape(out, ne2(width, rows), what)?;
        let mm = self.arg(out, 0, "MUL_MAT", what)?;
        let x = self.src(mm, 1, what)?;
        self.note_matmul(mm, what.into());
        Ok((mm, x))
    }

    /// A pre-norm sublayer's entry, walked back from `x`, the output of its first Linear
    /// `{p}.{proj}` (`width` wide over `rows` rows): that Linear and the LayerNorm `{p}.{norm}`
    /// before it, whose input must be `residual`, the stream the sublayer (`what`) adds back to.
    /// Returns the LayerNorm's output (the Linear's input).
    fn pre_norm(
        &mut self,
        x: Id,
        (width, rows): (i64, i64),
        p: &str,
        (proj, norm, what): (&str, &str, &str),
        residual: Id,
    ) -> R<Id> {
        let (_, ln) = self.linear(x, width, rows, &format!("{p}.{proj}"))?;
        let x2 = self.layer_norm(ln, self.d.d_model, rows, &format!("{p}.{norm}"))?;
        self.same(
            x2,
            residual,
            &format!("{p}: the {what}'s LayerNorm input and residual"),
        )?;
        Ok(ln)
    }

    /// The MLP block `x + fc2(GELU(fc1(LN(x))))` ending at `out`; taps its points; returns `x`.
    fn mlp(&mut self, out: Id, width: i64, ffn: i64, rows: i64, p: &str, module: &str) -> R<Id> {
        let what = format!("{p}.residual_mlp");
        self.want(out, "ADD", &what)?;
        self.shape(out, ne2(width, rows), &what)?;
        let fc2 = self.src(out, 0, &what)?;
        let x = self.src(out, 1, &what)?;
        let (_, gelu) = self.linear(fc2, width, rows, &format!("{p}.fc2"))?;
        self.want(gelu, "GELU", &format!("{p}.gelu"))?;
        self.reduced(
            format!("{p}.gelu"),
            gelu,
            "GELU through an f16 table: the input rounded to f16, the tanh approximation's value \
             looked up in f16 (ggml-cpu/vec.h ggml_vec_gelu_f32 under GGML_GELU_FP16, table filled \
             in ggml-cpu/ggml-cpu.c ggml_cpu_init from ggml_gelu_f32, the tanh form)",
        );
        let fc1 = self.src(gelu, 0, &format!("{p}.gelu"))?;
        let ln = self.pre_norm(fc1, (ffn, rows), p, ("fc1", "mlp_norm", "MLP"), x)?;
        let (w, f, step_rows) = (width as usize, ffn as usize, rows as usize);
        let m = |leaf: &str| format!("{module}.{leaf}");
        let o = |leaf: &str| format!("{p}.{leaf}");
        self.points(
            &[step_rows, w],
            [
                (x, m("final_layer_norm"), "in", o("residual_attn")),
                (ln, m("final_layer_norm"), "out", o("mlp_norm")),
                (ln, m("fc1"), "in", o("mlp_norm")),
            ],
        );
        self.points(
            &[step_rows, f],
            [
                (fc1, m("fc1"), "out", o("fc1")),
                (gelu, m("fc2"), "in", o("gelu")),
            ],
        );
        self.point(fc2, m("fc2"), "out", vec![step_rows, w], &o("fc2"));
        Ok(x)
    }

    /// Layer `il` of the `stack` (`encoder`, `decoder`) from its output `x` back to the residual
    /// add `{p}.{residual}` before its MLP: taps the layer's output, walks the MLP (`ffn` wide over
    /// `rows` rows) and returns the layer's op prefix `p` and HF module with the add's two sources
    /// (the attention's out_proj output, the residual stream).
    fn layer_tail(
        &mut self,
        stack: &str,
        il: usize,
        x: Id,
        (ffn, rows): (i64, i64),
        residual: &str,
    ) -> R<(String, String, Id, Id)> {
        let p = format!("{stack}.layer.{il}");
        let module = format!("model.{stack}.layers.{il}");
        let shape = vec![rows as usize, self.d.d_model as usize];
        let out = format!("audio.{p}.out");
        self.tap(
            x,
            out,
            Layout::TokenMajor,
            shape,
            &format!("{p}.residual_mlp"),
        );
        let inp_ff = self.mlp(x, self.d.d_model, ffn, rows, &p, &module)?;
        let what = format!("{p}.{residual}");
        self.want(inp_ff, "ADD", &what)?;
        let attn_out = self.src(inp_ff, 0, &what)?;
        let stream = self.src(inp_ff, 1, &what)?;
        Ok((p, module, attn_out, stream))
    }

    /// `PERMUTE(RESHAPE(q))` or `PERMUTE(RESHAPE(SCALE(q)))` (the attention's query); returns
    /// the Linear's ADD.
    fn query(&self, q: Id, scaled: bool, what: &str) -> R<Id> {
        let perm = self.want(q, "PERMUTE", what)?;
        let resh = self.arg(perm, 0, "RESHAPE", what)?;
        if scaled {
            let sc = self.arg(resh, 0, "SCALE", what)?;
            self.arg(sc, 0, "ADD", what)
        } else {
            self.arg(resh, 0, "ADD", what)
        }
    }

    /// The CPY nodes writing `buffer` (a cache or kv_pad) whose value comes from a MUL_MAT
    /// reading `x`, through the ops in `chain` (innermost last).
    fn cache_writes(&self, buffer: Id, x: Id) -> Vec<(Id, Id)> {
        let mut out = vec![];
        for c in self.g.nodes_with("CPY") {
            let Some(dst) = self.t(c).src.get(1).copied().flatten() else {
                continue;
            };
            if self.t(dst).view_src != Some(buffer) {
                continue;
            }
            // Walk the value back through SCALE / ADD / TRANSPOSE / RESHAPE to its MUL_MAT.
            let mut v = self.t(c).src.first().copied().flatten();
            let mut mm = None;
            for _ in 0..6 {
                let Some(id) = v else { break };
                if self.t(id).op == "MUL_MAT" {
                    mm = Some(id);
                    break;
                }
                v = self.t(id).src.first().copied().flatten();
            }
            if let Some(mm) = mm {
                if self.t(mm).src.get(1).copied().flatten() == Some(x) {
                    out.push((c, mm));
                }
            }
        }
        out
    }

    /// The one write each of a self-attention's K and V (views `k`, `v` of a cache or kv_pad)
    /// from the LayerNorm output `ln`: `(CPY, MUL_MAT)` of K, then of V. The errors name `{p}:
    /// {kv}K` and `{kv}V`, the buffer as `cache` and the writes as going `into`.
    fn kv_writes(
        &self,
        (k, v): (Id, Id),
        ln: Id,
        p: &str,
        (kv, cache, into): (&str, &str, &str),
    ) -> R<((Id, Id), (Id, Id))> {
        let kb = self
            .t(k)
            .view_src
            .ok_or_else(|| Mismatch(format!("{p}: {kv}K is not a view of {cache}")))?;
        let vb = self
            .t(v)
            .view_src
            .ok_or_else(|| Mismatch(format!("{p}: {kv}V is not a view of {cache}")))?;
        let kw = self.cache_writes(kb, ln);
        let vw = self.cache_writes(vb, ln);
        if kw.len() != 1 || vw.len() != 1 {
            return Err(Mismatch(format!(
                "{p}: {} K and {} V writes into {into}, expected 1 each",
                kw.len(),
                vw.len()
            )));
        }
        Ok((kw[0], vw[0]))
    }

    /// The K and V cache writes `writes` (`(CPY, "k" | "v")`) into a cache of less than f32, each
    /// noted as reduced precision at X-Ray's op `op(which)`: the `attn`'s K or V `how` ("stored
    /// in", "appended to") the cache, in whisper.cpp's graph `builder`.
    fn reduced_cache(
        &mut self,
        writes: [(Id, &str); 2],
        op: impl Fn(&str) -> String,
        (attn, how, builder): (&str, &str, &str),
    ) -> R<()> {
        for (c, which) in writes {
            let dst = self.src(c, 1, "cache")?;
            let ty = self.t(dst).ty.clone();
            if ty != "f32" {
                self.reduced(
                    op(which),
                    c,
                    format!(
                        "{attn} {} {how} an {ty} cache (src/whisper.cpp whisper_kv_cache_init \
                         with whisper_context::itype = GGML_TYPE_F16; {builder})",
                        which.to_uppercase()
                    ),
                );
            }
        }
        Ok(())
    }

    /// Bytes of one decoder layer's slot in the cross cache `cache` (a view of it, or a write's
    /// destination): d_model × the audio context (padded to 256 with flash attention) elements of
    /// its type.
    fn cross_slot(&self, cache: Id) -> usize {
        let n = self.d.n_audio_ctx;
        let es = if self.t(cache).ty == "f16" { 2 } else { 4 };
        let stride = if self.flash { (n + 255) / 256 * 256 } else { n };
        (es * self.d.d_model * stride) as usize
    }

    fn finish(self) -> Found {
        self.found
    }

    /// The conv graph: `mel` -> conv1 (+ bias) -> GELU -> conv2 (+ bias) -> GELU.
    pub fn conv(mut self) -> R<Found> {
        let d = self.d.clone();
        let mel = self
            .g
            .named("mel")
            .ok_or_else(|| Mismatch("conv graph without a tensor named mel".into()))?;
        self.shape(mel, [d.frames, d.n_mels, 1, 1], "audio.frontend.mel")?;
        let last = *self
            .g
            .nodes
            .last()
            .ok_or_else(|| Mismatch("empty conv graph".into()))?;
        let mut x = last;
        let mut adds = vec![];
        for (i, (frames, what)) in [
            (d.n_audio_ctx, "encoder.conv2"),
            (d.frames, "encoder.conv1"),
        ]
        .into_iter()
        .enumerate()
        {
            let gelu = self.want(x, "GELU", &format!("{what}_gelu"))?;
            let add = self.arg(gelu, 0, "ADD", what)?;
            self.shape(add, [frames, d.d_model, 1, 1], what)?;
            let resh = self.arg(add, 0, "RESHAPE", what)?;
            let mm = self.arg(resh, 0, "MUL_MAT", what)?;
            let cols = self.arg(mm, 0, "RESHAPE", what)?;
            let im2col = self.arg(cols, 0, "IM2COL", what)?;
            let input = self.src(im2col, 1, what)?;
            self.reduced(
                what.into(),
                im2col,
                format!(
                    "conv1d as IM2COL to {} then MUL_MAT: the input and the kernel are rounded to f16 \
                     (ggml.c ggml_conv_1d builds ggml_im2col(..., GGML_TYPE_F16); the kernel is MUL_MAT's \
                     src1, converted to f16 as vec_dot_type), f16 dot products accumulated in f32",
                    self.t(im2col).ty
                ),
            );
            self.reduced(
                format!("{what}_gelu"),
                gelu,
                "GELU through an f16 table (ggml-cpu/vec.h ggml_vec_gelu_f32, GGML_GELU_FP16; tanh form)",
            );
            adds.push(add);
            if i == 0 {
                x = self.want(input, "GELU", "encoder.conv1_gelu")?;
            } else {
                self.same(input, mel, "encoder.conv1's input")?;
            }
        }
        let (dm, fr, ctx) = (
            d.d_model as usize,
            d.frames as usize,
            d.n_audio_ctx as usize,
        );
        self.found.inputs.push(Tap {
            id: mel,
            name: "audio.frontend.mel".into(),
            layout: Layout::ChannelMajor,
            shape: Shape::As(vec![d.n_mels as usize, fr]),
            point: false,
            op: "frontend.log_mel".into(),
        });
        self.tap(
            adds[1],
            "audio.encoder.conv1.out".into(),
            Layout::ChannelMajor,
            vec![dm, fr],
            "encoder.conv1",
        );
        self.tap(
            adds[0],
            "audio.encoder.conv2.out".into(),
            Layout::ChannelMajor,
            vec![dm, ctx],
            "encoder.conv2",
        );
        if self.ops {
            self.found.inputs.push(Tap {
                id: mel,
                name: "model.encoder.conv1:in".into(),
                layout: Layout::ChannelMajor,
                shape: Shape::As(vec![d.n_mels as usize, fr]),
                point: true,
                op: "frontend.log_mel".into(),
            });
        }
        let conv1_gelu = self.src(
            self.src(
                self.src(
                    self.src(self.src(adds[0], 0, "conv2")?, 0, "conv2")?,
                    0,
                    "conv2",
                )?,
                0,
                "conv2",
            )?,
            1,
            "conv2",
        )?;
        let (conv1, conv2) = ("model.encoder.conv1", "model.encoder.conv2");
        self.points(
            &[dm, fr],
            [
                (conv1_gelu, conv2.into(), "in", "encoder.conv1_gelu".into()),
                (adds[1], conv1.into(), "out", "encoder.conv1".into()),
            ],
        );
        self.point(
            adds[0],
            "model.encoder.conv2".into(),
            "out",
            vec![dm, ctx],
            "encoder.conv2",
        );
        Ok(self.finish())
    }

    /// The attention sublayer `{p}.{attn}` walked back from its out_proj's output `proj` (`rows`
    /// rows): the Linear `{p}.{out_proj}`, then [`Self::attention`] on its input, the context.
    /// Returns the context and what [`Self::attention`] returns.
    fn attention_sublayer(
        &mut self,
        proj: Id,
        rows: i64,
        p: &str,
        (out_proj, attn): (&str, &str),
        scaled_q: bool,
    ) -> R<(Id, Attention)> {
        let (_, ctx) = self.linear(proj, self.d.d_model, rows, &format!("{p}.{out_proj}"))?;
        Ok((ctx, self.attention(ctx, scaled_q, &format!("{p}.{attn}"))?))
    }

    /// Self-attention of one encoder or decoder block ending at the attention context `ctx`
    /// (`[tokens, d_model]` before out_proj). Returns (the Linear ADD of q, the LayerNorm output
    /// q, k and v read, the SOFT_MAX node when not flash).
    fn attention(&mut self, ctx: Id, scaled_q: bool, what: &str) -> R<Attention> {
        if self.flash {
            let resh = self.want(ctx, "RESHAPE", what)?;
            let fa = self.arg(resh, 0, "FLASH_ATTN_EXT", what)?;
            let q = self.src(fa, 0, what)?;
            let k = self.src(fa, 1, what)?;
            let v = self.src(fa, 2, what)?;
            let q_add = self.query(q, scaled_q, what)?;
            let (kt, vt) = (self.t(k).ty.clone(), self.t(v).ty.clone());
            self.reduced(
                what.into(),
                fa,
                format!(
                    "FLASH_ATTN_EXT with K {kt}, V {vt}: Q rounded to f16 for the K dot products, and \
                     with V in f16 the weighted sum of V is accumulated in an f16 buffer (VKQ16) \
                     (ggml-cpu/ops.cpp ggml_compute_forward_flash_attn_ext_f16_one_chunk)"
                ),
            );
            Ok((q_add, None, k, v))
        } else {
            let cont = self.want(ctx, "CONT", what)?;
            let perm = self.arg(cont, 0, "PERMUTE", what)?;
            let kqv = self.arg(perm, 0, "MUL_MAT", what)?;
            let v = self.src(kqv, 0, what)?;
            let sm = self.arg(kqv, 1, "SOFT_MAX", what)?;
            let kq = self.arg(sm, 0, "MUL_MAT", what)?;
            let k = self.src(kq, 0, what)?;
            let q = self.src(kq, 1, what)?;
            let q_add = self.query(q, scaled_q, what)?;
            let (kt, vt) = (self.t(k).ty.clone(), self.t(v).ty.clone());
            if kt == "f16" || vt == "f16" {
                self.reduced(
                    what.into(),
                    kqv,
                    format!(
                        "attention with K {kt} and V {vt} (whisper.cpp's itype, always GGML_TYPE_F16: \
                         src/whisper.cpp whisper_context::itype; ggml_cast in whisper_build_graph_encoder, \
                         the f16 KV caches of whisper_kv_cache_init): Q and the softmax probabilities are \
                         rounded to f16 as MUL_MAT's src1 (ggml-cpu.c ggml_compute_forward_mul_mat)"
                    ),
                );
            }
            Ok((q_add, Some(sm), k, v))
        }
    }

    /// The encoder graph.
    pub fn encoder(mut self) -> R<Found> {
        let d = self.d.clone();
        let (w, n) = (d.d_model, d.n_audio_ctx);
        let (wu, nu) = (w as usize, n as usize);
        let last = *self
            .g
            .nodes
            .last()
            .ok_or_else(|| Mismatch("empty encoder graph".into()))?;
        let mut x = self.layer_norm(last, w, n, "encoder.final_norm")?;
        self.point(
            x,
            "model.encoder.layer_norm".into(),
            "in",
            vec![nu, wu],
            "encoder.layer.last.residual_mlp",
        );
        self.tap(
            last,
            "audio.encoder.memory".into(),
            Layout::TokenMajor,
            vec![nu, wu],
            "encoder.final_norm",
        );
        self.point(
            last,
            "model.encoder.layer_norm".into(),
            "out",
            vec![nu, wu],
            "encoder.final_norm",
        );
        for il in (0..d.enc_layers).rev() {
            // inpFF = out_proj(attention) + inpL
            let (p, module, proj, inp_l) =
                self.layer_tail("encoder", il, x, (d.enc_ffn, n), "residual_attn")?;
            let names = ("out_proj", "self_attn");
            let (ctx, (q_add, _, k, v)) = self.attention_sublayer(proj, n, &p, names, false)?;
            let names = ("q_proj", "self_attn_norm", "attention");
            let ln = self.pre_norm(q_add, (w, n), &p, names, inp_l)?;
            // K and V: read through ggml_cast (non-flash) or through kv_pad, written by CPY.
            let (k_mm, v_add) = if self.flash {
                let names = ("", "kv_pad", "kv_pad from this layer's LayerNorm");
                let ((_, k_mm), (v_cpy, _)) = self.kv_writes((k, v), ln, &p, names)?;
                let v_add = self.src(v_cpy, 0, &format!("{p}.v_proj"))?;
                self.want(v_add, "ADD", &format!("{p}.v_proj"))?;
                (k_mm, v_add)
            } else {
                // K' = PERMUTE(CPY(RESHAPE(MUL_MAT(wk, ln)))), V' = CPY(PERMUTE(RESHAPE(ADD(...))))
                let kp = self.want(k, "PERMUTE", &format!("{p}.k_proj"))?;
                let kc = self.arg(kp, 0, "CPY", &format!("{p}.k_proj"))?;
                let kr = self.arg(kc, 0, "RESHAPE", &format!("{p}.k_proj"))?;
                let k_mm = self.arg(kr, 0, "MUL_MAT", &format!("{p}.k_proj"))?;
                let vc = self.want(v, "CPY", &format!("{p}.v_proj"))?;
                let vp = self.arg(vc, 0, "PERMUTE", &format!("{p}.v_proj"))?;
                let vr = self.arg(vp, 0, "RESHAPE", &format!("{p}.v_proj"))?;
                let v_add = self.arg(vr, 0, "ADD", &format!("{p}.v_proj"))?;
                (k_mm, v_add)
            };
            self.shape(k_mm, ne2(w, n), &format!("{p}.k_proj"))?;
            self.same(
                self.src(k_mm, 1, "k_proj")?,
                ln,
                &format!("{p}.k_proj's input"),
            )?;
            self.note_matmul(k_mm, format!("{p}.k_proj"));
            let (_, vx) = self.linear(v_add, w, n, &format!("{p}.v_proj"))?;
            self.same(vx, ln, &format!("{p}.v_proj's input"))?;
            let ids = [inp_l, ln, q_add, k_mm, v_add, ctx, proj];
            self.self_attn_points(&p, &module, "", ids, &[nu, wu]);
            x = inp_l;
        }
        // inpL(0) = e_pe + transpose(embd_conv)
        let what = "encoder.positions";
        self.want(x, "ADD", what)?;
        let tr = self.arg(x, 1, "CONT", what)?;
        self.arg(tr, 0, "TRANSPOSE", what)?;
        Ok(self.finish())
    }

    /// The cross graph: per decoder layer, `K = MUL_MAT(wk, memory)` scaled and `V = MUL_MAT(wv,
    /// memory) + b`, copied into the f16 cross cache at the layer's offset.
    pub fn cross(mut self) -> R<Found> {
        let d = self.d.clone();
        let (w, n) = (d.d_model, d.n_audio_ctx);
        let mut seen = vec![[None, None]; d.dec_layers];
        for c in self.g.nodes_with("CPY") {
            let dst = self.src(c, 1, "cross cache write")?;
            let val = self.src(c, 0, "cross cache write")?;
            let (is_v, add) = match self.t(val).op.as_str() {
                "SCALE" => (false, None),
                "ADD" => (true, Some(val)),
                "TRANSPOSE" => {
                    let r = self.arg(val, 0, "RESHAPE", "cross V")?;
                    (true, Some(self.arg(r, 0, "ADD", "cross V")?))
                }
                _ => {
                    return Err(Mismatch(format!(
                        "{} writes the cross cache from {}, neither a scaled K nor a biased V",
                        self.g.describe(c),
                        self.g.describe(val)
                    )))
                }
            };
            let mm = match add {
                Some(a) => self.arg(a, 0, "MUL_MAT", "cross V")?,
                None => self.arg(val, 0, "MUL_MAT", "cross K")?,
            };
            self.shape(mm, ne2(w, n), "cross K/V projection")?;
            let per_layer = self.cross_slot(dst);
            let offs = self.t(dst).view_offs;
            if !offs.is_multiple_of(per_layer) || offs / per_layer >= d.dec_layers {
                return Err(Mismatch(format!(
                    "{} writes the cross cache at byte {offs}, not at a layer's slot ({per_layer} bytes each, {} layers)",
                    self.g.describe(c),
                    d.dec_layers
                )));
            }
            let il = offs / per_layer;
            let slot = &mut seen[il][usize::from(is_v)];
            if slot.is_some() {
                return Err(Mismatch(format!(
                    "{}: a second cross {} write for decoder layer {il}",
                    self.g.describe(c),
                    if is_v { "V" } else { "K" }
                )));
            }
            *slot = Some((c, mm, add));
        }
        let (wu, nu) = (w as usize, n as usize);
        for (il, kv) in seen.iter().enumerate() {
            let p = format!("decoder.layer.{il}");
            let module = format!("model.decoder.layers.{il}.encoder_attn");
            let (Some((kc, k_mm, _)), Some((vc, v_mm, Some(v_add)))) = (kv[0], kv[1]) else {
                return Err(Mismatch(format!(
                    "cross graph: decoder layer {il} lacks its K or V cache write ({} CPY nodes for {} layers)",
                    self.g.nodes_with("CPY").len(),
                    d.dec_layers
                )));
            };
            self.note_matmul(k_mm, format!("{p}.cross_k_proj"));
            self.note_matmul(v_mm, format!("{p}.cross_v_proj"));
            self.reduced_cache(
                [(kc, "k"), (vc, "v")],
                // X-Ray's op whose output is the cached (head-major) K or V.
                |which| format!("{p}.cross_{which}_to_head_major"),
                ("cross-attention", "stored in", "whisper_build_graph_cross"),
            )?;
            self.tap(
                k_mm,
                format!("audio.{p}.cross_k"),
                Layout::TokenMajor,
                vec![nu, wu],
                &format!("{p}.cross_k_proj"),
            );
            self.tap(
                v_add,
                format!("audio.{p}.cross_v"),
                Layout::TokenMajor,
                vec![nu, wu],
                &format!("{p}.cross_v_proj"),
            );
            let mem = self.src(k_mm, 1, "cross K input")?;
            self.same(
                self.src(v_mm, 1, "cross V input")?,
                mem,
                "cross K and V read one memory",
            )?;
            let m = |leaf: &str| format!("{module}.{leaf}");
            let final_norm = || "encoder.final_norm".to_string();
            self.points(
                &[nu, wu],
                [
                    (mem, m("k_proj"), "in", final_norm()),
                    (mem, m("v_proj"), "in", final_norm()),
                    (k_mm, m("k_proj"), "out", format!("{p}.cross_k_proj")),
                    (v_add, m("v_proj"), "out", format!("{p}.cross_v_proj")),
                ],
            );
        }
        Ok(self.finish())
    }

    /// One decoder call over `tokens` new tokens after `past` cached ones.
    pub fn decoder(mut self, tokens: usize, past: usize) -> R<Found> {
        let d = self.d.clone();
        let w = d.d_model;
        let t = tokens as i64;
        let (wu, tu) = (w as usize, tokens);
        let heads = d.dec_heads as usize;
        let last = *self
            .g
            .nodes
            .last()
            .ok_or_else(|| Mismatch("empty decoder graph".into()))?;
        self.want(last, "MUL_MAT", "decoder.proj_out")?;
        self.shape(last, ne2(d.vocab, t), "decoder.proj_out")?;
        self.note_matmul(last, "decoder.proj_out".into());
        self.tap(
            last,
            "audio.decoder.logits".into(),
            Layout::TokenMajor,
            vec![tu, d.vocab as usize],
            "decoder.proj_out",
        );
        let ln = self.src(last, 1, "decoder.proj_out")?;
        let mut x = self.layer_norm(ln, w, t, "decoder.final_norm")?;
        let (norm, final_norm) = ("model.decoder.layer_norm", "decoder.final_norm");
        self.points(
            &[tu, wu],
            [
                (
                    x,
                    norm.into(),
                    "in",
                    "decoder.layer.last.residual_mlp".into(),
                ),
                (ln, norm.into(), "out", final_norm.into()),
                (ln, "proj_out".into(), "in", final_norm.into()),
            ],
        );
        self.point(
            last,
            "proj_out".into(),
            "out",
            vec![tu, d.vocab as usize],
            "decoder.proj_out",
        );
        for il in (0..d.dec_layers).rev() {
            // inpFF = cross out_proj + inpCA
            let (p, module, cproj, inp_ca) =
                self.layer_tail("decoder", il, x, (d.dec_ffn, t), "residual_cross")?;
            let names = ("cross_out_proj", "cross_attn");
            let (cctx, (cq, csm, ck, cv)) = self.attention_sublayer(cproj, t, &p, names, false)?;
            if let Some(sm) = csm {
                self.shape(
                    sm,
                    [d.n_audio_ctx, t, d.dec_heads, 1],
                    &format!("{p}.cross_attn"),
                )?;
            }
            let want_offs = self.cross_slot(ck) * il;
            for (kv, which) in [(ck, "K"), (cv, "V")] {
                if self.t(kv).op != "VIEW" || self.t(kv).view_offs != want_offs {
                    return Err(Mismatch(format!(
                        "{}: {p}'s cross {which} is not the view of the cross cache at layer {il}'s slot (byte {want_offs})",
                        self.g.describe(kv)
                    )));
                }
            }
            let names = ("cross_q_proj", "cross_attn_norm", "cross-attention");
            let lnc = self.pre_norm(cq, (w, t), &p, names, inp_ca)?;
            self.tap(
                cctx,
                format!("audio.{p}.cross_attention.output"),
                Layout::TokenMajor,
                vec![tu, wu],
                &format!("{p}.cross_attn"),
            );
            self.tap(
                cproj,
                format!("audio.{p}.cross_attention.out_proj"),
                Layout::TokenMajor,
                vec![tu, wu],
                &format!("{p}.cross_out_proj"),
            );
            let norm = format!("{module}.encoder_attn_layer_norm");
            let ea = |leaf: &str| format!("{module}.encoder_attn.{leaf}");
            let o = |leaf: &str| format!("{p}.{leaf}");
            self.points(
                &[tu, wu],
                [
                    (inp_ca, norm.clone(), "in", o("residual_self")),
                    (lnc, ea("q_proj"), "in", o("cross_attn_norm")),
                    (lnc, norm, "out", o("cross_attn_norm")),
                    (cq, ea("q_proj"), "out", o("cross_q_proj")),
                    (cctx, ea("out_proj"), "in", o("cross_merge_heads")),
                    (cproj, ea("out_proj"), "out", o("cross_out_proj")),
                ],
            );
            // inpCA = self out_proj + inpL
            let what = format!("{p}.residual_self");
            self.want(inp_ca, "ADD", &what)?;
            let sproj = self.src(inp_ca, 0, &what)?;
            let inp_l = self.src(inp_ca, 1, &what)?;
            let names = ("self_out_proj", "self_attn");
            let (sctx, (sq, ssm, sk, sv)) = self.attention_sublayer(sproj, t, &p, names, true)?;
            let names = ("self_q_proj", "self_attn_norm", "self-attention");
            let ln1 = self.pre_norm(sq, (w, t), &p, names, inp_l)?;
            if let Some(sm) = ssm {
                let n_kv = self.t(sm).ne[0];
                self.shape(sm, [n_kv, t, d.dec_heads, 1], &format!("{p}.self_attn"))?;
                let keep = past + tokens;
                if (n_kv as usize) < keep {
                    return Err(Mismatch(format!(
                        "{}: {n_kv} KV columns for {keep} positions",
                        self.g.describe(sm)
                    )));
                }
                self.found.taps.push(Tap {
                    id: sm,
                    name: format!("audio.{p}.self_attention.probs"),
                    layout: Layout::HeadMajor,
                    shape: Shape::CropKv {
                        heads,
                        tokens,
                        n_kv: n_kv as usize,
                        keep,
                    },
                    point: false,
                    op: format!("{p}.self_attn"),
                });
            }
            self.tap(
                sproj,
                format!("audio.{p}.self_attention.output"),
                Layout::TokenMajor,
                vec![tu, wu],
                &format!("{p}.self_out_proj"),
            );
            // The self K/V written into the f16 cache this call.
            let names = (
                "self ",
                "the cache",
                "the self-attention cache from this layer",
            );
            let ((k_cpy, k_mm), (v_cpy, _)) = self.kv_writes((sk, sv), ln1, &p, names)?;
            self.note_matmul(k_mm, format!("{p}.self_k_proj"));
            let v_val = self.src(v_cpy, 0, "self V")?;
            let v_add = if self.t(v_val).op == "TRANSPOSE" {
                let r = self.arg(v_val, 0, "RESHAPE", "self V")?;
                self.arg(r, 0, "ADD", "self V")?
            } else {
                self.want(v_val, "ADD", "self V")?
            };
            self.note_matmul(self.src(v_add, 0, "self V")?, format!("{p}.self_v_proj"));
            self.reduced_cache(
                [(k_cpy, "k"), (v_cpy, "v")],
                |which| format!("{p}.self_{which}_append"),
                (
                    "self-attention",
                    "appended to",
                    "whisper_build_graph_decoder",
                ),
            )?;
            let ids = [inp_l, ln1, sq, k_mm, v_add, sctx, sproj];
            self.self_attn_points(&p, &module, "self_", ids, &[tu, wu]);
            x = inp_l;
        }
        // inpL(0) = GET_ROWS(d_te, embd) + GET_ROWS(d_pe, position)
        let what = "decoder.embed";
        self.want(x, "ADD", what)?;
        let te = self.arg(x, 0, "GET_ROWS", what)?;
        let pe = self.arg(x, 1, "GET_ROWS", what)?;
        let embd = self.src(te, 1, what)?;
        let pos = self.src(pe, 1, what)?;
        self.same(
            embd,
            self.g.named("embd").unwrap_or(usize::MAX),
            "the token rows' ids",
        )?;
        self.same(
            pos,
            self.g.named("position").unwrap_or(usize::MAX),
            "the position rows' ids",
        )?;
        self.shape(embd, [t, 1, 1, 1], "audio.decoder.input_ids")?;
        self.shape(te, ne2(w, t), what)?;
        self.shape(pe, ne2(w, t), what)?;
        // The two lookups' rows (nn.Embedding's outputs in HF): a bad table row (a converter's
        // off-by-one, a wrong vocabulary) stands out at its lookup, not at the sum.
        self.points(
            &[tu, wu],
            [
                (
                    te,
                    "model.decoder.embed_tokens".into(),
                    "out",
                    "decoder.embed_tokens".into(),
                ),
                (
                    pe,
                    "model.decoder.embed_positions".into(),
                    "out",
                    "decoder.embed_positions".into(),
                ),
            ],
        );
        // The ids are fed (checkpoints); a replay of a lookup recovers them from the reference's
        // rows, as it does on X-Ray's runtime.
        for (id, name, op) in [
            (embd, "audio.decoder.input_ids", "feed:decoder.input_ids"),
            (
                pos,
                "audio.decoder.position_ids",
                "feed:decoder.position_ids",
            ),
        ] {
            self.found.inputs.push(Tap {
                id,
                name: name.into(),
                layout: Layout::Plain,
                shape: Shape::As(vec![tu]),
                point: false,
                op: op.into(),
            });
        }
        if self
            .t(te)
            .src
            .first()
            .copied()
            .flatten()
            .map(|s| self.t(s).ty.as_str())
            == Some("f16")
        {
            self.reduced(
                "decoder.embed_tokens".into(),
                te,
                "token embedding rows read from the f16 table (the f16 model's d_te; ggml-cpu get_rows_f16 widens exactly)",
            );
        }
        Ok(self.finish())
    }
}

/// Recognize any whisper.cpp graph. `decode`: (tokens, past) of the decode call, for the decoder.
pub fn recognize(
    g: &Graph,
    d: &Dims,
    flash: bool,
    ops: bool,
    decode: Option<(usize, usize)>,
) -> R<(Kind, Found)> {
    let k = kind(g)?;
    let r = Recognizer::new(g, d, flash, ops);
    let found = match k {
        Kind::Conv => r.conv()?,
        Kind::Encoder => r.encoder()?,
        Kind::Cross => r.cross()?,
        Kind::Decoder => {
            let (tokens, past) =
                decode.ok_or_else(|| Mismatch("a decoder graph outside a decode call".into()))?;
            r.decoder(tokens, past)?
        }
    };
    // Each node is tapped under one contract name at most once (a point may alias a checkpoint).
    let mut names: HashMap<&str, Id> = HashMap::new();
    for t in found.taps.iter().chain(&found.inputs) {
        if names.insert(&t.name, t.id).is_some() {
            return Err(Mismatch(format!(
                "{} recognized twice in one graph",
                t.name
            )));
        }
    }
    Ok((k, found))
}
