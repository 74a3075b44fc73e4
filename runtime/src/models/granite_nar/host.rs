//! Host logic between the two formulas: CTC greedy decoding (of the BPE-CTC head and of the final
//! text logits) and the insertion-slot template the LM edits.

use crate::graph::Tensor;

/// Argmax of each row of a `[N, V]` tensor (the first maximum wins, as `torch.argmax`).
/// `None` if the tensor is not 2-D, empty-width or not contiguous. NaN never wins.
pub fn row_argmax(logits: &Tensor) -> Option<Vec<usize>> {
    if logits.ndim() != 2 || logits.shape()[1] == 0 {
        return None;
    }
    let v = logits.shape()[1];
    let x = logits.as_slice()?;
    Some(
        x.chunks_exact(v)
            .map(|row| {
                let mut best = 0;
                for (i, &val) in row.iter().enumerate() {
                    if val > row[best] || (row[best].is_nan() && !val.is_nan()) {
                        best = i;
                    }
                }
                best
            })
            .collect(),
    )
}

/// Argmax per row, collapse repeats, then drop `blank` (so `a blank a` gives `a a`).
///
/// Upstream: oracle/xray_oracle/granite_nar.py `ctc_greedy_decode` (port `_ctc_greedy_decode`).
pub fn ctc_greedy_decode(logits: &Tensor, blank: usize) -> Option<Vec<usize>> {
    let am = row_argmax(logits)?;
    let mut out = Vec::new();
    let mut prev: Option<usize> = None;
    for a in am {
        if prev != Some(a) && a != blank {
            out.push(a);
        }
        prev = Some(a);
    }
    Some(out)
}

/// `blank` at every even index, the hypothesis at odd indices, length
/// `max(2 * len + 1, min_length)`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `add_insertion_slots` (port `_add_insertion_slots`).
pub fn add_insertion_slots(ids: &[i64], blank: i64, min_length: usize) -> Vec<i64> {
    let mut out = vec![blank; (2 * ids.len() + 1).max(min_length)];
    for (i, &t) in ids.iter().enumerate() {
        out[2 * i + 1] = t;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_then_drop_blank() {
        // argmax rows: 1 1 0 1 2 2 0 -> collapse 1 0 1 2 0 -> drop 0 -> 1 1 2
        let rows = [1usize, 1, 0, 1, 2, 2, 0];
        let mut t = ndarray::Array2::<f32>::zeros((rows.len(), 3));
        for (i, &r) in rows.iter().enumerate() {
            t[[i, r]] = 1.0;
        }
        assert_eq!(ctc_greedy_decode(&t.into_dyn(), 0), Some(vec![1, 1, 2]));
    }

    #[test]
    fn first_max_wins() {
        let t = ndarray::arr2(&[[0.5f32, 2.0, 2.0]]).into_dyn();
        assert_eq!(row_argmax(&t), Some(vec![1]));
    }

    #[test]
    fn slots() {
        assert_eq!(
            add_insertion_slots(&[5, 6], 9, 8),
            vec![9, 5, 9, 6, 9, 9, 9, 9]
        );
        assert_eq!(
            add_insertion_slots(&[1, 2, 3, 4], 0, 8),
            vec![0, 1, 0, 2, 0, 3, 0, 4, 0]
        );
        assert_eq!(add_insertion_slots(&[], 7, 0), vec![7]);
    }
}
