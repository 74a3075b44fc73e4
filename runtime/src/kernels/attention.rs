//! Scaled dot-product attention over head-major q/k/v, with an optional causal mask that accounts
//! for cached keys (`past = keys - queries`).

use super::layout::{MergeHeads, SplitHeads};
use super::{
    data, dims, fixed, flash, par_ranges, rank, same_dim, sgemm_with, simd, tensor, MatmulStrategy,
};
use crate::faults::ParamFault;
use crate::graph::{port, Dim, Kernel, KernelCtx, KernelOut, Layout, Port, Shape, Tensor};

/// Query rows per task in the `gemm` strategy: a block's score rows (64 x 1500 keys = 384 KB for
/// Whisper's encoder) stay in L2 with the head's K and V between the two products.
const GEMM_BLOCK_ROWS: usize = 64;

/// `softmax((q * scale) k^T + mask) v` per head: q `[H, T, D]`, k `[H, S, D]`, v `[H, S, Dv]`
/// -> context `[H, T, Dv]` (head-major, before merging heads and the output projection).
///
/// The scale multiplies q before the product, as Whisper does (`q_proj(x) * scaling`, then the
/// attention call with `scaling=1.0`). Causal: query `t` sees keys `0 ..= past + t`; masked keys
/// are never summed (their probability is exactly 0), so a row's bits do not depend on how many
/// later keys exist (full window == incremental decode).
///
/// Upstream: transformers v5.24.0 src/transformers/models/whisper/modeling_whisper.py
/// `WhisperAttention.forward` and `eager_attention_forward`.
#[derive(Debug, Clone)]
pub struct Attention {
    /// Multiplies q before `q k^T` (Whisper: `head_dim ** -0.5`).
    pub scale: f32,
    /// Causal mask with past offset.
    pub causal: bool,
    /// `gemm`: two sgemm per head (encoder, long rows); `row_stable`: fixed-order dot products per
    /// query row (decoder).
    pub strategy: MatmulStrategy,
    /// Also output the attention probabilities `[H, T, S]` (port `probs`, head-major; masked keys
    /// are exactly 0), HF eager attention's `attn_weights`. The decoder's self-attention exposes
    /// them as a checkpoint, where a mask bug shows as the `mask` signature.
    pub probs: bool,
    /// `Some(h)`: q, k, v and the context are token-major (`[T, h * D]`, the projections' own
    /// layout: the encoder, whose head split and merge would be two copies of every operand);
    /// `None`: head-major as above. The probabilities are head-major either way.
    pub heads: Option<usize>,
}

/// Probability of a masked key after the softmax of `row` (the visible keys): `0`, or NaN when the
/// row is NaN. torch adds the mask to NaN scores and its softmax of a row holding NaN is NaN
/// everywhere, masked keys included; a NaN query must not turn into finite probabilities.
#[inline]
fn masked_prob(row: &[f32]) -> f32 {
    if row.first().is_some_and(|p| p.is_nan()) {
        f32::NAN
    } else {
        0.0
    }
}

impl Attention {
    /// Head-major attention with scale `scale`, causal or not, by `strategy`; no probabilities
    /// output (set `probs` / `heads` on the result for those).
    pub fn new(scale: f32, causal: bool, strategy: MatmulStrategy) -> Attention {
        Attention {
            scale,
            causal,
            strategy,
            probs: false,
            heads: None,
        }
    }

    /// The layout of q, k, v and the context.
    fn operand_layout(&self) -> Layout {
        if self.heads.is_some() {
            Layout::TokenMajor
        } else {
            Layout::HeadMajor
        }
    }

    /// The same attention over head-major operands.
    fn head_major(&self) -> Attention {
        Attention {
            heads: None,
            ..self.clone()
        }
    }

