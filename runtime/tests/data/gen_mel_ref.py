"""Generate the committed log-mel references used by runtime/tests/whisper_frontend.rs.

Reference: transformers' own WhisperFeatureExtractor numpy path (`_np_extract_fbank_features`,
float64 throughout), on fixtures/audio/fox.wav zero-padded to a 30 s window, for 80 and 128 mel
bins. Only the first FRAMES frames are stored (committed test data stays small); the statistics
of the whole window are stored next to them in mel_ref.json.

Run from the repository root:  .venv/bin/python runtime/tests/data/gen_mel_ref.py
Pinned: transformers 5.24.0, numpy as in oracle/requirements.txt.
"""
import json
import wave
from pathlib import Path

import numpy as np
import transformers
from transformers import WhisperFeatureExtractor

FRAMES = 100
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def main() -> None:
    with wave.open(str(ROOT / "fixtures/audio/fox.wav"), "rb") as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    meta = {"source": "fixtures/audio/fox.wav", "frames_stored": FRAMES, "transformers": transformers.__version__, "bins": {}}
    for bins in (80, 128):
        fe = WhisperFeatureExtractor(feature_size=bins, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400)
        x = np.zeros(fe.n_samples, dtype=np.float64)
        x[: len(pcm)] = pcm
        mel = fe._np_extract_fbank_features(x[None, :], "cpu")[0]
        assert mel.shape == (bins, 3000), mel.shape
        np.save(HERE / f"mel_ref_fox_{bins}.npy", mel[:, :FRAMES].astype(np.float32))
        meta["bins"][str(bins)] = {
            "min": float(mel.min()),
            "max": float(mel.max()),
            "mean": float(mel.mean()),
            "std": float(mel.std()),
            "filter_sums": [float(s) for s in fe.mel_filters.sum(axis=0)],
        }
    (HERE / "mel_ref.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
