//! Which op-level points feed and leave an attention module's core, declared once per family in
//! the contract file's `attention` section (doc: docs/checkpoint-contracts.md, "Attention cores").
//!
//! An attention core (scores, mask, relative positions, softmax, the weighted sum of values) has
//! no module of its own in the reference: it runs inline in the attention module's `forward`,
//! between the projections. The reference replay re-runs it from the engine's own projection
//! outputs, so it must know which points those are, and which point is the core's output: Whisper
//! names them `q_proj`, `k_proj`, `v_proj` and `out_proj`; Granite's conformer computes keys and
//! values in one projection (`to_kv`, keys first) and names the output `to_out`. A rule says so,
//! for every module its pattern matches; nothing is guessed from a name.
//!
//! ```json
//! {"module": "encoder.layers.*.attn",
//!  "queries": {"point": "to_q:out"},
//!  "keys": {"point": "to_kv:out", "chunk": [0, 2]},
//!  "values": {"point": "to_kv:out", "chunk": [1, 2]},
//!  "output": "to_out:in"}
//! ```

use serde::{Deserialize, Serialize};

use super::points::{check_pattern, glob_segments};
use crate::ops::parse_point;

/// One operand of an attention core: a point of one of the module's sub-modules, or one chunk of
/// it along its last axis (a fused projection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operand {
    /// The point, relative to the attention module (`q_proj:out`).
    pub point: String,
    /// `[index, count]`: the index-th of `count` equal chunks along the last axis
    /// (`torch.chunk(count, dim=-1)[index]`); the whole point when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<[usize; 2]>,
}

/// One rule of the contract's `attention` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionRule {
    /// Attention module path pattern (`*` one segment, `**` one or more).
    pub module: String,
    /// The queries.
    pub queries: Operand,
    /// The keys.
    pub keys: Operand,
    /// The values.
    pub values: Operand,
    /// The core's output, relative to the module (`out_proj:in`).
    pub output: String,
    /// Why (free text for the reader: the HF code it follows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl AttentionRule {
    /// The three operands in order: queries, keys, values.
    pub fn operands(&self) -> [&Operand; 3] {
        [&self.queries, &self.keys, &self.values]
    }

    /// The attention module whose core outputs point `name`, when this rule declares it.
    pub fn module_of<'n>(&self, name: &'n str) -> Option<&'n str> {
        let parent = name.strip_suffix(self.output.as_str())?.strip_suffix('.')?;
        glob_segments(&self.module, parent).then_some(parent)
    }

    /// A pattern's syntax; every point relative (`sub.module:side`); chunks in range.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        let what = format!("attention rule '{}'", self.module);
        check_pattern(&what, &self.module)?;
        let relative = |p: &str| {
            parse_point(p)
                .filter(|(m, _)| {
                    !m.is_empty() && !m.split('.').any(|s| s.is_empty() || s.contains('*'))
                })
                .is_some()
        };
        for (role, o) in ["queries", "keys", "values"].iter().zip(self.operands()) {
            if !relative(&o.point) {
                return Err(format!(
                    "{what}: {role} '{}' is not a sub-module's point ('q_proj:out')",
                    o.point
                ));
            }
            if let Some([i, n]) = o.chunk {
                if n < 2 || i >= n {
                    return Err(format!(
                        "{what}: {role} chunk [{i}, {n}] is not one of two or more chunks"
                    ));
                }
            }
        }
        if !relative(&self.output) {
            return Err(format!(
                "{what}: output '{}' is not a sub-module's point ('out_proj:in')",
                self.output
            ));
        }
        Ok(())
    }
}

/// The rule and attention module whose core outputs point `name` (the first rule that does).
pub fn core_of<'a, 'n>(
    rules: &'a [AttentionRule],
    name: &'n str,
) -> Option<(&'a AttentionRule, &'n str)> {
    rules.iter().find_map(|r| r.module_of(name).map(|m| (r, m)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(point: &str, chunk: Option<[usize; 2]>) -> Operand {
        Operand {
            point: point.into(),
            chunk,
        }
    }

    fn conformer() -> AttentionRule {
        AttentionRule {
            module: "encoder.layers.*.attn".into(),
            queries: op("to_q:out", None),
            keys: op("to_kv:out", Some([0, 2])),
            values: op("to_kv:out", Some([1, 2])),
            output: "to_out:in".into(),
            why: None,
        }
    }

    #[test]
    fn the_core_is_found_by_its_declared_output_point() {
        let rules = vec![
            conformer(),
            AttentionRule {
                module: "model.**.self_attn".into(),
                queries: op("q_proj:out", None),
                keys: op("k_proj:out", None),
                values: op("v_proj:out", None),
                output: "out_proj:in".into(),
                why: None,
            },
        ];
        let (r, m) = core_of(&rules, "encoder.layers.3.attn.to_out:in").unwrap();
        assert_eq!(
            (r.module.as_str(), m),
            ("encoder.layers.*.attn", "encoder.layers.3.attn")
        );
        let (_, m) = core_of(&rules, "model.decoder.layers.1.self_attn.out_proj:in").unwrap();
        assert_eq!(m, "model.decoder.layers.1.self_attn");
        // Another side, another sub-module, a module the pattern does not match: no core.
        for p in [
            "encoder.layers.3.attn.to_out:out",
            "encoder.layers.3.attn.to_q:out",
            "encoder.layers.3.ff.to_out:in",
            "model.decoder.layers.1.encoder_attn.out_proj:in",
            "encoder.layers.3.attnto_out:in",
        ] {
            assert!(core_of(&rules, p).is_none(), "{p}");
        }
    }

    #[test]
    fn bad_rules_are_refused_naming_the_field() {
        assert!(conformer().check().is_ok());
        let mut r = conformer();
        r.keys.chunk = Some([2, 2]);
        assert!(r.check().unwrap_err().contains("keys chunk [2, 2]"));
        let mut r = conformer();
        r.values.chunk = Some([0, 1]);
        assert!(r.check().unwrap_err().contains("values chunk"));
        let mut r = conformer();
        r.queries.point = "to_q".into();
        assert!(r.check().unwrap_err().contains("queries 'to_q'"));
        let mut r = conformer();
        r.output = "*.to_out:in".into();
        assert!(r.check().unwrap_err().contains("output"));
        let mut r = conformer();
        r.module = "encoder.layers.a*.attn".into();
        assert!(r.check().is_err());
    }
}
