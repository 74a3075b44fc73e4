//! whisper.cpp (ggml, vendored unpatched by whisper-rs-sys 0.15.0) under X-Ray: a C/C++ engine
//! with no tensor names and no public taps, instrumented the way a runtime team would
//! (docs/bring-your-own-engine.md, "C/C++ engines").
//!
//! - [`ffi`]: the link-time wrapper of `ggml_backend_sched_graph_compute` that installs ggml's
//!   scheduler eval callback, the graph snapshot, the tensor reads, the C API calls (the only
//!   unsafe code);
//! - [`graph`]: node recognition by op and shape pattern, asserted against the config;
//! - [`engine`]: whisper.cpp's own mel, encoder and decoder through its C API, greedy or
//!   teacher-forced, with a reference log-mel fed in for isolation;
//! - [`emit`]: the dump, each tensor's ggml type, the ops below f32, identities.

pub mod emit;
pub mod engine;
pub mod ffi;
pub mod graph;
