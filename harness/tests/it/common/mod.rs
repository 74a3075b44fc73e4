//! Shared fixtures for the integration tests: a Whisper-shaped graph from the real contract with
//! small synthetic tensors, a tiny hand-made decoder graph, and the snapshot helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use serde_json::Value;
use xray_compare::align::MemorySource;
use xray_compare::compare::{compare_graph, CompareOptions};
use xray_compare::evidence::{Evidence, OracleVersions, Run, Transcript};
use xray_compare::localize::{build_graph, CheckpointGraph, CheckpointSpec, StepRef, Steps};
use xray_core::contract::Contract;

/// The Whisper contract resolved for a tiny.en-like geometry with the given layer counts.
pub fn whisper_contract(enc: u32, dec: u32) -> Contract {
    let cfg = serde_json::json!({
        "num_mel_bins": 80, "max_source_positions": 1500, "d_model": 384,
        "decoder_attention_heads": 6, "vocab_size": 51864,
        "encoder_layers": enc, "decoder_layers": dec
    });
    Contract::for_family("whisper", &cfg).expect("whisper contract")
}

/// Whisper graph with the given layer counts over `steps`, from the real contract.
pub fn whisper_graph(enc: u32, dec: u32, steps: &[usize]) -> CheckpointGraph {
    build_graph(&whisper_contract(enc, dec).checkpoints, steps).expect("graph")
}

/// A spec with only what the checkpoint graph reads (for small synthetic graphs).
pub fn spec(
    name: &str,
    steps: Steps,
    inputs: Vec<(&str, StepRef)>,
    logits: bool,
) -> CheckpointSpec {
    CheckpointSpec {
        kind: logits.then(|| "logits".to_string()),
        ..CheckpointSpec::bare(name, steps, inputs)
    }
}

/// Deterministic smooth-ish tensor.
pub fn tensor(shape: &[usize], seed: f32) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| ((i as f32 + 1.0) * (0.37 + seed * 0.013)).sin() * (1.0 + seed * 0.01))
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).expect("shape")
}

fn shape_for(name: &str, step: usize, logits: bool) -> (Vec<usize>, xray_core::Layout) {
    let tokens = if step == 0 { 3 } else { 1 };
    if logits {
        (vec![tokens, 10], xray_core::Layout::TokenMajor)
    } else if name.contains("frontend") || name.contains("conv") {
        (vec![8, 6], xray_core::Layout::ChannelMajor)
    } else if name.ends_with("cross_k") || name.ends_with("cross_v") {
        (vec![2, 6, 4], xray_core::Layout::HeadMajor)
    } else if name.contains("cross_attention.output") {
        (vec![2, tokens, 4], xray_core::Layout::HeadMajor)
    } else if name.starts_with("audio.encoder") {
        (vec![6, 8], xray_core::Layout::TokenMajor)
    } else {
        (vec![tokens, 8], xray_core::Layout::TokenMajor)
    }
}

/// Pairs for every node of `g`; with `fault`, layer 1's cross K is stored token-major where the
/// consumer reads head-major, and everything downstream of it drifts.
pub fn whisper_source(g: &CheckpointGraph, fault: bool) -> MemorySource {
    let nodes = g.nodes();
    let bad_root = g.find("audio.decoder.layer.1.cross_k", 0);
    let mut downstream = vec![false; nodes.len()];
    if let (true, Some(r)) = (fault, bad_root) {
        downstream[r] = true;
        for i in 0..nodes.len() {
            if nodes[i].upstream.iter().any(|&u| downstream[u]) {
                downstream[i] = true;
            }
        }
    }
    let mut src = MemorySource::default();
    for (i, n) in nodes.iter().enumerate() {
        let (shape, layout) = shape_for(&n.name, n.step, n.logits);
        let r = tensor(&shape, i as f32);
        let mut x = r.mapv(|v| v * (1.0 + 1e-7));
        if downstream[i] {
            if Some(i) == bad_root {
                let tm: Vec<f32> = r
                    .view()
                    .permuted_axes(IxDyn(&[1, 0, 2]))
                    .iter()
                    .copied()
                    .collect();
                x = ArrayD::from_shape_vec(IxDyn(&shape), tm).expect("shape");
            } else if n.logits && n.step == 1 {
                x = r.clone();
                x[[0, 0]] += 10.0;
            } else {
                x = &r + &(tensor(&shape, 100.0 + i as f32) * 0.05f32);
            }
        }
        src.insert(&n.name, n.step, layout, r, x);
    }
    src
}

