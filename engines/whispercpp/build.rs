//! Links the eval-callback wrapper: every call whisper.cpp makes to
//! `ggml_backend_sched_graph_compute` goes to this crate's `__wrap_ggml_backend_sched_graph_compute`
//! (src/ffi.rs), which installs ggml's scheduler eval callback and calls `__real_...`. whisper.cpp
//! stays unpatched: the linker redirects the undefined reference in its object files.
//!
//! Also records the vendored whisper.cpp version (whisper-rs-sys's `links = "whisper"` metadata)
//! for the dump's `tools`.

fn main() {
    // Every target of this package (bin, tests) links libwhisper.a through the lib, whose ffi
    // module references `__real_ggml_backend_sched_graph_compute`: all of them need the wrap.
    println!("cargo:rustc-link-arg=-Wl,--wrap=ggml_backend_sched_graph_compute");
    let v = std::env::var("DEP_WHISPER_WHISPER_CPP_VERSION").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=XRAY_WHISPER_CPP_VERSION={v}");
    println!("cargo:rerun-if-env-changed=DEP_WHISPER_WHISPER_CPP_VERSION");
}
