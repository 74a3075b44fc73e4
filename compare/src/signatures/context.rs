//! The [`OpContext`] the comparison pipeline can give the origin's signature from the checkpoint
//! graph and the reference tensors it already holds.

use crate::align::{Pair, PairSource};
use crate::localize::CheckpointGraph;

use super::{AxisSegment, OpContext};

/// An upstream node's index and its reference tensor.
type Upstream<'a> = (usize, ndarray::ArrayViewD<'a, f32>);

/// `enc.block.2.out` -> `enc.block.#.out`: names from one contract template share it.
fn template(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_digits = false;
    for ch in name.chars() {
        if ch.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(ch);
            in_digits = false;
        }
    }
    out
}

/// What the pipeline knows about origin node `o` of `graph` for
/// [`super::explain_with`], from the reference side of `src`:
/// - `candidates`: every other node's reference tensor of the origin's shape (`name@stepK`), for
///   `wiring`;
/// - `op_input`: the one upstream reference tensor of the origin's shape (an elementwise op's
///   input), else the one with the origin's leading axes, or the `[rows, features]` input of a
///   head-major `[heads, rows, head_dim]` origin (a linear op's input);
/// - `segments`: along an axis that is the concatenation of upstream tensors from one template (the
///   contract's `{each:...}` inputs), each part named `part i of N: NAME`;
/// - `logits`: the node's logits flag.
pub fn origin_context<'a>(
    graph: &CheckpointGraph,
    src: &'a dyn PairSource,
    o: usize,
) -> OpContext<'a> {
    let nodes = graph.nodes();
    let mut oc = OpContext::default();
    let Some(node) = nodes.get(o) else {
        return oc;
    };
    oc.logits = node.logits;
    let reference = |i: usize| match src.pair(&nodes[i].name, nodes[i].step) {
        Pair::Tensors { reference, .. } => Some(reference),
        _ => None,
    };
    let Some(origin) = reference(o) else {
        return oc;
    };
    let shape = origin.shape().to_vec();
    for i in (0..nodes.len()).filter(|&i| i != o) {
        if let Some(r) = reference(i).filter(|r| r.shape() == shape.as_slice()) {
            oc.candidates.push((nodes[i].id(), r));
        }
    }
    let ups: Vec<Upstream<'a>> = node
        .upstream
        .iter()
        .filter_map(|&u| reference(u).map(|r| (u, r)))
        .collect();
    let same: Vec<_> = ups
        .iter()
        .filter(|(_, r)| r.shape() == shape.as_slice())
        .collect();
    let rows: Vec<_> = ups
        .iter()
        .filter(|(_, r)| {
            let same_rows = r.ndim() == shape.len()
                && r.ndim() >= 2
                && r.shape()[..r.ndim() - 1] == shape[..shape.len() - 1];
            // A token-major input of a head-major output (a projection split into heads).
            let head_split = r.ndim() == 2 && shape.len() == 3 && r.shape()[0] == shape[1];
            same_rows || head_split
        })
        .collect();
    oc.op_input = match (same.as_slice(), rows.as_slice()) {
        ([one], _) | ([], [one]) => Some(one.1.clone()),
        _ => None,
    };
    // Concatenations: per axis, upstream tensors of one template filling it exactly.
    for a in 0..shape.len() {
        let mut groups: Vec<(String, Vec<&Upstream<'a>>)> = Vec::new();
        for u in &ups {
            let fits = u.1.ndim() == shape.len()
                && (0..shape.len()).all(|b| b == a || u.1.shape()[b] == shape[b]);
            if !fits {
                continue;
            }
            let t = template(&nodes[u.0].name);
            match groups.iter_mut().find(|g| g.0 == t) {
                Some(g) => g.1.push(u),
                None => groups.push((t, vec![u])),
            }
        }
        for (_, members) in groups {
            let total: usize = members.iter().map(|u| u.1.shape()[a]).sum();
            if members.len() < 2 || total != shape[a] {
                continue;
            }
            let mut start = 0;
            for (i, u) in members.iter().enumerate() {
                let len = u.1.shape()[a];
                oc.segments.push(AxisSegment {
                    axis: a,
                    start,
                    end: start + len,
                    name: format!("part {i} of {}: {}", members.len(), nodes[u.0].id()),
                });
                start += len;
            }
        }
    }
    oc
}

#[cfg(test)]
mod tests {
    use super::template;

    #[test]
    fn templates_replace_digit_runs() {
        assert_eq!(template("enc.block.12.out"), "enc.block.#.out");
        assert_eq!(
            template("audio.decoder.layer.1.cross_k"),
            "audio.decoder.layer.#.cross_k"
        );
    }
}