/// Run information with volatile fields (redacted in snapshots).
pub fn run_info() -> Run {
    Run {
        family: "whisper".into(),
        model_path: VOLATILE_MODEL_PATH.into(),
        weights_sha256: Some("ab".repeat(32)),
        audio_sha256: Some("cd".repeat(32)),
        runtime_version: "xray-runtime 0.1.0".into(),
        oracle: Some(OracleVersions {
            python: Some("3.11.7".into()),
            torch: Some("2.11.0".into()),
            transformers: Some("5.24.0".into()),
        }),
        isolated: false,
        stats_only: false,
        contract_sha256: Some("ef".repeat(32)),
        ..Default::default()
    }
}

/// Evidence of the Whisper-shaped run (1 encoder layer, 2 decoder layers, steps 0..=2).
pub fn whisper_evidence(fault: bool) -> Evidence {
    let g = whisper_graph(1, 2, &[0, 1, 2]);
    let src = whisper_source(&g, fault);
    let c = compare_graph(&g, &src, &CompareOptions::default()).expect("compare");
    let transcript = Transcript {
        runtime: if fault {
            " The quick brown box"
        } else {
            " The quick brown fox"
        }
        .into(),
        reference: " The quick brown fox".into(),
        tokens_equal: !fault,
        first_divergent_step: None,
    };
    c.into_evidence(run_info(), Some(transcript), Some(true), vec![])
}

/// Tiny decoder: mem (once) -> k (prefill) -> attn (every, @prefill) -> logits (every).
pub fn tiny_specs() -> Vec<CheckpointSpec> {
    let s = spec;
    vec![
        s("mem", Steps::Once, vec![], false),
        s("k", Steps::Prefill, vec![("mem", StepRef::Same)], false),
        s(
            "attn",
            Steps::Every,
            vec![("k", StepRef::Prefill), ("attn", StepRef::Previous)],
            false,
        ),
        s("logits", Steps::Every, vec![("attn", StepRef::Same)], true),
    ]
}

/// Evidence of the tiny decoder with a scale fault in `k`.
pub fn tiny_evidence() -> Evidence {
    let g = build_graph(&tiny_specs(), &[0, 1]).expect("graph");
    let mut src = MemorySource::default();
    for (i, n) in g.nodes().iter().enumerate() {
        let (shape, layout): (Vec<usize>, xray_core::Layout) = match n.name.as_str() {
            "k" => (vec![2, 4, 4], xray_core::Layout::HeadMajor),
            "logits" => (vec![1, 6], xray_core::Layout::TokenMajor),
            _ => (vec![4, 8], xray_core::Layout::TokenMajor),
        };
        let r = tensor(&shape, i as f32);
        let x = match n.name.as_str() {
            "mem" => r.clone(),
            "k" => &r * 0.125f32,
            _ => &r + &(tensor(&shape, 50.0) * 0.1f32),
        };
        src.insert(&n.name, n.step, layout, r, x);
    }
    let c = compare_graph(&g, &src, &CompareOptions::default()).expect("compare");
    c.into_evidence(run_info(), None, None, vec!["synthetic fixture".into()])
}

/// The model path [`run_info`] records (replaced by `[model_path]` in snapshots).
pub const VOLATILE_MODEL_PATH: &str = "/tmp/volatile/whisper-tiny-en";

/// insta settings of every snapshot: no module prefix; in JSON snapshots the volatile run fields
/// are redacted (insta redactions); in text snapshots (Markdown, CLI output) filters replace the
/// repository root, temporary directories, hashes, versions and timings with placeholders.
pub fn snapshot_settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    // Evidence JSON: a recorded value becomes a placeholder; an absent one (null) stays null.
    let keep_null = |placeholder: &'static str| {
        insta::dynamic_redaction(move |v, _| match v {
            insta::internals::Content::None | insta::internals::Content::Unit => v,
            _ => placeholder.into(),
        })
    };
    s.add_redaction(".run.model_path", "[model_path]");
    s.add_redaction(".run.weights_sha256", keep_null("[sha256]"));
    s.add_redaction(".run.audio_sha256", keep_null("[sha256]"));
    s.add_redaction(".run.runtime_version", "[runtime_version]");
    s.add_redaction(".run.oracle.python", keep_null("[python]"));
    s.add_redaction(".run.oracle.torch", keep_null("[torch]"));
    s.add_redaction(".run.oracle.transformers", keep_null("[transformers]"));
    // Text: paths first (the repository root may itself be under a temporary directory).
    for r in [root().canonicalize().unwrap_or_else(|_| root()), root()] {
        s.add_filter(&regex_escape(&r.display().to_string()), "[root]");
    }
    s.add_filter(&regex_escape(VOLATILE_MODEL_PATH), "[model_path]");
    s.add_filter(r"/tmp/\.tmp[0-9A-Za-z_]+", "[tmp]");
    s.add_filter(r"\b[0-9a-f]{64}\b", "[sha256]");
    s.add_filter(
        r"runtime `xray-runtime [^`]+`",
        "runtime `[runtime_version]`",
    );
    s.add_filter(
        r"oracle python [^,]+, torch [^,]+, transformers \S+",
        "oracle python [python], torch [torch], transformers [transformers]",
    );
    s.add_filter(r"\b\d+(\.\d+)? ?(ms|s)\b", "[time]");
    s
}

