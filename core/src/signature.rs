//! The kinds of difference X-Ray recognises (a signature's name in the evidence), shared by the
//! comparison library, which names them, and the fault catalogues, which expect them: a typo in
//! either does not compile.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A signature kind: `Explanation.signature` in the evidence (snake_case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignatureKind {
    /// Non-finite values where the reference is finite.
    NonFinite,
    /// An axis permutation or reinterpretation of the same elements.
    Permutation,
    /// Off by one along an axis, or integer values off by a constant.
    Shift,
    /// `X = -R`.
    SignFlip,
    /// A constant scale.
    Scale,
    /// A masked (or unmasked) region.
    Mask,
    /// Rounding to a lower precision.
    Rounding,
    /// Only a subset (of heads, channels, steps) differs.
    Subset,
    /// Read backwards along one axis.
    Reversed,
    /// Another tensor's values (a wiring candidate).
    Wiring,
    /// State carried across steps (a decoder's cache) changed between them: the rows a step
    /// reads back are not what the previous step wrote.
    Carried,
    /// Logits at another softmax temperature.
    Temperature,
    /// A per-row affine map.
    RowAffine,
    /// One affine map above both sides' floors (a log of another base before a clamp).
    Affine,
    /// One offset per slice along an axis (a per-channel bias, or gain before a log).
    ChannelOffset,
    /// Values clamped.
    Clamp,
    /// Another element-wise function.
    Elementwise,
    /// Weights on a quantization grid.
    GridQuantization,
    /// A layout the contract declares no transform for.
    Layout,
    /// Shapes that do not align.
    Shape,
    /// A checkpoint missing on one side.
    Missing,
    /// Logits the engine processed (suppressed ids) where the reference's are raw.
    LogitsProcessed,
    /// The token streams part (the origin is where they part).
    Tokens,
    /// Capture changed the runtime's outputs (the observers are not neutral).
    Capture,
    /// No known pattern: a diffuse difference.
    None,
}

impl SignatureKind {
    /// Every kind.
    pub const ALL: [SignatureKind; 25] = [
        SignatureKind::NonFinite,
        SignatureKind::Permutation,
        SignatureKind::Shift,
        SignatureKind::SignFlip,
        SignatureKind::Scale,
        SignatureKind::Mask,
        SignatureKind::Rounding,
        SignatureKind::Subset,
        SignatureKind::Reversed,
        SignatureKind::Wiring,
        SignatureKind::Carried,
        SignatureKind::Temperature,
        SignatureKind::RowAffine,
        SignatureKind::Affine,
        SignatureKind::ChannelOffset,
        SignatureKind::Clamp,
        SignatureKind::Elementwise,
        SignatureKind::GridQuantization,
        SignatureKind::Layout,
        SignatureKind::Shape,
        SignatureKind::Missing,
        SignatureKind::LogitsProcessed,
        SignatureKind::Tokens,
        SignatureKind::Capture,
        SignatureKind::None,
    ];

    /// The evidence's name.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureKind::NonFinite => "non_finite",
            SignatureKind::Permutation => "permutation",
            SignatureKind::Shift => "shift",
            SignatureKind::SignFlip => "sign_flip",
            SignatureKind::Scale => "scale",
            SignatureKind::Mask => "mask",
            SignatureKind::Rounding => "rounding",
            SignatureKind::Subset => "subset",
            SignatureKind::Reversed => "reversed",
            SignatureKind::Wiring => "wiring",
            SignatureKind::Carried => "carried",
            SignatureKind::Temperature => "temperature",
            SignatureKind::RowAffine => "row_affine",
            SignatureKind::Affine => "affine",
            SignatureKind::ChannelOffset => "channel_offset",
            SignatureKind::Clamp => "clamp",
            SignatureKind::Elementwise => "elementwise",
            SignatureKind::GridQuantization => "grid_quantization",
            SignatureKind::Layout => "layout",
            SignatureKind::Shape => "shape",
            SignatureKind::Missing => "missing",
            SignatureKind::LogitsProcessed => "logits_processed",
            SignatureKind::Tokens => "tokens",
            SignatureKind::Capture => "capture",
            SignatureKind::None => "none",
        }
    }
}

impl fmt::Display for SignatureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SignatureKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        SignatureKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("'{s}' is not a signature kind"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_serde_s_and_read_back() {
        for k in SignatureKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(k.as_str().parse::<SignatureKind>().unwrap(), k);
        }
        assert!("offset".parse::<SignatureKind>().is_err());
    }

    #[test]
    fn the_evidence_schema_lists_exactly_these_kinds() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/evidence.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut listed: Vec<&str> = schema["$defs"]["explanation"]["properties"]["signature"]
            ["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut kinds: Vec<&str> = SignatureKind::ALL.iter().map(|k| k.as_str()).collect();
        listed.sort_unstable();
        kinds.sort_unstable();
        assert_eq!(listed, kinds, "docs/evidence.schema.json's signature enum");
    }
}
