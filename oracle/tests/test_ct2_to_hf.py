"""fixtures/ct2_to_hf.py: the CTranslate2 reader, the CT2 -> HF mapping and the written directory."""
from __future__ import annotations

import copy
import json
import struct

import numpy as np
import pytest
from conftest import TINY_EN

import ct2_to_hf as c2h


@pytest.fixture(scope="module")
def ct2_dir():
    return c2h.find_ct2_dir()


@pytest.fixture(scope="module")
def ct2(ct2_dir):
    return c2h.read_ct2(ct2_dir / "model.bin")


def _str(s: str) -> bytes:
    b = s.encode() + b"\0"
    return struct.pack("<H", len(b)) + b


def write_ct2(m: c2h.Ct2Model) -> bytes:
    """Serializer mirroring the documented layout (used to prove the reader consumed every byte)."""
    out = [struct.pack("<I", m.binary_version), _str(m.spec_name), struct.pack("<I", m.spec_revision)]
    out.append(struct.pack("<I", len(m.variables)))
    for v in m.variables.values():
        out += [_str(v.name), struct.pack("<B", len(v.shape)), struct.pack(f"<{len(v.shape)}I", *v.shape)]
        raw = v.array.tobytes()
        out += [struct.pack("<B", v.dtype_code), struct.pack("<I", len(raw)), raw]
    out.append(struct.pack("<I", len(m.aliases)))
    for a, t in m.aliases.items():
        out += [_str(a), _str(t)]
    return b"".join(out)


def test_reader_round_trips_the_file_bytes(ct2, ct2_dir):
    assert (ct2.binary_version, ct2.spec_name, ct2.spec_revision) == (6, "WhisperSpec", 3)
    assert len(ct2.variables) == 148 and ct2.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert write_ct2(ct2) == (ct2_dir / "model.bin").read_bytes()
    assert {v.dtype_code for v in ct2.variables.values() if v.array.ndim > 0} == {4}  # all tensors f16


def test_every_variable_is_used_exactly_once(ct2):
    ledger_calls = []
    orig = c2h._Ledger.take

    def spy(self, name, shape=None):
        ledger_calls.append(name)
        return orig(self, name, shape)

    c2h._Ledger.take = spy
    try:
        sd, dims = c2h.convert_state_dict(ct2)
    finally:
        c2h._Ledger.take = orig
    assert sorted(ledger_calls) == sorted(set(ct2.variables) | set(ct2.aliases))
    assert len(ledger_calls) == len(set(ledger_calls))
    assert dims == {
        "vocab_size": 51864, "d_model": 384, "num_mel_bins": 80, "encoder_layers": 4, "decoder_layers": 4,
        "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "max_source_positions": 1500,
        "max_target_positions": 448, "encoder_attention_heads": 6, "decoder_attention_heads": 6,
    }
    # fused projections split back exactly; k has no bias
    f = ct2.variables["decoder/layer_2/self_attention/linear_0/weight"].array.astype(np.float32)
    p = "model.decoder.layers.2.self_attn"
    np.testing.assert_array_equal(np.concatenate([sd[f"{p}.q_proj.weight"], sd[f"{p}.k_proj.weight"], sd[f"{p}.v_proj.weight"]]), f)
    kv = ct2.variables["decoder/layer_1/attention/linear_1/bias"].array.astype(np.float32)
    np.testing.assert_array_equal(kv[384:], sd["model.decoder.layers.1.encoder_attn.v_proj.bias"])
    assert not any(k.endswith("k_proj.bias") for k in sd)
    assert "proj_out.weight" not in sd