/// `text` with the regex metacharacters escaped (for a literal filter).
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Rounds every non-integer JSON number to 3 significant digits (as a string), so snapshots hold
/// no raw floats.
pub fn round_floats(v: Value) -> Value {
    match v {
        Value::Number(n) if !(n.is_i64() || n.is_u64()) => {
            let f = n.as_f64().unwrap_or(0.0);
            if f == 0.0 {
                Value::String("0".into())
            } else {
                Value::String(format!("{f:.2e}"))
            }
        }
        Value::Array(a) => Value::Array(a.into_iter().map(round_floats).collect()),
        Value::Object(m) => {
            Value::Object(m.into_iter().map(|(k, v)| (k, round_floats(v))).collect())
        }
        v => v,
    }
}

/// The one snapshot macro: `xray_snapshot!(evidence "name", &ev)` snapshots the evidence JSON with
/// the volatile fields redacted and floats rounded; `xray_snapshot!(markdown "name", &ev)` its
/// Markdown, filtered (both through [`snapshot_settings`]). In scope in every module of the test
/// binary declared after `mod common` (`#[macro_use]` in main.rs).
macro_rules! xray_snapshot {
    (evidence $name:literal, $ev:expr) => {{
        let v = serde_json::to_value($ev).expect("evidence JSON");
        $crate::common::snapshot_settings().bind(|| {
            insta::assert_json_snapshot!($name, $crate::common::round_floats(v));
        });
    }};
    (markdown $name:literal, $ev:expr) => {{
        let md = xray_compare::report::markdown($ev);
        $crate::common::snapshot_settings().bind(|| {
            insta::assert_snapshot!($name, md);
        });
    }};
}

/// The repository root (harness/..).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the `xray` binary built for these tests from the repository root (without
/// `XRAY_TRACEBACK` from the caller's environment: errors are one line unless a test asks).
pub fn xray(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_xray"))
        .current_dir(root())
        .env_remove("XRAY_TRACEBACK")
        .args(args)
        .output()
        .expect("run xray")
}

/// The exit code (-1 when killed by a signal).
pub fn code(o: &std::process::Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// `xray check --model MODEL --audio AUDIO EXTRA.. --evidence <temp>/e.json`, which must exit
/// with `want` (else a panic showing its stderr): the evidence it wrote (`Null` when none).
pub fn check(model: &str, audio: &str, extra: &[&str], want: i32) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let ev = dir.path().join("e.json");
    let ev_arg = ev.to_str().expect("utf-8 temp path");
    let o = on(
        "check",
        model,
        audio,
        &[extra, &["--evidence", ev_arg]].concat(),
    );
    assert_eq!(code(&o), want, "{}", stderr(&o));
    match std::fs::read_to_string(&ev) {
        Ok(text) => serde_json::from_str(&text).expect("evidence is JSON"),
        Err(_) => Value::Null,
    }
}

/// `xray compare REFERENCE GOT EXTRA..`.
pub fn compare_with(reference: &Path, got: &Path, extra: &[&str]) -> std::process::Output {
    xray(&[&["compare", s(reference), s(got)], extra].concat())
}

/// `xray compare REFERENCE GOT --model MODEL --evidence EVIDENCE`, which must exit with `want`
/// (else a panic showing its stderr): its output and the evidence it wrote.
pub fn compare_output(
    reference: &Path,
    got: &Path,
    model: &str,
    evidence: &Path,
    want: i32,
) -> (std::process::Output, Value) {
    let o = compare_with(
        reference,
        got,
        &["--model", model, "--evidence", s(evidence)],
    );
    assert_eq!(code(&o), want, "{}", stderr(&o));
    (o, read_json(evidence))
}

