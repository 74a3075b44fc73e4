//! How the reference's op-level points map to the engine's layout, declared once per family in
//! the contract file's `points` section (doc: docs/checkpoint-contracts.md, "Op-level points").
//!
//! An op-level point (`{module}:{in|out}`, [`crate::ops`]) has no contract entry of its own: its
//! shape is the HF module's. Where the reference computes a module on a tensor the engine holds in
//! another form (a conformer attention pads its input to whole context blocks; a Q-Former keeps
//! its windows as an axis; a batch axis of 1), a rule says so, with the same transform vocabulary
//! the checkpoints use ([`Transform`]), so both dumps hold the point in one layout. Every point the
//! reference captures must match a rule (the first, in file order); a point no rule declares is
//! an error naming it, never a guessed layout.
//!
//! A rule's `module` is a dotted path whose segments match literally, `*` one segment and `**`
//! one or more segments: `encoder.layers.*.attn.to_q`, `projector.qformer.**` (not
//! `projector.qformer` itself), `**` (every module).

use serde::{Deserialize, Serialize};

use super::Transform;
use crate::ops::{parse_point, Side};
use crate::Layout;

/// One rule of the contract's `points` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointRule {
    /// Module path pattern (`*` one segment, `**` one or more).
    pub module: String,
    /// The sides it declares (both when absent).
    #[serde(default = "both_sides")]
    pub sides: Vec<Side>,
    /// The layout of the point once transformed (the engine's, as the checkpoints' canonical one).
    pub layout: Layout,
    /// Applied to the reference's tensor, in order (the batch axis included: a rule that keeps a
    /// batch axis of 1 says `squeeze_batch` like a checkpoint does).
    #[serde(default)]
    pub transform: Vec<Transform>,
    /// Why the rule is there (free text for the reader: the HF code it follows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The point of another module this one is the same tensor as (`model.encoder:in` is
    /// `model.encoder.conv1:in`: WhisperEncoder hands its input to conv1 unchanged). Only on a
    /// literal module with one side; the reference may record either name, an engine may emit
    /// either (`Contract::checkpoint_points`, the drill-down's module boundaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_as: Option<String>,
    /// `in` is this keyword argument of the call, not the first positional input: the tensor
    /// the module computes from (WhisperPositionalEmbedding's first input is the token ids, only
    /// counted; it looks up `position_ids`). Only on a rule declaring `in` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kwarg: Option<String>,
}

fn both_sides() -> Vec<Side> {
    vec![Side::In, Side::Out]
}

impl PointRule {
    /// Whether this rule declares point `name` (`{module}:{side}`).
    pub fn matches(&self, name: &str) -> bool {
        let Some((module, side)) = parse_point(name) else {
            return false;
        };
        self.sides.contains(&side) && glob_segments(&self.module, module)
    }

    /// A pattern's syntax ([`check_pattern`]), its sides, its `kwarg` and `same_as`.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        check_pattern(&format!("points rule '{}'", self.module), &self.module)?;
        let segs: Vec<&str> = self.module.split('.').collect();
        if self.sides.is_empty() {
            return Err(format!("points rule '{}': no sides", self.module));
        }
        if let Some(k) = &self.kwarg {
            if self.sides != [Side::In] || k.is_empty() {
                return Err(format!(
                    "points rule '{}': kwarg '{k}' needs a non-empty name and the side 'in' alone",
                    self.module
                ));
            }
        }
        if let Some(other) = &self.same_as {
            if segs.iter().any(|s| s.contains('*')) || self.sides.len() != 1 {
                return Err(format!(
                    "points rule '{}': same_as '{other}' needs a literal module and one side",
                    self.module
                ));
            }
            if parse_point(other).is_none() || self.matches(other) {
                return Err(format!(
                    "points rule '{}': same_as '{other}' is not another module's '{{module}}:in' or ':out'",
                    self.module
                ));
            }
        }
        Ok(())
    }
}

/// A module path pattern's syntax: non-empty segments, a wildcard a whole segment, `**` not
/// doubled; `what` names the rule in the error.
pub(crate) fn check_pattern(what: &str, pattern: &str) -> std::result::Result<(), String> {
    let segs: Vec<&str> = pattern.split('.').collect();
    if pattern.is_empty() || segs.iter().any(|s| s.is_empty()) {
        return Err(format!("{what}: an empty module path segment"));
    }
    if let Some(seg) = segs
        .iter()
        .find(|s| s.contains('*') && **s != "*" && **s != "**")
    {
        return Err(format!(
            "{what}: '{seg}' (a wildcard is a whole segment: '*' or '**')"
        ));
    }
    if segs.windows(2).any(|w| w[0] == "**" && w[1] == "**") {
        return Err(format!("{what}: '**.**'"));
    }
    Ok(())
}

