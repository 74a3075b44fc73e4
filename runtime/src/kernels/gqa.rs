//! Grouped-query self-attention with rotary position embeddings (RoPE): the LLaMA/Granite
//! attention core, head-major.

use super::activation::softmax_in_place;
use crate::faults::ParamFault;
use crate::graph::{port, Kernel, KernelCtx, KernelOut, Layout, Port, Shape, Tensor};
use crate::kernels::{data, dims, fixed, par_ranges, rank, same_dim, simd, tensor};

/// Default (non-interleaved, "rotate_half") RoPE in place on head-major `[h, t, d]` rows,
/// positions `offset .. offset + t`: `inv_freq_i = 1 / theta^(2i / d)` (f32, as torch computes
/// it), angle = `pos * inv_freq` over `cat(inv_freq, inv_freq)`, `x' = x cos + cat(-x2, x1) sin`.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteRotaryEmbedding.compute_default_rope_parameters`, `GraniteRotaryEmbedding.forward`,
/// `rotate_half`, `apply_rotary_pos_emb`.
pub fn apply_rope(x: &mut [f32], h: usize, t: usize, d: usize, theta: f32, offset: i64) {
    let half = d / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / d as f32))
        .collect();
    let mut cos = vec![0f32; t * half];
    let mut sin = vec![0f32; t * half];
    for ti in 0..t {
        let pos = (ti as i64 + offset) as f32;
        for i in 0..half {
            let a = pos * inv[i];
            cos[ti * half + i] = a.cos();
            sin[ti * half + i] = a.sin();
        }
    }
    for row in x.chunks_exact_mut(d).take(h * t).enumerate() {
        let (r, xr) = row;
        let ti = r % t;
        for i in 0..half {
            let (c, sn) = (cos[ti * half + i], sin[ti * half + i]);
            let (x1, x2) = (xr[i], xr[half + i]);
            xr[i] = x1 * c + (-x2) * sn;
            xr[half + i] = x2 * c + x1 * sn;
        }
    }
}

/// Granite LM self-attention core, head-major: q `[Hq, T, D]`, k `[Hkv, S, D]`, v
/// `[Hkv, S, Dv]` as projected; RoPE ([`apply_rope`]) on k at positions `0 .. S` and on q at
/// positions `S - T + query_pos_offset ..`;
/// query head h uses kv head `h / (Hq / Hkv)`; scores `(q . k) * scale` (Granite's
/// `attention_multiplier`), softmax, `sum p v`. Outputs the context `[Hq, T, Dv]` and the
/// probabilities `[Hq, T, S]` (HF eager attention's `attn_weights`; masked keys exactly 0).
/// No mask: the NAR LM is bidirectional. Fault
/// seams: [`ParamFault::AttnScale`] (replaces the scale), [`ParamFault::Causal`] (query t sees
/// keys `..= S - T + t`), [`ParamFault::RopeOffset`] (shifts the query positions against the
/// key positions: the classic off-by-one; a shift of both would be invisible, since RoPE scores
/// depend only on the query-key distance).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteAttention.forward`, `eager_attention_forward`, `repeat_kv`; the all-attend 4D mask of
/// oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.decode_text`.
#[derive(Debug, Clone)]
pub struct GqaAttention {
    /// Score scale.
    pub scale: f32,
    /// Causal mask (off for the NAR LM; a fault turns it on).
    pub causal: bool,
    /// RoPE base.
    pub rope_theta: f32,
    /// Query positions minus key positions beyond the cache offset (0; non-zero only by a fault).
    pub query_pos_offset: i64,
}

