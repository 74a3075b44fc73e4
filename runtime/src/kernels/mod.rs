//! f32 kernels, each an implementation of [`crate::graph::Kernel`].