/// `pattern` (dotted, `*` one segment, `**` one or more) against a dotted module path.
pub(crate) fn glob_segments(pattern: &str, module: &str) -> bool {
    fn go(p: &[&str], m: &[&str]) -> bool {
        match p.split_first() {
            None => m.is_empty(),
            Some((&"**", rest)) => (1..=m.len()).any(|k| go(rest, &m[k..])),
            Some((&seg, rest)) => match m.split_first() {
                Some((&first, mrest)) => (seg == "*" || seg == first) && go(rest, mrest),
                None => false,
            },
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let m: Vec<&str> = module.split('.').collect();
    go(&p, &m)
}

/// The first rule declaring `name`.
pub fn rule_for<'a>(rules: &'a [PointRule], name: &str) -> Option<&'a PointRule> {
    rules.iter().find(|r| r.matches(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(module: &str, sides: Vec<Side>) -> PointRule {
        PointRule {
            module: module.into(),
            sides,
            layout: Layout::TokenMajor,
            transform: vec![],
            why: None,
            same_as: None,
            kwarg: None,
        }
    }

    #[test]
    fn a_kwarg_is_for_the_in_side_alone() {
        let mut r = rule("model.decoder.embed_positions", vec![Side::In]);
        r.kwarg = Some("position_ids".into());
        assert!(r.check().is_ok());
        r.sides = both_sides();
        assert!(r.check().unwrap_err().contains("the side 'in' alone"));
        r.sides = vec![Side::In];
        r.kwarg = Some(String::new());
        assert!(r.check().is_err());
    }

    #[test]
    fn globs_match_segments_not_characters() {
        let r = rule("encoder.layers.*.attn.to_q", both_sides());
        assert!(r.matches("encoder.layers.3.attn.to_q:in"));
        assert!(r.matches("encoder.layers.10.attn.to_q:out"));
        assert!(!r.matches("encoder.layers.3.x.attn.to_q:in"));
        assert!(!r.matches("encoder.layers.3.attn.to_qq:in"));
        assert!(!r.matches("encoder.layers.3.attn.to_q"));
        let r = rule("projector.qformer.**", vec![Side::Out]);
        assert!(r.matches("projector.qformer.layers.0.mlp.fc1:out"));
        assert!(!r.matches("projector.qformer.layers.0.mlp.fc1:in"));
        assert!(
            !r.matches("projector.qformer:out"),
            "** is one segment or more"
        );
        let r = rule("**", both_sides());
        assert!(r.matches("proj_out:in"));
        let r = rule("**.fc1", both_sides());
        assert!(!r.matches("fc1:in") && r.matches("a.b.fc1:out") && !r.matches("a.fc1x:in"));
    }

    #[test]
    fn first_rule_wins_and_bad_patterns_are_refused() {
        let rules = vec![
            rule("a.*.q", vec![Side::In]),
            PointRule {
                layout: Layout::Plain,
                ..rule("**", both_sides())
            },
        ];
        assert_eq!(
            rule_for(&rules, "a.1.q:in").unwrap().layout,
            Layout::TokenMajor
        );
        assert_eq!(rule_for(&rules, "a.1.q:out").unwrap().layout, Layout::Plain);
        assert!(rule("a..b", both_sides()).check().is_err());
        assert!(rule("", both_sides()).check().is_err());
        assert!(rule("a.**.**", both_sides()).check().is_err());
        assert!(rule("a", vec![]).check().is_err());
        assert!(rule("a.conv*", both_sides()).check().is_err());
        assert!(rule("a.**.b", both_sides()).check().is_ok());
        let alias = |module: &str, sides, to: &str| PointRule {
            same_as: Some(to.into()),
            ..rule(module, sides)
        };
        assert!(alias("m.enc", vec![Side::In], "m.enc.conv1:in")
            .check()
            .is_ok());
        assert!(alias("m.*", vec![Side::In], "m.enc.conv1:in")
            .check()
            .is_err());
        assert!(alias("m.enc", both_sides(), "m.enc.conv1:in")
            .check()
            .is_err());
        assert!(alias("m.enc", vec![Side::In], "m.enc.conv1")
            .check()
            .is_err());
        assert!(alias("m.enc", vec![Side::In], "m.enc:in").check().is_err());
    }
}
