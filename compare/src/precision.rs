//! Declared precision: the ops an engine says it computed below f32 (its manifest's
//! `extra.precision`, `docs/dump-format.md`), and what a policy's `accept_precision` made of them.
//!
//! An engine that rounds some tensors (whisper.cpp computes its convolutions, GELU table,
//! attention K/V and caches in f16 even on an f32 model) declares each such op once, by the
//! contract's op name. X-Ray names them in every comparison; a policy that accepts the precision
//! judges every checkpoint and op-level point downstream of a declared op (along the graph's
//! edges, which the caller follows) at the accepted bounds, and everything else at f32's, so a
//! departure that is not downstream of reduced precision, or that exceeds its bounds, still
//! fails and is localized (see `docs/tolerances.md`, "Declared precision").

use serde::{Deserialize, Serialize};
use xray_core::dump::Dump;

use crate::tolerance::{Policy, Precision};
use crate::Error;

use xray_core::dump::PRECISION_KEY as KEY;

/// One op the engine declares it computed below f32.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeclaredOp {
    /// The op (the contract's / X-Ray's runtime graph's op name, e.g. `encoder.conv1`).
    pub op: String,
    /// The precision it computed at (`f16`, `bf16`).
    pub dtype: Precision,
    /// Why, as the engine says (e.g. the function of its source that rounds).
    pub why: String,
}

/// What the comparison did with the declared precision (`evidence.precision`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrecisionEvidence {
    /// The ops the dump under test declares computed below f32, in its order.
    pub declared: Vec<DeclaredOp>,
    /// The precisions the policy accepts (`accept_precision`'s keys); empty: none.
    pub accepted: Vec<Precision>,
    /// How many checkpoint and op-level point names are downstream of an accepted declared op,
    /// so judged at the accepted bounds (their `tolerance.source` is `precision:<dtype> via
    /// <op>`).
    pub names_at_accepted_bounds: usize,
}

