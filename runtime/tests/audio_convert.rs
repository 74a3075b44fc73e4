//! "Audio a user actually has": WAVs made by sox from the committed clips at 44.1 kHz stereo,
//! 48 kHz 24-bit, 22.05 kHz float, 8 kHz and 16-bit WAVE_FORMAT_EXTENSIBLE are converted once
//! (down-mix, rubato FFT resampler) to 16 kHz mono close to the original clip, and the
//! conversion is recorded. A plain 16 kHz mono 16-bit file is read bit for bit as `i16 / 32768`.

use std::path::{Path, PathBuf};
use std::process::Command;

use xray_runtime::audio::{load_wav, samples_sha256, Audio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sox(args: &[&str]) -> bool {
    match Command::new("sox").args(args).status() {
        Ok(s) => s.success(),
        Err(_) => false,
    }
}

/// (name, sox output options, source rate, channels, format, minimum SNR in dB).
type Case = (
    &'static str,
    &'static [&'static str],
    u32,
    u16,
    &'static str,
    f64,
);

/// Signal-to-error ratio in dB of `got` against `want` over their common length.
fn snr_db(want: &[f32], got: &[f32]) -> f64 {
    let n = want.len().min(got.len());
    let sig: f64 = want[..n].iter().map(|&x| f64::from(x).powi(2)).sum();
    let err: f64 = want[..n]
        .iter()
        .zip(&got[..n])
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    10.0 * (sig / err.max(1e-300)).log10()
}

fn fox() -> Audio {
    load_wav(&root().join("fixtures/audio/fox.wav"), 16000).expect("fox.wav")
}

#[test]
fn plain_16k_mono_is_read_exactly_with_no_conversion() {
    let a = fox();
    assert!(a.conversion.is_identity(), "{:?}", a.conversion);
    assert_eq!(a.conversion.resampler, None);
    // i16 / 32768 exactly: every sample times 32768 is an integer.
    assert!(a.samples.iter().all(|&s| (s * 32768.0).fract() == 0.0));
    assert_eq!(a.conversion.samples_sha256, samples_sha256(&a.samples));
}

#[test]
fn sox_made_rates_channels_and_formats_convert_close_to_the_original() {
    if !xray_core::testing::require_tool("sox", "`make tools` installs it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("fixtures/audio/fox.wav");
    let src = src.to_str().unwrap();
    let orig = fox();
    // (name, sox output options, expected source rate, channels, format, min SNR dB vs the
    // original). 8 kHz keeps only the band below 4 kHz, so its bound is loose.
    let cases: [Case; 5] = [
        (
            "44k-stereo.wav",
            &["-r", "44100", "-c", "2"],
            44100,
            2,
            "pcm_s16",
            40.0,
        ),
        (
            "48k-24bit.wav",
            &["-r", "48000", "-b", "24"],
            48000,
            1,
            "pcm_s24",
            40.0,
        ),
        (
            "22k-float.wav",
            &["-r", "22050", "-e", "floating-point", "-b", "32"],
            22050,
            1,
            "float32",
            40.0,
        ),
        ("8k.wav", &["-r", "8000"], 8000, 1, "pcm_s16", 15.0),
        (
            "ext16.wav",
            &["-b", "16"],
            16000,
            1,
            "pcm_s16",
            f64::INFINITY,
        ),
    ];
    for (name, opts, rate, ch, fmt, min_snr) in cases {
        let out = dir.path().join(name);
        let mut args: Vec<&str> = vec![src];
        args.extend(opts.iter().copied());
        args.push(out.to_str().unwrap());
        assert!(sox(&args), "sox {args:?}");
        if name == "ext16.wav" {
            // sox writes a plain fmt chunk for 16-bit mono; rewrite it as EXTENSIBLE.
            make_extensible(&out);
        }
        let a = load_wav(&out, 16000).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(a.sample_rate, 16000);
        assert_eq!(a.conversion.source_rate, rate, "{name}");
        assert_eq!(a.conversion.source_channels, ch, "{name}");
        assert_eq!(a.conversion.source_format, fmt, "{name}");
        assert_eq!(a.conversion.samples_sha256, samples_sha256(&a.samples));
        let diff = a.samples.len() as i64 - orig.samples.len() as i64;
        assert!(
            diff.abs() <= 2,
            "{name}: {} vs {} samples",
            a.samples.len(),
            orig.samples.len()
        );
        let snr = snr_db(&orig.samples, &a.samples);
        eprintln!(
            "{name}: SNR {snr:.1} dB vs the 16 kHz original, {:?}",
            a.conversion.resampler
        );
        if min_snr.is_infinite() {
            assert_eq!(
                a.samples, orig.samples,
                "{name}: EXTENSIBLE 16-bit reads like the plain file"
            );
        } else {
            assert!(snr >= min_snr, "{name}: SNR {snr:.1} dB < {min_snr}");
            assert!(a
                .conversion
                .resampler
                .as_deref()
                .is_some_and(|r| r.contains("rubato")));
        }
    }
}

/// Rewrite a plain 16-bit PCM WAV's fmt chunk as WAVE_FORMAT_EXTENSIBLE (PCM sub-format).
fn make_extensible(p: &Path) {
    let b = std::fs::read(p).unwrap();
    assert_eq!(&b[12..16], b"fmt ");
    let fmt_len = u32::from_le_bytes([b[16], b[17], b[18], b[19]]) as usize;
    let fmt = &b[20..20 + 16];
    let rest = &b[20 + fmt_len..];
    let mut ext = Vec::new();
    ext.extend_from_slice(&0xFFFEu16.to_le_bytes());
    ext.extend_from_slice(&fmt[2..16]);
    ext.extend_from_slice(&22u16.to_le_bytes()); // cbSize
    ext.extend_from_slice(&16u16.to_le_bytes()); // valid bits
    ext.extend_from_slice(&4u32.to_le_bytes()); // channel mask
    ext.extend_from_slice(&[
        1, 0, 0, 0, 0, 0, 0x10, 0, 0x80, 0, 0, 0xaa, 0, 0x38, 0x9b, 0x71,
    ]);
    let mut out = Vec::new();
    out.extend_from_slice(b"RIFF");
    let body_len = 4 + 8 + ext.len() + rest.len();
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(b"WAVE");
    out.extend_from_slice(b"fmt ");
    out.extend_from_slice(&(ext.len() as u32).to_le_bytes());
    out.extend_from_slice(&ext);
    out.extend_from_slice(rest);
    std::fs::write(p, out).unwrap();
}

#[test]
fn directories_missing_files_and_odd_rates_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_wav(dir.path(), 16000).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
    let e = load_wav(&dir.path().join("nope.wav"), 16000)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nope.wav") && e.contains("does not exist"),
        "{e}"
    );
    let odd = dir.path().join("odd.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 12345,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&odd, spec).unwrap();
    for i in 0..1000 {
        w.write_sample(i as i16).unwrap();
    }
    w.finalize().unwrap();
    let e = load_wav(&odd, 16000).unwrap_err().to_string();
    assert!(e.contains("odd.wav") && e.contains("12345 Hz"), "{e}");
}
