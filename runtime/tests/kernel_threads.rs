//! One thread count, one pool, no process-environment writes: loading and running a model with
//! `XRAY_THREADS` set leaves the environment as it was (no `MATMUL_NUM_THREADS` written behind
//! the caller's back, which is unsound once threads exist), and `set_threads` fixes the count
//! before the first run or refuses a different one afterwards. Its own test binary: the count is
//! per process.

mod whisper_support;

use whisper_support::fixture;
use xray_runtime::kernels::{set_threads, threads};
use xray_runtime::models::whisper::WhisperModel;
use xray_runtime::models::{RunHooks, RunOptions, SpeechModel};

#[test]
fn threads_come_from_one_place_and_the_environment_is_left_alone() {
    let Some(dir) = fixture("fixtures/build/whisper-rand-a") else {
        return;
    };
    // Before any other thread of this process reads the environment.
    std::env::set_var("XRAY_THREADS", "2");
    std::env::remove_var("MATMUL_NUM_THREADS");
    let model = WhisperModel::load(&dir).expect("load rand-a");
    let audio = xray_runtime::audio::load_wav(
        &whisper_support::repo().join("fixtures/audio/fox.wav"),
        16000,
    )
    .expect("fox.wav");
    model
        .run(&audio, &RunOptions::capped(2), &mut RunHooks::default())
        .expect("run");
    assert_eq!(threads(), 2);
    assert!(
        std::env::var_os("MATMUL_NUM_THREADS").is_none(),
        "the runtime wrote MATMUL_NUM_THREADS into the process environment"
    );
    assert!(set_threads(2).is_ok(), "the count in use is accepted");
    let e = set_threads(3).expect_err("a different count after the first run");
    assert!(e.contains("already run with 2"), "{e}");
    assert!(set_threads(0).is_err());
}