    /// Token-major operands: the fused kernel reads and writes them in place (AVX-512); other
    /// CPUs and strategies split the heads, run the head-major path and merge the context
    /// (exact copies, so the same result as the split/attention/merge ops).
    fn run_token_major(
        &self,
        h: usize,
        ctx: &KernelCtx,
        inputs: &[&Tensor],
        weights: &[&Tensor],
    ) -> KernelOut {
        let qs = dims(inputs[0], 2, "q")?;
        let ks = dims(inputs[1], 2, "k")?;
        let vs = dims(inputs[2], 2, "v")?;
        if h == 0 || qs[1] % h != 0 || vs[1] % h != 0 || ks[1] != qs[1] || vs[0] != ks[0] {
            return Err(format!(
                "q {qs:?}, k {ks:?}, v {vs:?} do not fit together as {h} token-major heads"
            ));
        }
        let (t, s, d, dv) = (qs[0], ks[0], qs[1] / h, vs[1] / h);
        if self.strategy == MatmulStrategy::Gemm && flash::available(dv) {
            if self.causal && s < t {
                return Err(format!(
                    "causal attention with {t} queries needs at least {t} keys, got {s}"
                ));
            }
            let call = flash::Call {
                q: data(inputs[0], "q")?,
                k: data(inputs[1], "k")?,
                v: data(inputs[2], "v")?,
                h,
                t,
                s,
                d,
                scale: self.scale,
                causal: self.causal,
                token_major: true,
            };
            let mut out = vec![0f32; t * h * dv];
            let mut probs = vec![0f32; if self.probs { h * t * s } else { 0 }];
            let p = self.probs.then_some(&mut probs[..]);
            flash::attention(&call, &mut out, p)?;
            let mut outs = vec![tensor(&[t, h * dv], out)?];
            if self.probs {
                outs.push(tensor(&[h, t, s], probs)?);
            }
            return Ok(outs);
        }
        let split = SplitHeads { heads: h };
        let mut hm = Vec::with_capacity(3);
        for x in inputs.iter().take(3) {
            hm.push(split.run(ctx, &[x], &[])?.remove(0));
        }
        let mut outs = self
            .head_major()
            .run(ctx, &[&hm[0], &hm[1], &hm[2]], weights)?;
        outs[0] = MergeHeads.run(ctx, &[&outs[0]], &[])?.remove(0);
        Ok(outs)
    }
}

