"""The Python engine example of docs/bring-your-own-engine.md ("From Python", "Write your own") is
run exactly as the document shows it, and `xray compare` must pass it: the newcomer's route works
end to end, with step 0 compared (declared `token_positions: last`) and suppression declared."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import AUDIO, REPO, TINY_EN, require_fixture

DOC = REPO / "docs" / "bring-your-own-engine.md"
XRAY = REPO / "target" / "release" / "xray"


def example() -> str:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"<!-- python-engine-example -->\n```python\n(.*?)\n```", text, re.S)
    assert m, f"{DOC}: the marked Python example is missing"
    return m.group(1)


def test_the_documented_python_engine_passes_xray_compare(tmp_path):
    require_fixture(TINY_EN / "model.safetensors")
    if not XRAY.is_file():
        pytest.fail(f"{XRAY} is not built (make build)")
    script = tmp_path / "my_engine.py"
    script.write_text(example(), encoding="utf-8")
    wav = AUDIO / "fox.wav"
    env = dict(os.environ, XRAY_HOME=str(REPO))
    r = subprocess.run([sys.executable, str(script), str(TINY_EN), str(wav), str(tmp_path / "got")],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(XRAY), "oracle", "--model", str(TINY_EN), "--audio", str(wav), "--out", str(tmp_path / "ref")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ev = tmp_path / "ev.json"
    r = subprocess.run([str(XRAY), "compare", str(tmp_path / "ref"), str(tmp_path / "got"), "--evidence", str(ev)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    e = json.loads(ev.read_text())
    observed = [c for c in e["checkpoints"] if c["status"] not in ("unobserved", "not_comparable")]
    assert all(c["status"] == "pass" for c in observed)
    assert any(c["name"] == "audio.decoder.logits" and c["step"] == 0 for c in observed)
    assert e["transcript"]["tokens_equal"] is True
    assert "verdict pass (14/14 observed checkpoints pass" in r.stderr, r.stderr