def test_written_directory_matches_hf_and_keeps_f16_values(ct2):
    from safetensors.numpy import load_file
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    sd, _ = c2h.convert_state_dict(ct2)
    loaded = load_file(str(TINY_EN / "model.safetensors"))
    assert set(loaded) == set(sd)
    import torch

    with torch.device("meta"):
        ref = WhisperForConditionalGeneration(WhisperConfig.from_pretrained(TINY_EN))
    assert set(ref.state_dict()) - set(loaded) == {"proj_out.weight"}  # tied, not stored
    for k, a in loaded.items():
        assert a.dtype == np.float32, k
        np.testing.assert_array_equal(a, sd[k], err_msg=k)
        np.testing.assert_array_equal(a.astype(np.float16).astype(np.float32), a, err_msg=f"{k} is not f16-exact")

    gen = json.loads((TINY_EN / "generation_config.json").read_text())
    assert gen["decoder_start_token_id"] == 50257 and gen["no_timestamps_token_id"] == 50362
    assert gen["eos_token_id"] == 50256 and gen["max_length"] == 448 and gen["is_multilingual"] is False
    assert gen["begin_suppress_tokens"] == [220, 50256] and 50257 in gen["suppress_tokens"]
    cfg = json.loads((TINY_EN / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 51864


def test_tokenizer_covers_the_vocabulary():
    from transformers import WhisperProcessor

    p = WhisperProcessor.from_pretrained(str(TINY_EN), local_files_only=True)
    tok = p.tokenizer
    assert len(tok) == 51864
    assert tok.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>", "<|0.00|>", "<|30.00|>"]) == [
        50257, 50362, 50363, 51863]
    assert tok.decode([50257, 50362, 383, 2068, 50363, 50256], skip_special_tokens=True) == " The quick"
    assert p.feature_extractor.nb_max_frames == 3000 and p.feature_extractor.feature_size == 80


def test_unknown_unused_and_mismatched_variables_fail_closed(ct2):
    m = copy.copy(ct2)
    m.variables = dict(ct2.variables)
    m.variables["decoder/layer_0/mystery/weight"] = c2h.Ct2Variable("decoder/layer_0/mystery/weight", 4, (2,), np.zeros(2, np.float16))
    with pytest.raises(c2h.ConversionError, match=r"not mapped.*decoder/layer_0/mystery/weight"):
        c2h.convert_state_dict(m)

    m.variables = dict(ct2.variables)
    v = ct2.variables["encoder/layer_1/ffn/linear_1/bias"]
    m.variables[v.name] = c2h.Ct2Variable(v.name, 4, (383,), v.array[:383])
    with pytest.raises(c2h.ConversionError, match=r"encoder/layer_1/ffn/linear_1/bias: shape \[383\], expected \[384\]"):
        c2h.convert_state_dict(m)

    m.variables = dict(ct2.variables)
    v = ct2.variables["encoder/layer_0/self_attention/linear_0/bias"]
    bad = v.array.copy()
    bad[384 + 7] = 1.0  # a non-zero k bias cannot be represented in HF
    m.variables[v.name] = c2h.Ct2Variable(v.name, 4, v.shape, bad)
    with pytest.raises(c2h.ConversionError, match=r"linear_0/bias: the k part"):
        c2h.convert_state_dict(m)

    m.variables = dict(ct2.variables)
    del m.variables["decoder/layer_3/ffn/layer_norm/gamma"]
    with pytest.raises(c2h.ConversionError, match="decoder/layer_3/ffn/layer_norm/gamma"):
        c2h.convert_state_dict(m)

    m.variables = dict(ct2.variables)
    m.variables["decoder/scale_embeddings"] = c2h.Ct2Variable("decoder/scale_embeddings", 1, (), np.array(1, np.int8))
    with pytest.raises(c2h.ConversionError, match="decoder/scale_embeddings = 1"):
        c2h.convert_state_dict(m)


def test_truncated_or_trailing_bytes_fail_closed(ct2_dir, tmp_path):
    data = (ct2_dir / "model.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[: len(data) // 3])
    with pytest.raises(c2h.ConversionError, match=r"cut\.bin: truncated while reading"):
        c2h.read_ct2(tmp_path / "cut.bin")
    (tmp_path / "long.bin").write_bytes(data + b"\0\0\0\0\0")
    with pytest.raises(c2h.ConversionError, match="trailing bytes"):
        c2h.read_ct2(tmp_path / "long.bin")
    (tmp_path / "v7.bin").write_bytes(struct.pack("<I", 7) + data[4:])
    with pytest.raises(c2h.ConversionError, match="binary version 7 is not supported"):
        c2h.read_ct2(tmp_path / "v7.bin")


def test_up_to_date_check_is_cheap_and_exact(ct2_dir):
    stamp = c2h.expected_stamp(ct2_dir)
    assert c2h.is_up_to_date(TINY_EN, stamp)
    changed = json.loads(json.dumps(stamp))
    changed["inputs"]["model.bin"] = "0" * 64
    assert not c2h.is_up_to_date(TINY_EN, changed)
