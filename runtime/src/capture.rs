//! Capture: a run hands each checkpoint tensor to an [`Observer`] as it is produced. Observing
//! never changes what is computed (capture neutrality is tested). Isolation hands reference
//! tensors back through [`Substitute`], which the graph applies before consumers run: an input
//! override, not a special path.

use ndarray::ArrayViewD;

use crate::graph::{Layout, Tensor};

/// Receives checkpoint tensors during a run.
pub trait Observer {
    /// Whether this checkpoint at this step should be handed over (`--only GLOB`).
    fn wants(&self, _name: &str, _step: usize) -> bool {
        true
    }
    /// One checkpoint tensor, as produced.
    fn observe(&mut self, name: &str, step: usize, layout: Layout, data: ArrayViewD<'_, f32>);
}

/// Supplies a tensor to use instead of the computed one at a checkpoint edge.
pub trait Substitute {
    /// The replacement for `name@step`, if any.
    fn substitute(&self, name: &str, step: usize) -> Option<Tensor>;
}

/// One captured checkpoint.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Canonical checkpoint name.
    pub name: String,
    /// Decode step.
    pub step: usize,
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
        })
    }
}

impl Observer for Recorder {
    fn wants(&self, name: &str, _step: usize) -> bool {
        self.filter.as_ref().is_none_or(|f| f.is_match(name))
    }

    fn observe(&mut self, name: &str, step: usize, layout: Layout, data: ArrayViewD<'_, f32>) {
        self.captured.push(Captured {
            name: name.to_string(),
            step,
            layout,
            data: data.to_owned(),
        });
    }
}
