"""Write the committed granite_nar reference dumps that runtime/tests/granite_nar.rs compares with.

Run from the repository root (needs the oracle venv, the tiny fixture and a built `xray`, which
resolves the contract the oracle reads):

    .venv/bin/python fixtures/make_granite_nar.py          # if fixtures/build/granite-nar-tiny is missing
    cargo build --release -p xray                          # if target/release/xray is missing
    PYTHONPATH=oracle .venv/bin/python runtime/tests/data/make_granite_ref.py

Writes, with `xray_oracle.dump.write_dump` (format docs/dump-format.md):

- `runtime/tests/data/granite_ref/fox/`: every contract checkpoint of the tiny fixture on
  fixtures/audio/fox.wav (float32 reference), tokens, transcript.
- `runtime/tests/data/granite_ref/fox_teacher/`: the `dec.*` checkpoints with the LM
  teacher-forced on TEACHER (a hypothesis of a different length than the CTC one, so the template
  and `n_text` change).

The CTC hypothesis and the LM template go under the manifest's `extra` key (what the Rust
`Manifest.extra` reads).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from xray_oracle.dump import write_dump
from xray_oracle.granite_nar import run_granite_nar

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "fixtures/build/granite-nar-tiny"
XRAY = ROOT / "target/release/xray"
OUT = Path(__file__).resolve().parent / "granite_ref"
# Five ids (the CTC hypothesis on fox.wav has four): template length 11 instead of 9.
TEACHER = [50, 8, 8, 20, 11]


def dump(contract: str, name: str, audio: str, teacher: list[int] | None = None, prefix: str = "") -> None:
    r = run_granite_nar(MODEL, ROOT / "fixtures/audio" / audio, contract, teacher_hypothesis=teacher)
    checkpoints = [c for c in r["checkpoints"] if c["name"].startswith(prefix)]
    # The run's own facts, as `xray_oracle dump` writes them.
    facts = {k: r[k] for k in ("family", "weights_sha256", "audio_sha256", "tools", "tokens", "transcript")}
    out = write_dump(
        OUT / name,
        checkpoints,
        model_id="fixtures/build/granite-nar-tiny",
        producer="oracle",
        overwrite=True,
        extra={"hypothesis": r["hypothesis"], "template": r["template"], "teacher_hypothesis": teacher},
        **facts,
    )
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {len(checkpoints)} checkpoints, {size / 1024:.0f} KiB, tokens {r['tokens']}, hypothesis {r['hypothesis']}, template {r['template']}")


def main() -> int:
    if not MODEL.is_dir():
        print(f"{MODEL} missing: run .venv/bin/python fixtures/make_granite_nar.py", file=sys.stderr)
        return 1
    if not XRAY.is_file():
        print(f"{XRAY} missing: run cargo build --release -p xray", file=sys.stderr)
        return 1
    # The contract resolved against the fixture's config, as the oracle is given it.
    contract = subprocess.run([XRAY, "contract", "--model", MODEL], check=True, capture_output=True, text=True).stdout
    dump(contract, "fox", "fox.wav")
    dump(contract, "fox_teacher", "fox.wav", TEACHER, prefix="dec.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
