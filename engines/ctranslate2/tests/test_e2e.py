"""CTranslate2 under X-Ray through the documented route (engines/ctranslate2/xray_ct2.py writes its
dumps with the public Python writer; `xray oracle` and `xray compare` do the rest), asserting the
findings as measured on the real tiny.en: f32 passes with step 0 compared and suppression not
counted as a divergence; int8 departs first at the encoder memory, its tokens part at step 3 on
fox, and the int8-weights reference variant explains part of it.

Needs ctranslate2 (oracle/requirements-bench.txt), the fixtures and a built `xray`
(target/release/xray). Skipped, with the reason, when one is missing; under `make test`
(XRAY_REQUIRE_FIXTURES set, and the Makefile installs ctranslate2) a missing one fails instead.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
XRAY = REPO / "target" / "release" / "xray"
MODEL = REPO / "fixtures" / "whisper-tiny-en"
AUDIO = REPO / "fixtures" / "audio"
ENGINE = REPO / "engines" / "ctranslate2" / "xray_ct2.py"


def need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("XRAY_REQUIRE_FIXTURES"):
        pytest.fail(f"{why} and XRAY_REQUIRE_FIXTURES is set (make test installs it)", pytrace=False)
    pytest.skip(why)


def setup_module(_):
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        need(False, "ctranslate2 is not installed (.venv/bin/pip install -r oracle/requirements-bench.txt)")
    need(XRAY.is_file(), f"{XRAY} is not built (make build)")
    need((MODEL / "model.safetensors").is_file(), f"fixture {MODEL} is missing (make fixtures)")


def xray(*args, expect=None):
    r = subprocess.run([str(XRAY), *map(str, args)], capture_output=True, text=True)
    if expect is not None:
        assert r.returncode == expect, f"xray {' '.join(map(str, args))}: exit {r.returncode}\n{r.stderr}"
    return r


def ct2(*args):
    r = subprocess.run([sys.executable, str(ENGINE), "--model", str(MODEL), "--force", *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every dump the assertions read, made once: fox (reference, int8-weights variant, CTranslate2
    f32 / int8 plain and fed, f32 undeclared) and stella (reference, f32)."""
    d = tmp_path_factory.mktemp("ct2")
    fox, stella = AUDIO / "fox.wav", AUDIO / "stella.wav"
    xray("oracle", "--model", MODEL, "--audio", fox, "--out", d / "ref", expect=0)
    xray("oracle", "--model", MODEL, "--audio", fox, "--out", d / "ref-int8", "--weights-variant", "int8", expect=0)
    xray("oracle", "--model", MODEL, "--audio", stella, "--out", d / "sref", expect=0)
    ct2("--audio", fox, "--out", d / "f32")
    ct2("--audio", fox, "--out", d / "f32-fed", "--memory-from", d / "ref", "--tokens-from", d / "ref")
    ct2("--audio", fox, "--out", d / "f32-undeclared", "--no-declare")
    ct2("--audio", fox, "--out", d / "i8", "--compute-type", "int8")
    ct2("--audio", fox, "--out", d / "i8-fed", "--compute-type", "int8", "--memory-from", d / "ref",
        "--tokens-from", d / "ref")
    ct2("--audio", stella, "--out", d / "sf32")
    return d


def evidence(d: Path, *args, expect: int):
    ev = d / f"ev-{abs(hash(args))}.json"
    r = xray("compare", *args, "--evidence", ev, expect=expect)
    return json.loads(ev.read_text()), r.stderr


def cpu_has_vnni() -> bool:
    """Whether the CPU has VNNI (AVX-512 VNNI or AVX-VNNI), from /proc/cpuinfo's flags."""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_vnni", "avx_vnni"))


def by_id(ev):
    return {(c["name"], c["step"]): c for c in ev["checkpoints"]}


def test_f32_passes_with_step0_compared_and_suppression_declared(runs):
    ev, err = evidence(runs, runs / "ref", runs / "f32", "--isolated", runs / "f32-fed", expect=0)
    observed = [c for c in ev["checkpoints"] if c["status"] not in ("unobserved", "not_comparable")]
    assert len(observed) == 15 and all(c["status"] == "pass" for c in observed), [c["name"] for c in observed]
    cps = by_id(ev)
    assert cps[("audio.decoder.logits", 0)]["status"] == "pass"  # step 0: the last prompt row
    assert cps[("audio.encoder.memory", 0)]["metrics"]["rel_l2"] < 1e-5
    assert ev["transcript"]["tokens_equal"] is True
    # Every suppressed id (90 per step, 92 at step 0) holds CTranslate2's -3.4e38 in the plain run;
    # in the teacher-forced run step 0 is a forced position, where CTranslate2 applies no begin
    # suppression (blank, EOS): 1080 of 1082.
    assert "logits processed: suppression (declared)" in err
    assert f"1082 of 1082 in {runs / 'f32'}, 1080 of 1082 in {runs / 'f32-fed'}" in err
    # The identity is the HF source; the engine's own model.bin is named, and no weights note.
    assert ev["run"]["engine_weights"]["format"] == "ctranslate2"
    assert "weights differ" not in err and "engine weights:" in err
    # The dump was written by the public writer, no hand-made manifest: it says what it declares.
    m = json.loads((runs / "f32" / "manifest.json").read_text())
    e0 = next(e for e in m["checkpoints"] if e["name"] == "audio.decoder.logits" and e["step"] == 0)
    assert (e0["shape"][0], e0["token_positions"], e0["logits_processed"]) == (1, "last", "suppression")


