//! Capture: a run hands each checkpoint tensor to an [`Observer`] as it is produced. Observing
//! never changes what is computed (capture neutrality is tested). Isolation hands reference
//! tensors back through [`Substitute`], which the graph applies before consumers run: an input
//! override, not a special path.

use crate::Step;
use ndarray::ArrayViewD;

use crate::{Layout, Tensor};

/// Receives checkpoint tensors during a run. `Send`: a formula runs on the kernels' worker pool.
pub trait Observer: Send {
    /// Whether this checkpoint at this step should be handed over (`--only GLOB`).
    fn wants(&self, _name: &str, _step: Step) -> bool {
        true
    }
    /// One checkpoint tensor, as produced.
    fn observe(&mut self, name: &str, step: Step, layout: Layout, data: ArrayViewD<'_, f32>);
}

/// Supplies a tensor to use instead of the computed one at a checkpoint edge. `Sync`: a formula
/// runs on the kernels' worker pool.
pub trait Substitute: Sync {
    /// The replacement for `name@step`, if any.
    fn substitute(&self, name: &str, step: Step) -> Option<Tensor>;
}

/// One captured checkpoint.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Canonical checkpoint name.
    pub name: String,
    /// Decode step.
    pub step: Step,
    /// Physical layout.
    pub layout: Layout,
    /// The tensor.
    pub data: Tensor,
}

/// An observer that keeps every tensor it is handed, optionally filtered by glob.
#[derive(Debug, Default)]
pub struct Recorder {
    filter: Option<globset::GlobSet>,
    /// What was captured, in production order.
    pub captured: Vec<Captured>,
    pool: Vec<Tensor>,
}

impl Recorder {
    /// Record everything.
    pub fn new() -> Self {
        Recorder::default()
    }

    /// Record only checkpoints whose name matches one of the globs.
    pub fn only(globs: &[String]) -> Result<Self, globset::Error> {
        let mut b = globset::GlobSetBuilder::new();
        for g in globs {
            b.add(globset::Glob::new(g)?);
        }
        Ok(Recorder {
            filter: Some(b.build()?),
            captured: Vec::new(),
            pool: Vec::new(),
        })
    }

    /// Forget what was captured but keep its buffers for the next run (a long-lived capture
    /// session copies into memory it already owns instead of allocating and faulting in fresh
    /// pages every run).
    pub fn reset(&mut self) {
        self.pool.extend(self.captured.drain(..).map(|c| c.data));
    }
}

impl Observer for Recorder {
    fn wants(&self, name: &str, _step: Step) -> bool {
        self.filter.as_ref().is_none_or(|f| f.is_match(name))
    }

    fn observe(&mut self, name: &str, step: Step, layout: Layout, data: ArrayViewD<'_, f32>) {
        let data = match self.pool.iter().position(|t| t.shape() == data.shape()) {
            Some(i) => {
                let mut t = self.pool.swap_remove(i);
                t.assign(&data);
                t
            }
            None => data.to_owned(),
        };
        self.captured.push(Captured {
            name: name.to_string(),
            step,
            layout,
            data,
        });
    }
}

/// An observer that keeps only per-checkpoint statistics and a content hash (stats-only dumps for
/// models too large to hold every tensor): each tensor is summarized as it is produced and
/// dropped.
#[derive(Debug, Default)]
pub struct StatsRecorder {
    filter: Option<globset::GlobSet>,
    /// Entries in production order (`stats` and `content_sha256` set, no file).
    pub entries: Vec<crate::dump::Entry>,
}

impl StatsRecorder {
    /// Summarize everything, or only names matching the globs.
    pub fn new(globs: &[String]) -> Result<Self, globset::Error> {
        let filter = if globs.is_empty() {
            None
        } else {
            let mut b = globset::GlobSetBuilder::new();
            for g in globs {
                b.add(globset::Glob::new(g)?);
            }
            Some(b.build()?)
        };
        Ok(StatsRecorder {
            filter,
            entries: Vec::new(),
        })
    }
}

impl Observer for StatsRecorder {
    fn wants(&self, name: &str, _step: Step) -> bool {
        self.filter.as_ref().is_none_or(|f| f.is_match(name))
    }

    fn observe(&mut self, name: &str, step: Step, layout: Layout, data: ArrayViewD<'_, f32>) {
        let std = data.as_standard_layout();
        let slice = std.as_slice().unwrap_or(&[]);
        self.entries.push(crate::dump::Entry {
            name: name.to_string(),
            step,
            shape: data.shape().to_vec(),
            dtype: crate::dump::Dtype::F32,
            layout,
            file: None,
            sha256: None,
            stats: Some(crate::dump::Stats::of(slice)),
            content_sha256: Some(crate::dump::content_sha256(slice)),
            token_positions: None,
            logits_processed: None,
        });
    }
}
