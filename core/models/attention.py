"""Grouped-query attention on torch's scaled_dot_product_attention without repeating K/V; packed samples.

Registered with transformers' `AttentionInterface` as ``forgetui_sdpa`` (its masks are transformers'
own sdpa masks): the built-in backend and the local trainer load their models with it.

transformers' own "sdpa" attention repeats every K/V head `num_key_value_groups` times on the CPU
whenever a mask is given (`repeat_kv`: a copy of the whole KV cache per layer per decode step, a
quarter of a SmolLM2 decode step). Here a single-token query folds its heads onto the K/V head they
share (``[B, kv_heads, groups, dim]``: one plain attention per K/V head, the mask broadcast), and
longer queries use torch's ``enable_gqa``. Exact: the same sums, in the same precision.

Packed samples (several samples laid end to end in one row, no padding) pass ``segments``: a list
of (start, end) column ranges; each segment attends causally to itself only, one attention call
per segment, so no [tokens, tokens] mask is ever built (transformers would build one from reset
position ids). Written here because transformers' packed path on CPU materialises that mask.
A segment (start, end, context_start, context_end) also attends to every column of its context
(a prefix several samples share, laid once in the row): its keys are the context's then its own,
the mask all-visible over the context and causal over itself.
"""

from __future__ import annotations

from typing import Any

ATTENTION = "forgetui_sdpa"
_registered = False


def register() -> str:
    """Make ``forgetui_sdpa`` known to transformers (idempotent); returns the name to load models with."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ATTENTION, gqa_attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        _registered = True
    return ATTENTION


def gqa_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    segments: list[tuple[int, ...]] | None = None,
    **_: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature: query [B, H, Q, D], key/value [B, KV, S, D] → ([B, Q, H, D], None)."""
    import torch.nn.functional as F

    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, q_len, dim = query.shape
    gqa = {"enable_gqa": True} if groups > 1 else {}
    if segments is not None:
        parts = [_segment(query, key, value, segment, dropout, scaling, gqa) for segment in segments]
        out = parts[0] if len(parts) == 1 else _cat(parts)
    elif q_len == 1 and groups > 1:
        folded = query.reshape(batch, heads // groups, groups, dim)  # the heads that share a K/V head, side by side
        out = F.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling)
        out = out.reshape(batch, heads, 1, dim)
    else:
        causal = attention_mask is None and q_len > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=bool(causal), **gqa
        )
    return out.transpose(1, 2).contiguous(), None


def _segment(query: Any, key: Any, value: Any, segment: tuple[int, ...], dropout: float, scaling: float | None, gqa: dict[str, Any]) -> Any:
    """One segment's attention: causal over its own columns, after its context's (if any), all visible."""
    import torch
    import torch.nn.functional as F

    a, b = segment[0], segment[1]
    c, d = segment[2:4] if len(segment) == 4 else (0, 0)
    if d <= c:
        return F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout_p=dropout, scale=scaling, is_causal=True, **gqa
        )
    q, context = b - a, d - c
    mask = torch.ones(q, context + q, dtype=torch.bool, device=query.device).tril(context)
    keys = torch.cat((key[:, :, c:d], key[:, :, a:b]), dim=2)
    values = torch.cat((value[:, :, c:d], value[:, :, a:b]), dim=2)
    return F.scaled_dot_product_attention(query[:, :, a:b], keys, values, attn_mask=mask, dropout_p=dropout, scale=scaling, **gqa)


def _cat(parts: list[Any]) -> Any:
    import torch

    return torch.cat(parts, dim=2)
