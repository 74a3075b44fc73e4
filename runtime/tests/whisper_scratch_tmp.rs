// TEMPORARY ad-hoc dump for /tmp comparisons; deleted before handoff.
use std::path::Path;
use xray_runtime::capture::Recorder;
use xray_runtime::models::{whisper::WhisperModel, RunHooks, RunOptions, SpeechModel};

#[test]
#[ignore]
fn dump() {
    let model_dir = std::env::var("M").unwrap();
    let wav = std::env::var("W").unwrap();
    let out = std::env::var("O").unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let t = std::time::Instant::now();
    let m = WhisperModel::load(Path::new(&model_dir)).unwrap();
    eprintln!("load {:?}", t.elapsed());
    let a = xray_runtime::audio::load_wav(Path::new(&wav), 16000).unwrap();
    let mut rec = Recorder::new();
    let t = std::time::Instant::now();
    let o = m
        .run(
            &a,
            &RunOptions::default(),
            &mut RunHooks {
                observer: Some(&mut rec),
                ..Default::default()
            },
        )
        .unwrap();
    eprintln!("run {:?}", t.elapsed());
    for c in &rec.captured {
        std::fs::write(
            format!("{out}/{}@{}.npy", c.name, c.step),
            xray_runtime::dump::npy_bytes(&c.data),
        )
        .unwrap();
    }
    std::fs::write(format!("{out}/tokens.json"), serde_json::json!({"tokens": o.tokens, "predicted": o.predicted, "transcript": o.transcript}).to_string()).unwrap();
    eprintln!("{:?} {:?}", o.tokens, o.transcript);
}

#[test]
#[ignore]
fn timing() {
    use xray_runtime::graph::RunCtx;
    let model_dir = std::env::var("M").unwrap();
    let wav = std::env::var("W").unwrap();
    let m = WhisperModel::load(Path::new(&model_dir)).unwrap();
    let a = xray_runtime::audio::load_wav(Path::new(&wav), 16000).unwrap();
    let med = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let mut ctx = RunCtx::default();
    let mel = m.log_mel(&a.samples, &mut ctx).unwrap();
    let mut tm = vec![];
    let mut te = vec![];
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let _ = m.log_mel(&a.samples, &mut ctx).unwrap();
        tm.push(t.elapsed().as_secs_f64() * 1e3);
        let t = std::time::Instant::now();
        let _mem = m.encode_mel(mel.clone(), &mut ctx).unwrap();
        te.push(t.elapsed().as_secs_f64() * 1e3);
    }
    eprintln!(
        "log_mel median {:.1} ms; encoder median {:.1} ms {:?}",
        med(tm),
        med(te.clone()),
        te
    );
    let mem = m.encode_mel(mel.clone(), &mut ctx).unwrap();
    let mut s = m.new_session();
    s.install_memory(mem, None);
    let t = std::time::Instant::now();
    let _ = m.prefill(&mut s, &[50257, 50362], &mut ctx).unwrap();
    eprintln!("prefill {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut ts = vec![];
    for i in 0..20 {
        let t = std::time::Instant::now();
        let _ = m.decode_step(&mut s, 383 + i, &mut ctx).unwrap();
        ts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    eprintln!("decode step median {:.2} ms {:?}", med(ts.clone()), ts);
    for cap in [false, true, false, true] {
        let mut v = vec![];
        for _ in 0..3 {
            let mut rec = Recorder::new();
            let mut hooks = if cap {
                RunHooks {
                    observer: Some(&mut rec),
                    ..Default::default()
                }
            } else {
                RunHooks::default()
            };
            let t = std::time::Instant::now();
            let _ = m.run(&a, &RunOptions::default(), &mut hooks).unwrap();
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        eprintln!("run capture={cap} median {:.1} ms", med(v));
    }
}

#[test]
#[ignore]
fn decode_only() {
    use xray_runtime::graph::RunCtx;
    let model_dir = std::env::var("M").unwrap();
    let wav = std::env::var("W").unwrap();
    let m = WhisperModel::load(Path::new(&model_dir)).unwrap();
    let a = xray_runtime::audio::load_wav(Path::new(&wav), 16000).unwrap();
    let mut ctx = RunCtx::default();
    let mem = m.encode(&a.samples, &mut ctx).unwrap();
    let mut ts = vec![];
    let c0 = cpu_ms();
    for _ in 0..3 {
        let mut s = m.new_session();
        s.install_memory(mem.clone(), None);
        let _ = m.prefill(&mut s, &[50257, 50362], &mut ctx).unwrap();
        for i in 0..40 {
            let t = std::time::Instant::now();
            let _ = m.decode_step(&mut s, 383 + i, &mut ctx).unwrap();
            ts.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let cpu = (cpu_ms() - c0) / ts.len() as f64;
    eprintln!(
        "decode step median {:.2} ms min {:.2} cpu/step(incl prefill) {:.2}",
        ts[ts.len() / 2],
        ts[0],
        cpu
    );
}

fn cpu_ms() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) * 10.0
}

#[test]
#[ignore]
fn encode_only() {
    use xray_runtime::graph::RunCtx;
    let model_dir = std::env::var("M").unwrap();
    let wav = std::env::var("W").unwrap();
    let m = WhisperModel::load(Path::new(&model_dir)).unwrap();
    let a = xray_runtime::audio::load_wav(Path::new(&wav), 16000).unwrap();
    let mut ctx = RunCtx::default();
    let mel = m.log_mel(&a.samples, &mut ctx).unwrap();
    let mut ts = vec![];
    let c0 = cpu_ms();
    let n = 6;
    for _ in 0..n {
        let t = std::time::Instant::now();
        let _ = m.encode_mel(mel.clone(), &mut ctx).unwrap();
        ts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cpu = (cpu_ms() - c0) / n as f64;
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "encoder median {:.1} ms min {:.1} cpu/run {:.0} ms",
        ts[ts.len() / 2],
        ts[0],
        cpu
    );
}