def test_f32_stella_passes(runs):
    ev, _ = evidence(runs, runs / "sref", runs / "sf32", expect=0)
    observed = [c for c in ev["checkpoints"] if c["status"] not in ("unobserved", "not_comparable")]
    assert len(observed) == STELLA_OBSERVED and all(c["status"] == "pass" for c in observed)
    assert ev["transcript"]["tokens_equal"] is True


STELLA_OBSERVED = 21  # mel, memory, the prompt ids, logits at steps 0..17


def test_undeclared_logits_name_the_mechanisms(runs):
    ev, err = evidence(runs, runs / "ref", runs / "f32-undeclared", expect=1)
    fd = ev["first_divergence"]
    assert (fd["checkpoint"], fd["step"]) == ("audio.decoder.logits", 0)
    assert "token_positions" in fd["explanation"]["detail"]
    ind = [f for f in ev["independent"] if f["checkpoint"] == "audio.decoder.logits"]
    assert len(ind) == 11
    for f in ind:
        x = f["explanation"]
        assert x["signature"] == "logits_processed", x
        assert "exactly the ids extra.generation_config suppresses" in x["detail"]
    # The console prints the mechanism once and the repeats as one line, the suspects list once.
    assert err.count("exactly the ids extra.generation_config suppresses") == 1
    assert "audio.decoder.logits@step2..11 likewise (signature logits_processed" in err
    assert sum(1 for line in err.splitlines() if "suspects: feed:decoder.position_ids" in line) <= 2


def test_int8_finding_and_the_int8_weights_variant(runs):
    ev, err = evidence(runs, runs / "ref", runs / "i8", "--isolated", runs / "i8-fed", "--variant", runs / "ref-int8",
                       expect=1)
    fd = ev["first_divergence"]
    assert (fd["checkpoint"], fd["step"]) == ("audio.encoder.memory", 0)
    assert 1e-2 < by_id(ev)[("audio.encoder.memory", 0)]["metrics"]["rel_l2"] < 6e-2
    assert ev["tokens"]["parted_at_step"] == 3
    # The decoder's own error (reference memory and tokens fed): logits rel_l2 1e-2..3.5e-1. Its
    # int8 GEMMs depend on the CPU (oneDNN dispatches by ISA; MKL on Intel, see below): below 0.25
    # on an AMD EPYC Zen 4 (AVX-512) and an Intel Xeon, 0.271 at step 0 on an AMD EPYC Zen 3
    # (AVX2 only, 5 Dec 2026).
    for k in range(4):
        local = by_id(ev)[("audio.decoder.logits", k)]["local_metrics"]["rel_l2"]
        assert 1e-2 < local < 0.35, (k, local)
    (v,) = ev["reference_variants"]
    assert v["scheme"] == "int8"
    o = v["origin"]
    assert (o["name"], o["step"]) == ("audio.encoder.memory", 0)
    # The engine is farther from the int8-weights reference than from the f32 one (activations
    # are int8 too) on every CPU measured.
    assert o["consistent"] is False and -1.0 < o["explained"] < 0.7, o
    # How much of the int8 error the int8-weights reference explains depends on the int8 GEMM
    # CTranslate2 runs, which depends on the CPU: it picks Intel MKL's u8s8s32 GEMM on a
    # GenuineIntel CPU and oneDNN elsewhere (src/cpu/backend.cc `mayiuse_mkl`), and oneDNN's
    # kernels differ with and without VNNI. Measured: at the origin ~0.42 and over every failing
    # checkpoint above 0.5 on an AMD EPYC Zen 4 (AVX-512 VNNI), 0.43 on an Intel Xeon; on an AMD
    # EPYC Zen 3 (AVX2, no VNNI; 5 Dec 2026) 0.177 at the origin and -0.35 over the failing
    # checkpoints (the variant explains none of it there: that engine's int8 grid is another).
    if cpu_has_vnni():
        assert 0.2 < o["explained"], o
        assert v["explained_failing"] > 0.35, v
    assert "int8 reference variant: at the origin audio.encoder.memory@step0" in err


def test_isolated_run_on_other_audio_is_refused_naming_it(runs):
    r = xray("compare", runs / "ref", runs / "f32", "--isolated", runs / "sf32", expect=2)
    assert "audio differs" in r.stderr and "weights differ" not in r.stderr, r.stderr