/// [`compare_output`]'s evidence.
pub fn compare_dumps(
    reference: &Path,
    got: &Path,
    model: &str,
    evidence: &Path,
    want: i32,
) -> Value {
    compare_output(reference, got, model, evidence, want).1
}

/// The JSON document at `p` (panics naming the file when it is unreadable or not JSON).
pub fn read_json(p: &Path) -> Value {
    let text =
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
}

/// A copy of the directory `from` (its folders too) at `to` (created).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A new temporary directory and the paths `names` in it (not created).
pub fn temp_paths<const N: usize>(names: [&str; N]) -> (tempfile::TempDir, [PathBuf; N]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = names.map(|n| dir.path().join(n));
    (dir, paths)
}

/// A temporary directory for a test whose fixtures `paths` are there; `None` when [`ready`]
/// skips it (the one guard, unchanged).
pub fn ready_tempdir(paths: &[&str]) -> Option<tempfile::TempDir> {
    ready(paths).then(|| tempfile::tempdir().expect("tempdir"))
}

/// `xray check --model MODEL --audio FOX --inject FAULT EXTRA..`, which must find the divergence
/// (exit 1): the evidence ([`check`]).
pub fn check_injected(model: &str, fault: &str, extra: &[&str]) -> Value {
    check(model, FOX, &[&["--inject", fault], extra].concat(), 1)
}

/// `xray CMD --model MODEL --audio AUDIO EXTRA..`.
pub fn on(cmd: &str, model: &str, audio: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![cmd, "--model", model, "--audio", audio];
    args.extend_from_slice(extra);
    xray(&args)
}

/// `xray CMD --model MODEL --audio AUDIO --out OUT EXTRA..` (`run` or `oracle`: a dump).
pub fn dump_to(
    cmd: &str,
    model: &str,
    audio: &str,
    out: &Path,
    extra: &[&str],
) -> std::process::Output {
    let out = out.to_str().expect("utf-8 path");
    on(cmd, model, audio, &[&["--out", out], extra].concat())
}

/// fox.wav, the clip most tests run.
pub const FOX: &str = "fixtures/audio/fox.wav";

/// The random-init Whisper fixture most tests run (`make fixtures`).
pub const RAND: &str = "fixtures/build/whisper-rand-a";

/// Whisper tiny.en, the real model.
pub const TINY: &str = "fixtures/whisper-tiny-en";

/// The random-init Granite NAR fixture.
pub const GRANITE: &str = "fixtures/build/granite-nar-tiny";