impl PrecisionEvidence {
    /// One console line: the ops named, and what the policy accepted.
    pub fn summary(&self) -> String {
        let mut by: Vec<(Precision, Vec<&str>)> = Vec::new();
        for d in &self.declared {
            match by.iter_mut().find(|(t, _)| *t == d.dtype) {
                Some((_, v)) => v.push(&d.op),
                None => by.push((d.dtype, vec![&d.op])),
            }
        }
        let list = by
            .iter()
            .map(|(t, ops)| {
                let shown: Vec<&str> = ops.iter().take(6).copied().collect();
                format!(
                    "{} {} op(s): {}{}",
                    ops.len(),
                    t.as_str(),
                    shown.join(", "),
                    if ops.len() > shown.len() { ", ..." } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let what = if self.accepted.is_empty() {
            "judged at f32 bounds (a policy's accept_precision accepts a declared precision)"
                .to_string()
        } else {
            format!(
                "the policy accepts {}: {} checkpoint and point names downstream of them judged at its bounds, the rest at f32's",
                self.accepted
                    .iter()
                    .map(|d| d.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.names_at_accepted_bounds
            )
        };
        format!("precision: the engine declares {list} computed below f32; {what}")
    }
}

/// The ops `d` declares computed below f32 (empty when its manifest declares none). A malformed
/// declaration is an error naming the dump and the entry: a precision that cannot be read is
/// never taken as none.
pub fn declared(d: &Dump) -> Result<Vec<DeclaredOp>, Error> {
    let Some(v) = d.manifest.extra.get(KEY) else {
        return Ok(vec![]);
    };
    let bad = |why: String| Error::Manifest {
        dump: d.dir.display().to_string(),
        reason: format!("extra.{KEY} {why} (docs/dump-format.md, \"Declared precision\")"),
    };
    let list = v
        .as_array()
        .ok_or_else(|| bad("is not a list of {op, dtype, why}".into()))?;
    let mut out: Vec<DeclaredOp> = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let field = |k: &str| {
            e.get(k)
                .and_then(|x| x.as_str())
                .ok_or_else(|| bad(format!("[{i}] has no string \"{k}\"")))
        };
        let op = field("op")?.to_string();
        let dtype = field("dtype")?;
        let dtype = Precision::parse(dtype)
            .filter(|t| matches!(t, Precision::F16 | Precision::Bf16))
            .ok_or_else(|| {
                bad(format!(
                    "[{i}] ({op}) declares dtype {dtype:?}: a precision below f32 is f16 or bf16"
                ))
            })?;
        let why = field("why")?.to_string();
        if out.iter().any(|o| o.op == op) {
            return Err(bad(format!("[{i}] declares {op} twice")));
        }
        out.push(DeclaredOp { op, dtype, why });
    }
    Ok(out)
}

/// `policy` with the precision `got` declares (`ops`, from [`declared`]) applied, and the
/// evidence (`None` when it declares nothing). `reached` is what the declared ops reach along
/// the model's graph ([`apply`]); without it (no model at hand) the ops are named and nothing is
/// accepted, and a policy that accepts a precision is refused: it could not say what to accept.
pub fn declare(
    policy: Policy,
    got: &Dump,
    ops: Vec<DeclaredOp>,
    reached: Option<Vec<(String, String)>>,
) -> Result<(Policy, Option<PrecisionEvidence>), Error> {
    if ops.is_empty() {
        return Ok((policy, None));
    }
    let reached = match reached {
        Some(r) => r,
        None if !policy.spec().accept_precision.is_empty() => {
            return Err(Error::Manifest {
                dump: got.dir.display().to_string(),
                reason: format!(
                    "the policy accepts a declared precision (accept_precision) and this dump declares {} op(s) computed below f32: pass --model DIR, whose graph says which checkpoints each declared op reaches",
                    ops.len()
                ),
            })
        }
        None => vec![],
    };
    let (policy, ev) = apply(policy, ops, reached);
    Ok((policy, Some(ev)))
}

/// `policy` with the declared precision applied: `reached` lists, for each checkpoint and
/// op-level point name downstream of a declared op, that op (the caller follows the graph).
/// Returns the policy and the evidence.
pub fn apply(
    policy: Policy,
    declared: Vec<DeclaredOp>,
    reached: Vec<(String, String)>,
) -> (Policy, PrecisionEvidence) {
    let dtype_of = |op: &str| declared.iter().find(|d| d.op == op).map(|d| d.dtype);
    let named: Vec<(String, (Precision, String))> = reached
        .into_iter()
        .filter_map(|(name, op)| dtype_of(&op).map(|t| (name, (t, op))))
        .collect();
    let accepted: Vec<Precision> = policy.spec().accept_precision.keys().copied().collect();
    let policy = policy.with_declared_precision(named);
    let ev = PrecisionEvidence {
        declared,
        accepted,
        names_at_accepted_bounds: policy.declared_count(),
    };
    (policy, ev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tolerance::ToleranceSource;

    const POLICY: &str = r#"{"schema": "xray.policy/v1",
      "rules": [{"match": "b.logits", "max_kl": 1.0}],
      "accept_precision": {"f16": {"default": {"atol": 1e-2, "rtol": 1e-2, "max_outlier_fraction": 1e-2, "max_rel_l2": 1e-2},
                                    "logits": {"atol": 1e-1, "rtol": 1e-1, "max_outlier_fraction": 1e-2, "max_rel_l2": 3e-2}}}}"#;

    fn op(name: &str, t: Precision) -> DeclaredOp {
        DeclaredOp {
            op: name.into(),
            dtype: t,
            why: "test".into(),
        }
    }

    #[test]
    fn only_names_downstream_of_an_accepted_declared_op_get_its_bounds() {
        let p = Policy::from_json(POLICY).unwrap();
        let (p, ev) = apply(
            p,
            vec![
                op("enc.conv1", Precision::F16),
                op("dec.x", Precision::Bf16),
            ],
            vec![
                ("a.out".into(), "enc.conv1".into()),
                ("a.logits".into(), "enc.conv1".into()),
                ("b.logits".into(), "enc.conv1".into()),
                ("c.out".into(), "dec.x".into()),
                ("d.out".into(), "not.declared".into()),
            ],
        );
        // a.out, a.logits and b.logits: f16 is accepted; c.out is bf16 (not accepted); d.out's op
        // is not declared.
        assert_eq!(ev.names_at_accepted_bounds, 3);
        let r = p.resolve_kind("a.out", 0, Precision::F32, None, false);
        assert_eq!(r.tolerance.max_rel_l2, Some(1e-2));
        assert_eq!(
            r.source,
            ToleranceSource::Precision {
                dtype: Precision::F16,
                op: "enc.conv1".into()
            }
        );
        assert_eq!(r.source.to_string(), "precision:f16 via enc.conv1");
        let l = p.resolve_kind("a.logits", 3, Precision::F32, None, true);
        assert_eq!(l.tolerance.max_rel_l2, Some(3e-2));
        // An explicit rule still comes first.
        let b = p.resolve_kind("b.logits", 0, Precision::F32, None, true);
        assert_eq!(b.source, ToleranceSource::Policy("b.logits".into()));
        for n in ["c.out", "d.out", "e.out"] {
            let r = p.resolve_kind(n, 0, Precision::F32, None, false);
            assert_eq!(r.source, ToleranceSource::Default(Precision::F32), "{n}");
        }
        assert!(ev
            .summary()
            .contains("1 f16 op(s): enc.conv1; 1 bf16 op(s): dec.x"));
        assert!(ev.summary().contains("the policy accepts f16: 3 "));
    }

    #[test]
    fn an_accepted_f32_or_a_bad_bound_is_refused() {
        for (text, needle) in [
            (
                r#"{"accept_precision": {"f32": {"default": {"atol": 1, "rtol": 1, "max_outlier_fraction": 0}}}}"#,
                "only a precision below f32",
            ),
            (
                r#"{"accept_precision": {"f16": {"default": {"atol": -1, "rtol": 1, "max_outlier_fraction": 0}}}}"#,
                "accept_precision.f16.default",
            ),
            (
                r#"{"accept_precision": {"f16": {"default": {"atol": 1, "rtol": 1, "max_outlier_fraction": 0}, "logitz": {}}}}"#,
                "logitz",
            ),
        ] {
            let e = Policy::from_json(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle:?} not in {e}");
        }
        // accept_precision alone is a policy that sets something.
        let p = Policy::from_json(
            r#"{"accept_precision": {"bf16": {"default": {"atol": 1, "rtol": 1, "max_outlier_fraction": 0}}}}"#,
        )
        .unwrap();
        assert_eq!(p.spec().accept_precision.len(), 1);
    }

    #[test]
    fn a_policy_without_accept_precision_hashes_as_before() {
        // `xray check --resume` keeps evidence by the policy's sha256: an absent
        // accept_precision must not change it.
        let p = Policy::from_json(r#"{"rules": [{"match": "x", "atol": 1}]}"#).unwrap();
        let text = serde_json::to_string(p.spec()).unwrap();
        assert!(!text.contains("accept_precision"), "{text}");
    }
}