impl Kernel for Attention {
    fn kind(&self) -> &'static str {
        "attention"
    }
    fn inputs(&self) -> Vec<Port> {
        let l = self.operand_layout();
        vec![port("q", l), port("k", l), port("v", l)]
    }
    fn outputs(&self) -> Vec<Port> {
        let mut o = vec![port("y", self.operand_layout())];
        if self.probs {
            o.push(port("probs", Layout::HeadMajor));
        }
        o
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        if let Some(h) = self.heads {
            // The head-major shapes these token-major operands stand for, inferred as such.
            let mut hm = Vec::with_capacity(3);
            for (s, n) in inputs.iter().zip(["q", "k", "v"]) {
                rank(s, 2, n)?;
                let f = fixed(&s[1], &format!("{n} features"))?;
                if h == 0 || f % h != 0 {
                    return Err(format!("{n}: {f} features do not split into {h} heads"));
                }
                hm.push(vec![Dim::Fixed(h), s[0].clone(), Dim::Fixed(f / h)]);
            }
            let mut o = self.head_major().infer(&hm, &[])?;
            o[0] = vec![
                o[0][1].clone(),
                Dim::Fixed(h * fixed(&o[0][2], "v head_dim")?),
            ];
            return Ok(o);
        }
        for (s, n) in inputs.iter().zip(["q", "k", "v"]) {
            rank(s, 3, n)?;
        }
        same_dim(&inputs[0][0], &inputs[1][0], "heads of q and k")?;
        same_dim(&inputs[0][0], &inputs[2][0], "heads of q and v")?;
        same_dim(&inputs[0][2], &inputs[1][2], "head_dim of q and k")?;
        same_dim(&inputs[1][1], &inputs[2][1], "keys of k and v")?;
        let mut o = vec![vec![
            inputs[0][0].clone(),
            inputs[0][1].clone(),
            inputs[2][2].clone(),
        ]];
        if self.probs {
            o.push(vec![
                inputs[0][0].clone(),
                inputs[0][1].clone(),
                inputs[1][1].clone(),
            ]);
        }
        Ok(o)
    }
    fn run(&self, ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        if let Some(h) = self.heads {
            return self.run_token_major(h, ctx, inputs, weights);
        }
        let qs = dims(inputs[0], 3, "q")?;
        let ks = dims(inputs[1], 3, "k")?;
        let vs = dims(inputs[2], 3, "v")?;
        let (h, t, d) = (qs[0], qs[1], qs[2]);
        let (s, dv) = (ks[1], vs[2]);
        if ks[0] != h || vs[0] != h || ks[2] != d || vs[1] != s {
            return Err(format!("q {qs:?}, k {ks:?}, v {vs:?} do not fit together"));
        }
        if self.causal && s < t {
            return Err(format!(
                "causal attention with {t} queries needs at least {t} keys, got {s}"
            ));
        }
        let past = s - t.min(s);
        let valid = |ti: usize| if self.causal { past + ti + 1 } else { s };
        let q = data(inputs[0], "q")?;
        let k = data(inputs[1], "k")?;
        let v = data(inputs[2], "v")?;
        let mut out = vec![0f32; h * t * dv];
        let mut probs = if self.probs {
            vec![0f32; h * t * s]
        } else {
            Vec::new()
        };
        match self.strategy {
            MatmulStrategy::Gemm if flash::available(dv) => {
                let call = flash::Call {
                    q,
                    k,
                    v,
                    h,
                    t,
                    s,
                    d,
                    scale: self.scale,
                    causal: self.causal,
                    token_major: false,
                };
                let p = if self.probs {
                    Some(&mut probs[..])
                } else {
                    None
                };
                flash::attention(&call, &mut out, p)?;
            }
            MatmulStrategy::Gemm => {
                // Tasks of (head, block of query rows), each computed whole on one thread: scores
                // of the block (a `GEMM_BLOCK_ROWS x keys` slab that stays in L2, never the whole
                // `T x S` matrix), their softmax, then the block's context. The blocks are fixed
                // (not tied to the thread count), so the bits never depend on it.
                let bq = GEMM_BLOCK_ROWS;
                let nb = t.div_ceil(bq);
                let scale = self.scale;
                let probs_on = self.probs;
                let parts = par_ranges(h * nb, bq * s * (d + dv), |tasks| {
                    let mut done = Vec::with_capacity(tasks.len());
                    let mut scores = vec![0f32; bq * s];
                    let mut qb = vec![0f32; bq * d];
                    for task in tasks {
                        let (hi, t0) = (task / nb, (task % nb) * bq);
                        let rows = bq.min(t - t0);
                        let qs = &mut qb[..rows * d];
                        qs.copy_from_slice(&q[(hi * t + t0) * d..(hi * t + t0 + rows) * d]);
                        simd::scale(qs, scale);
                        let kh = &k[hi * s * d..(hi + 1) * s * d];
                        let vh = &v[hi * s * dv..(hi + 1) * s * dv];
                        let sc = &mut scores[..rows * s];
                        sgemm_with(rows, d, s, qs, (d, 1), kh, (1, d), 0.0, sc, (s, 1), 1)?;
                        for (i, row) in sc.chunks_exact_mut(s).enumerate() {
                            let n = valid(t0 + i);
                            simd::softmax_row(&mut row[..n]);
                            let masked = masked_prob(&row[..n]);
                            row[n..].fill(masked);
                        }
                        let mut ob = vec![0f32; rows * dv];
                        sgemm_with(
                            rows,
                            s,
                            dv,
                            sc,
                            (s, 1),
                            vh,
                            (dv, 1),
                            0.0,
                            &mut ob,
                            (dv, 1),
                            1,
                        )?;
                        let pb = if probs_on { sc.to_vec() } else { Vec::new() };
                        done.push((hi, t0, ob, pb));
                    }
                    Ok::<_, String>(done)
                });
                for part in parts {
                    for (hi, t0, ob, pb) in part? {
                        let at = (hi * t + t0) * dv;
                        out[at..at + ob.len()].copy_from_slice(&ob);
                        if self.probs {
                            let at = (hi * t + t0) * s;
                            probs[at..at + pb.len()].copy_from_slice(&pb);
                        }
                    }
                }
            }
            MatmulStrategy::RowStable => {
                let parts = par_ranges(h, t * s * (d + dv), |heads| {
                    let mut part = vec![0f32; heads.len() * t * dv];
                    let mut ppart = vec![0f32; if self.probs { heads.len() * t * s } else { 0 }];
                    let mut qrow = vec![0f32; d];
                    let mut sc = vec![0f32; s];
                    for (j, hi) in heads.enumerate() {
                        for ti in 0..t {
                            qrow.copy_from_slice(&q[(hi * t + ti) * d..(hi * t + ti + 1) * d]);
                            simd::scale(&mut qrow, self.scale);
                            let o = &mut part[(j * t + ti) * dv..(j * t + ti + 1) * dv];
                            let kh = &k[hi * s * d..(hi + 1) * s * d];
                            let vh = &v[hi * s * dv..(hi + 1) * s * dv];
                            let n = valid(ti);
                            simd::attend_row(&qrow, kh, vh, n, &mut sc, o);
                            if self.probs {
                                // Keys past `n` keep probability 0 (masked), NaN in a NaN row.
                                let at = (j * t + ti) * s;
                                ppart[at..at + n].copy_from_slice(&sc[..n]);
                                ppart[at + n..at + s].fill(masked_prob(&sc[..n]));
                            }
                        }
                    }
                    (part, ppart)
                });
                let (mut off, mut poff) = (0, 0);
                for (p, pp) in parts {
                    out[off..off + p.len()].copy_from_slice(&p);
                    off += p.len();
                    if self.probs {
                        probs[poff..poff + pp.len()].copy_from_slice(&pp);
                        poff += pp.len();
                    }
                }
            }
        }
        let mut outs = vec![tensor(&[h, t, dv], out)?];
        if self.probs {
            outs.push(tensor(&[h, t, s], probs)?);
        }
        Ok(outs)
    }
    fn params(&self) -> serde_json::Value {
        let mut p = serde_json::json!({"scale": self.scale, "causal": self.causal, "strategy": self.strategy, "probs": self.probs});
        if let Some(h) = self.heads {
            p["token_major_heads"] = h.into();
        }
        p
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        super::attention_faults!(self, fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(shape: &[usize], seed: u32) -> Tensor {
        let n: usize = shape.iter().product();
        tensor(shape, crate::kernels::noise(n, seed, 1.0)).expect("shape")
    }

    /// Token-major operands give the split -> head-major attention -> merge result, on both
    /// strategies (the fused kernel where the CPU has it, the split/merge fallback otherwise),
    /// with the same probabilities.
    #[test]
    fn token_major_equals_split_attend_merge() {
        let (h, t, s, d) = (3usize, 70usize, 70usize, 64usize);
        let f16: Vec<Option<&[u16]>> = Vec::new();
        let ctx = KernelCtx {
            op: "t",
            step: 0,
            weights_f16: &f16,
        };
        let (q, k, v) = (
            rand(&[t, h * d], 1),
            rand(&[s, h * d], 2),
            rand(&[s, h * d], 3),
        );
        for strategy in [MatmulStrategy::Gemm, MatmulStrategy::RowStable] {
            for causal in [false, true] {
                let hm = Attention {
                    probs: true,
                    ..Attention::new(0.125, causal, strategy)
                };
                let tm = Attention {
                    heads: Some(h),
                    ..hm.clone()
                };
                let split = SplitHeads { heads: h };
                let sp: Vec<Tensor> = [&q, &k, &v]
                    .iter()
                    .map(|x| split.run(&ctx, &[x], &[]).expect("split").remove(0))
                    .collect();
                let want = hm
                    .run(&ctx, &[&sp[0], &sp[1], &sp[2]], &[])
                    .expect("head-major");
                let merged = MergeHeads
                    .run(&ctx, &[&want[0]], &[])
                    .expect("merge")
                    .remove(0);
                let got = tm.run(&ctx, &[&q, &k, &v], &[]).expect("token-major");
                assert_eq!(got[0].shape(), merged.shape());
                assert_eq!(got[0], merged, "{strategy:?} causal {causal}: context");
                assert_eq!(got[1], want[1], "{strategy:?} causal {causal}: probs");
                let inferred = tm
                    .infer(
                        &[
                            vec![Dim::Fixed(t), Dim::Fixed(h * d)],
                            vec![Dim::Fixed(s), Dim::Fixed(h * d)],
                            vec![Dim::Fixed(s), Dim::Fixed(h * d)],
                        ],
                        &[],
                    )
                    .expect("infer");
                assert_eq!(inferred[0], vec![Dim::Fixed(t), Dim::Fixed(h * d)]);
                assert_eq!(
                    inferred[1],
                    vec![Dim::Fixed(h), Dim::Fixed(t), Dim::Fixed(s)]
                );
            }
        }
        let bad = Attention {
            heads: Some(5),
            ..Attention::new(1.0, false, MatmulStrategy::Gemm)
        };
        let e = bad
            .run(&ctx, &[&q, &k, &v], &[])
            .expect_err("192 features in 5 heads");
        assert!(e.contains("5 token-major heads"), "{e}");
    }
}