/// `p` as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A copy of `model` (every file linked but the weights) whose `model.safetensors` is rewritten by
/// `edit`, a Python statement on `w` (the state dict as numpy arrays) and `np`.
pub fn edited(dir: &Path, model: &str, name: &str, edit: &str) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir(&out).unwrap();
    let src = root().join(model);
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        if f.file_name() != "model.safetensors" {
            std::os::unix::fs::symlink(f.path(), out.join(f.file_name())).unwrap();
        }
    }
    let script = format!(
        "import sys\nimport numpy as np\nfrom safetensors.numpy import load_file, save_file\n\
         w = load_file(sys.argv[1])\n{edit}\n\
         save_file({{k: np.ascontiguousarray(v) for k, v in w.items()}}, sys.argv[2], metadata={{'format': 'pt'}})\n"
    );
    let o = std::process::Command::new(root().join(".venv/bin/python"))
        .args([
            "-c",
            &script,
            s(&src.join("model.safetensors")),
            s(&out.join("model.safetensors")),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// `xray oracle --model MODEL --audio FOX --ops` into `dir/ref-<model's name>`: the directory.
pub fn oracle_dump(dir: &Path, model: &str) -> PathBuf {
    let r = dir.join(format!("ref-{}", model.rsplit('/').next().unwrap()));
    let o = dump_to("oracle", model, FOX, &r, &["--ops"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    r
}

/// The HF reference of `model` on fox with `patch` (Python run before the oracle's entry point:
/// a bug planted in transformers' modules; empty for none) dumped with op-level points by the
/// oracle's own program, as another engine's dump: the directory (`dir/engine`).
pub fn patched_oracle_dump(dir: &Path, model: &str, patch: &str) -> PathBuf {
    let contract = dir.join("contract.json");
    let o = xray(&["contract", "--model", model, "--out", s(&contract)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let program = format!(
        "import sys, runpy\n{patch}sys.argv = ['xray_oracle'] + sys.argv[1:]\n\
         runpy.run_module('xray_oracle', run_name='__main__')\n"
    );
    let got = dir.join("engine");
    let o = std::process::Command::new(root().join(".venv/bin/python"))
        .current_dir(root())
        .env("PYTHONPATH", root().join("oracle"))
        .args([
            "-c",
            &program,
            "dump",
            "--model",
            model,
            "--audio",
            FOX,
            "--contract",
            s(&contract),
            "--ops",
            "--out",
            s(&got),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    got
}

/// The first checkpoint named `name` of an evidence document (panics naming it when absent).
pub fn checkpoint<'a>(e: &'a Value, name: &str) -> &'a Value {
    e["checkpoints"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no checkpoint {name} in the evidence"))
}

/// Asserts `o` is an input error (exit 2) whose stderr says `says`.
pub fn assert_refused(o: &std::process::Output, says: &str) {
    assert_eq!(code(o), 2, "{}", stderr(o));
    assert!(stderr(o).contains(says), "{}", stderr(o));
}

/// Asserts `o` exited with `want` and its stdout says `says`.
pub fn assert_stdout(o: &std::process::Output, want: i32, says: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(code(o), want, "{out}");
    assert!(out.contains(says), "{out}");
}

/// stderr as text.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Whether the fixtures under the repository root are there; else a printed, recorded skip, or a
/// failure under `XRAY_REQUIRE_FIXTURES`, as `make test` sets it ([`xray_core::testing`]).
pub fn ready(paths: &[&str]) -> bool {
    xray_core::testing::require_all(paths, xray_core::testing::MAKE_FIXTURES)
}

/// The evidence validates against docs/evidence.schema.json.
pub fn assert_schema_valid(ev: &Value) {
    let text = std::fs::read_to_string(root().join("docs/evidence.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    let v = jsonschema::validator_for(&schema).expect("valid JSON Schema");
    let errors: Vec<String> = v
        .iter_errors(ev)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
}

/// Set in a child process of this test binary to the one test it runs ([`own_process`]).
pub const OWN_PROCESS_VAR: &str = "XRAY_IT_OWN_PROCESS";

/// Whether the calling test's body runs in this process. In the test binary every module shares
/// it runs the test again, alone, in a child process of this binary (`--exact NAME`, with
/// [`OWN_PROCESS_VAR`] naming it: its environment given to the `Command`, this process's is
/// unchanged), passes the child's stderr on as this test's output (captured as the test's own,
/// or printed as it comes under `--nocapture`), panics when the child's test fails, and returns
/// `false`; in that child, `true`.
///
/// For a test that changes what a process shares: the embedded interpreter and the reference
/// (torch writes `os.environ`, and so `environ`, while other tests spawn `xray` from it; the
/// interpreter sets the C locale; the runtime tunes the allocator). The child inherits
/// `XRAY_SKIP_LEDGER` and `XRAY_REQUIRE_FIXTURES`, and its `SKIPPED` lines are shown as
/// [`xray_core::testing`] shows them (past the capture). Guard before the call: a missing
/// fixture returns in this process and starts no child; in the child the same guard passes.
pub fn own_process() -> bool {
    use std::io::{BufRead, Read, Write};
    let thread = std::thread::current();
    let test = thread
        .name()
        .expect("libtest names a test's thread after the test")
        .to_string();
    if let Some(v) = std::env::var_os(OWN_PROCESS_VAR) {
        // Never a grandchild: a name that does not match is a bug here, not a reason to recurse.
        assert!(
            v == test.as_str(),
            "{OWN_PROCESS_VAR}={v:?} but this thread runs {test:?}"
        );
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = std::process::Command::new(&exe)
        .args(["--exact", &test, "--nocapture", "--test-threads", "1"])
        .env(OWN_PROCESS_VAR, &test)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {test} in {}: {e}", exe.display()));
    let mut stdout = child.stdout.take().expect("piped stdout");
    let summary = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    // Read on this thread: libtest captures what the test's own thread prints.
    let stderr = child.stderr.take().expect("piped stderr");
    for line in std::io::BufReader::new(stderr).lines() {
        match line {
            Ok(l) if l.starts_with("SKIPPED ") => {
                let _ = writeln!(std::io::stderr(), "{l}");
            }
            Ok(l) => eprintln!("{l}"),
            Err(e) => eprintln!("(the child's stderr: {e})"),
        }
    }
    let status = child.wait().expect("wait for the child");
    let summary = summary.join().unwrap_or_default();
    assert!(
        status.success(),
        "{test} failed in its own process ({status}):\n{summary}"
    );
    assert!(
        summary.contains("1 passed"),
        "{test}: the child ran no test:\n{summary}"
    );
    false
}
