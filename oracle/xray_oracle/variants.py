"""Reference variants: the HF reference with its weights (and optionally its linear inputs) on a
named number grid, a model-level counterfactual for engines that expose no op-level tensors
(docs/bring-your-own-engine.md, "Reference variants"). `xray oracle --weights-variant SCHEME`
writes the variant's dump; `xray compare REF GOT --variant DIR` reports the engine against both.

Schemes (applied in place after loading, before any hook is attached; nothing else changes):

- `int8`: every `nn.Linear` weight and the token embedding (tied to `proj_out`) on a symmetric
  int8 grid per output row, as CTranslate2 quantizes them (`scale = 127 / max|row|`, round half
  to even, `w = round(w * scale) / scale`; an all-zero row keeps scale 1). Convolutions, norms,
  biases and the positional table stay f32 (CTranslate2's Whisper does not quantize them).
- `int8_conv`: `int8` plus the two encoder convolutions per output channel.
- `int8_w8a8`: `int8` plus each `nn.Linear` input quantized per row (token) on a dynamic
  symmetric int8 grid (`127 / max|row|`), as an int8 GEMM's activations are.
- `f16`, `bf16`: every floating-point parameter rounded to that format (round to nearest even)
  and widened back.
"""
from __future__ import annotations

from .errors import OracleInputError

SCHEMES = {
    "int8": "weights int8 per row, symmetric (Linear + token embedding; CTranslate2's int8 weight grid)",
    "int8_conv": "weights int8 per row, symmetric (Linear + token embedding + conv1/conv2)",
    "int8_w8a8": "weights int8 per row, symmetric (Linear + token embedding), Linear inputs int8 per row, dynamic",
    "f16": "every floating-point parameter rounded to f16",
    "bf16": "every floating-point parameter rounded to bf16",
}


def check(scheme) -> None:
    if scheme is not None and scheme not in SCHEMES:
        raise OracleInputError(f"weights variant {scheme!r} is not one of {sorted(SCHEMES)}")


def _int8_rows(w):
    """`w` (rows x ...) on the symmetric per-row int8 grid, in its own dtype."""
    import torch

    flat = w.reshape(w.shape[0], -1).double()
    amax = flat.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, 127.0 / amax, torch.ones_like(amax))
    q = torch.round(flat * scale).clamp(-127, 127)  # torch.round: half to even
    return (q / scale).to(w.dtype).reshape(w.shape)


def _quantize_input(module, args):
    import torch

    x = args[0]
    amax = x.abs().amax(dim=-1, keepdim=True).double()
    scale = torch.where(amax > 0, 127.0 / amax, torch.ones_like(amax))
    xq = (torch.round(x.double() * scale).clamp(-127, 127) / scale).to(x.dtype)
    return (xq, *args[1:])


def apply(model, scheme: str) -> dict:
    """Put `model`'s weights on the scheme's grid in place; returns what was changed
    (`scheme`, `description`, `tensors`: how many, `modules`: their kinds, `max_abs_change`)."""
    import torch

    check(scheme)
    changed, kinds, worst = 0, set(), 0.0
    with torch.no_grad():
        if scheme in ("f16", "bf16"):
            dt = torch.float16 if scheme == "f16" else torch.bfloat16
            for _, p in model.named_parameters():
                if p.is_floating_point():
                    new = p.to(dt).to(p.dtype)
                    worst = max(worst, float((new - p).abs().max())) if p.numel() else worst
                    p.copy_(new)
                    changed += 1
            kinds.add("all parameters")
        else:
            seen = set()
            targets = []
            for name, m in model.named_modules():
                if isinstance(m, torch.nn.Linear):
                    targets.append((name, m, "Linear"))
                elif scheme == "int8_conv" and isinstance(m, torch.nn.Conv1d):
                    targets.append((name, m, "Conv1d"))
            emb = model.get_input_embeddings()
            targets.append(("embed_tokens", emb, "Embedding"))
            for _, m, kind in targets:
                w = m.weight
                if id(w) in seen:  # proj_out is tied to the token embedding: quantized once
                    kinds.add(kind)
                    continue
                seen.add(id(w))
                new = _int8_rows(w)
                worst = max(worst, float((new - w).abs().max()))
                w.copy_(new)
                changed += 1
                kinds.add(kind)
            if scheme == "int8_w8a8":
                for _, m, kind in targets:
                    if kind == "Linear":
                        # Lives as long as the loaded model (the cache key includes the scheme).
                        m.register_forward_pre_hook(_quantize_input)
                kinds.add("Linear inputs (dynamic)")
    return {
        "scheme": scheme,
        "description": SCHEMES[scheme],
        "tensors": changed,
        "modules": sorted(kinds),
        "max_abs_change": worst,
    }
