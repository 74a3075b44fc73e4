"""Reference variants (`xray_oracle.variants`): the int8 grid is CTranslate2's per-row symmetric
one, ties to the token embedding are quantized once, convolutions only in `int8_conv`, Linear
inputs only in `int8_w8a8`, f16/bf16 round every parameter; unknown schemes are refused."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from xray_oracle.errors import OracleInputError  # noqa: E402
from xray_oracle.variants import _int8_rows, apply, check  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Embedding(11, 6)
        self.conv = torch.nn.Conv1d(6, 6, 3)
        self.fc = torch.nn.Linear(6, 5)
        self.out = torch.nn.Linear(6, 11, bias=False)
        self.out.weight = self.emb.weight  # tied, as Whisper's proj_out
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g)

    def get_input_embeddings(self):
        return self.emb


def ct2_int8(w: np.ndarray) -> np.ndarray:
    """CTranslate2's quantizer (specs/model_spec.py): scale = 127 / amax per row, rint, int8."""
    amax = np.abs(w).max(axis=1)
    amax[amax == 0] = 127.0
    scale = 127.0 / amax
    q = np.rint(w * scale[:, None]).astype(np.int8)
    return q.astype(np.float64) / scale[:, None]


def test_int8_rows_is_ctranslate2s_grid():
    w = torch.randn(7, 13, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w[3] = 0.0
    np.testing.assert_allclose(_int8_rows(w).numpy(), ct2_int8(w.numpy()), rtol=0, atol=1e-12)


def test_int8_changes_linear_and_the_tied_embedding_once_not_the_conv():
    m = Tiny()
    conv0, fc0, emb0 = m.conv.weight.clone(), m.fc.weight.clone(), m.emb.weight.clone()
    info = apply(m, "int8")
    assert info["tensors"] == 2 and info["modules"] == ["Embedding", "Linear"], info
    assert torch.equal(m.conv.weight, conv0)
    assert torch.equal(m.fc.weight, _int8_rows(fc0)) and torch.equal(m.emb.weight, _int8_rows(emb0))
    assert m.out.weight is m.emb.weight
    assert 0 < info["max_abs_change"] < 0.1


def test_int8_conv_and_w8a8():
    m = Tiny()
    assert apply(m, "int8_conv")["modules"] == ["Conv1d", "Embedding", "Linear"]
    m = Tiny()
    x = torch.randn(2, 6, generator=torch.Generator().manual_seed(2))
    plain = torch.nn.functional.linear(x, _int8_rows(m.fc.weight.clone()), m.fc.bias)
    apply(m, "int8_w8a8")
    got = m.fc(x)
    assert not torch.equal(got, plain)  # the input was put on its per-row int8 grid
    xq = torch.stack([torch.tensor(ct2_int8(r[None].double().numpy())[0], dtype=torch.float32) for r in x])
    torch.testing.assert_close(got, torch.nn.functional.linear(xq, m.fc.weight, m.fc.bias))


@pytest.mark.parametrize("scheme,dt", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_schemes_round_every_parameter(scheme, dt):
    m = Tiny()
    before = {n: p.clone() for n, p in m.named_parameters()}
    apply(m, scheme)
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n].to(dt).to(torch.float32)), n


def test_unknown_scheme_is_refused():
    with pytest.raises(OracleInputError, match="int4"):
        check("int4")
