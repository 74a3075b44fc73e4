//! Signatures relating the runtime tensor to other named things: `wiring` (it equals another
//! reference tensor) and the naming of `subset` indices (ranges, and the caller's segments).

use serde::{Deserialize, Serialize};

use super::{resid_within, Ctx, Signature};

/// A named index range `[start, end)` along one axis of the checkpoint (for example one input of
/// a concatenation: `cat_dim` 64..128 is `enc.block.2.out`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AxisSegment {
    /// Axis of the checkpoint's canonical shape.
    pub axis: usize,
    /// First index.
    pub start: usize,
    /// One past the last index.
    pub end: usize,
    /// What the range holds, in the contract's terms.
    pub name: String,
}

/// Sorted indices as inclusive ranges `[first, last]` (`[1, 2, 3, 7]` -> `[[1, 3], [7, 7]]`);
/// unsorted or repeated input is sorted and deduplicated first.
pub fn compress_ranges(indices: &[usize]) -> Vec<[usize; 2]> {
    let mut v = indices.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<[usize; 2]> = Vec::new();
    for i in v {
        match out.last_mut() {
            Some(r) if r[1] + 1 == i => r[1] = i,
            _ => out.push([i, i]),
        }
    }
    out
}

/// `2, 64..127` (inclusive ranges).
pub(super) fn ranges_text(ranges: &[[usize; 2]]) -> String {
    ranges
        .iter()
        .map(|[a, b]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}..{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The ranges along `axis` named by the caller's segments: a range covering a whole segment is
/// `64..127 = NAME`, a part of one is `70..79 (NAME's 6..15)`; a range outside every segment keeps
/// its plain text. Empty when no segment lies on `axis`.
pub(super) fn name_ranges(
    ranges: &[[usize; 2]],
    axis: usize,
    segments: &[AxisSegment],
) -> Vec<String> {
    let mut segs: Vec<&AxisSegment> = segments
        .iter()
        .filter(|s| s.axis == axis && s.end > s.start)
        .collect();
    if segs.is_empty() {
        return vec![];
    }
    segs.sort_by_key(|s| s.start);
    let mut out = Vec::new();
    for &[a, b] in ranges {
        let mut cur = a;
        for s in &segs {
            let (lo, hi) = (cur.max(s.start), b.min(s.end - 1));
            if lo > hi {
                continue;
            }
            if lo > cur {
                out.push(ranges_text(&[[cur, lo - 1]]));
            }
            let span = ranges_text(&[[lo, hi]]);
            if lo == s.start && hi == s.end - 1 {
                out.push(format!("{span} = {}", s.name));
            } else {
                let inner = ranges_text(&[[lo - s.start, hi - s.start]]);
                out.push(format!("{span} ({}'s {inner})", s.name));
            }
            cur = hi + 1;
        }
        if cur <= b {
            out.push(ranges_text(&[[cur, b]]));
        }
    }
    out
}

/// `X` equals one of the caller's candidate reference tensors (same shape) within the residual
/// budget: the best one.
pub(super) fn wiring(c: &Ctx) -> Option<Signature> {
    let xs = c.x.as_slice()?;
    let budget = c.budget(true);
    let mut best: Option<(f64, &str)> = None;
    for (name, cand) in &c.oc.candidates {
        if cand.shape() != c.x.shape() {
            continue;
        }
        let b = best.map_or(budget, |(s, _)| s.min(budget));
        if let Some(sq) = resid_within(cand.iter(), xs, b) {
            if best.is_none_or(|(s, _)| sq < s) {
                best = Some((sq, name));
            }
        }
    }
    best.map(|(sq, name)| Signature::Wiring {
        source: name.to_string(),
        residual: c.rel(sq),
    })
}

/// Differing slices tested against candidates (at most this many).
const MAX_SOURCE_SLICES: usize = 16;

/// For each differing slice `i` along `axis`, the candidate (same shape) whose slice `i` equals
/// `X`'s within the residual budget of that slice; empty unless every differing slice has one.
pub(super) fn slice_sources(c: &Ctx, axis: usize, idx: &[usize]) -> Vec<(usize, String)> {
    if idx.is_empty() || idx.len() > MAX_SOURCE_SLICES {
        return vec![];
    }
    let mut out = Vec::new();
    for &i in idx {
        let xs = c.x.index_axis(ndarray::Axis(axis), i);
        let xx: f64 = xs.iter().map(|v| (*v as f64).powi(2)).sum();
        let rs = c.r.index_axis(ndarray::Axis(axis), i);
        let orig: f64 = super::sumsq(xs.iter().zip(rs.iter()));
        let budget = (c.opts.explain_rel.powi(2) * xx).min(0.01 * orig);
        let hit = c.oc.candidates.iter().find(|(_, cand)| {
            cand.shape() == c.x.shape() && {
                let cs = cand.index_axis(ndarray::Axis(axis), i);
                super::sumsq(xs.iter().zip(cs.iter())) <= budget
            }
        });
        match hit {
            Some((name, _)) => out.push((i, name.clone())),
            None => return vec![],
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_compress_and_name_segments() {
        let idx: Vec<usize> = (64..128).chain([3, 1, 2, 200]).collect();
        let r = compress_ranges(&idx);
        assert_eq!(r, vec![[1, 3], [64, 127], [200, 200]]);
        assert_eq!(ranges_text(&r), "1..3, 64..127, 200");
        let segs: Vec<AxisSegment> = (0..4)
            .map(|i| AxisSegment {
                axis: 1,
                start: 64 * i,
                end: 64 * (i + 1),
                name: format!("part {i} of 4: enc.block.{}.out", 2 * i),
            })
            .collect();
        let named = name_ranges(&r, 1, &segs);
        assert_eq!(
            named,
            vec![
                "1..3 (part 0 of 4: enc.block.0.out's 1..3)",
                "64..127 = part 1 of 4: enc.block.2.out",
                "200 (part 3 of 4: enc.block.6.out's 8)",
            ]
        );
        // Another axis has no segments: nothing named.
        assert!(name_ranges(&r, 0, &segs).is_empty());
        // A range beyond the segments keeps its plain text.
        assert_eq!(
            name_ranges(&[[250, 260]], 1, &segs),
            [
                "250..255 (part 3 of 4: enc.block.6.out's 58..63)",
                "256..260"
            ]
        );
    }
}