impl Kernel for GqaAttention {
    fn kind(&self) -> &'static str {
        "gqa_rope_attention"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![
            port("q", Layout::HeadMajor),
            port("k", Layout::HeadMajor),
            port("v", Layout::HeadMajor),
        ]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![
            port("y", Layout::HeadMajor),
            port("probs", Layout::HeadMajor),
        ]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        for (s, n) in inputs.iter().zip(["q", "k", "v"]) {
            rank(s, 3, n)?;
        }
        let hq = fixed(&inputs[0][0], "query heads")?;
        let hk = fixed(&inputs[1][0], "key heads")?;
        let d = fixed(&inputs[0][2], "head_dim")?;
        same_dim(&inputs[1][0], &inputs[2][0], "heads of k and v")?;
        same_dim(&inputs[0][2], &inputs[1][2], "head_dim of q and k")?;
        same_dim(&inputs[1][1], &inputs[2][1], "keys of k and v")?;
        if hk == 0 || hq % hk != 0 {
            return Err(format!(
                "{hq} query heads are not a multiple of {hk} kv heads"
            ));
        }
        if d % 2 != 0 {
            return Err(format!("head_dim {d} is odd (RoPE rotates halves)"));
        }
        Ok(vec![
            vec![
                inputs[0][0].clone(),
                inputs[0][1].clone(),
                inputs[2][2].clone(),
            ],
            vec![
                inputs[0][0].clone(),
                inputs[0][1].clone(),
                inputs[1][1].clone(),
            ],
        ])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let qs = dims(inputs[0], 3, "q")?;
        let ks = dims(inputs[1], 3, "k")?;
        let vs = dims(inputs[2], 3, "v")?;
        let (hq, t, d) = (qs[0], qs[1], qs[2]);
        let (hk, s, dv) = (ks[0], ks[1], vs[2]);
        if hk == 0 || hq % hk != 0 || d % 2 != 0 || ks[2] != d || vs[0] != hk || vs[1] != s {
            return Err(format!("q {qs:?}, k {ks:?}, v {vs:?} do not fit together"));
        }
        if self.causal && s < t {
            return Err(format!(
                "causal attention with {t} queries needs at least {t} keys, got {s}"
            ));
        }
        let group = hq / hk;
        let past = s - t.min(s);
        let mut q = data(inputs[0], "q")?.to_vec();
        let mut k = data(inputs[1], "k")?.to_vec();
        // Queries sit at the last t of the s key positions.
        apply_rope(
            &mut q,
            hq,
            t,
            d,
            self.rope_theta,
            past as i64 + self.query_pos_offset,
        );
        apply_rope(&mut k, hk, s, d, self.rope_theta, 0);
        let (q, k, v) = (&q, &k, data(inputs[2], "v")?);
        let parts = par_ranges(hq, t * s * (d + dv), |heads| {
            let mut part = vec![0f32; heads.len() * t * dv];
            // Probabilities of these heads; keys past `n` stay 0 (masked).
            let mut probs = vec![0f32; heads.len() * t * s];
            let mut sc = vec![0f32; s];
            for (j, hi) in heads.enumerate() {
                let kh = hi / group;
                for ti in 0..t {
                    let qi = &q[(hi * t + ti) * d..(hi * t + ti + 1) * d];
                    let n = if self.causal { past + ti + 1 } else { s };
                    for (kj, sv) in sc[..n].iter_mut().enumerate() {
                        *sv = simd::dot(qi, &k[(kh * s + kj) * d..(kh * s + kj + 1) * d])
                            * self.scale;
                    }
                    softmax_in_place(&mut sc[..n]);
                    let o = &mut part[(j * t + ti) * dv..(j * t + ti + 1) * dv];
                    simd::weighted_sum(o, &sc[..n], |kj| {
                        &v[(kh * s + kj) * dv..(kh * s + kj + 1) * dv]
                    });
                    let at = (j * t + ti) * s;
                    probs[at..at + n].copy_from_slice(&sc[..n]);
                    if sc[0].is_nan() {
                        // torch: a NaN score row is NaN everywhere, masked keys included.
                        probs[at + n..at + s].fill(f32::NAN);
                    }
                }
            }
            (part, probs)
        });
        let (ys, ps): (Vec<Vec<f32>>, Vec<Vec<f32>>) = parts.into_iter().unzip();
        Ok(vec![
            tensor(&[hq, t, dv], ys.concat())?,
            tensor(&[hq, t, s], ps.concat())?,
        ])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "scale": self.scale, "causal": self.causal,
            "rope": {"theta": self.rope_theta, "query_pos_offset": self.query_pos_offset, "style": "rotate_half"},
        })
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        super::attention_faults!(self, fault,
            ParamFault::RopeOffset(o) => query_pos_offset: self.query_pos_offset + o)
    }
}
