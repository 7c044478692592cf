"""Self-attention with relative position representations (Shaw, Uszkoreit and Vaswani 2018, "Self-attention with
relative position representations"), which the Mixtape paper's WMT'14 transformer uses (its reference [16]).

Each self-attention layer learns two tables of ``2k + 1`` vectors of the head size, shared by its heads: ``a^K`` and
``a^V``, indexed by the key's position relative to the query's, clipped to ``[-k, k]``::

    e_ij = q_i . (k_j + a^K[clip(j - i)]) / sqrt(d_head)
    z_i  = sum_j softmax_j(e_ij) (v_j + a^V[clip(j - i)])

as the authors' tensor2tensor code does it (``dot_product_attention_relative``; its ``transformer_relative`` uses
k = 20 and no absolute positions). Both terms are computed without a ``[T, S, d_head]`` tensor: queries against the
``2k + 1`` key vectors, gathered per (i, j); attention weights summed into the ``2k + 1`` buckets, times ``a^V``.
Incremental decoding (``fairseq-generate``) keeps the keys and values as fairseq's own attention does; the query of a
step is at position ``len(keys) - 1``.

``--relative-positions K`` (``head_transformer`` and ``head_transformer_lm`` architectures) replaces the
self-attention of every encoder and decoder layer; encoder-decoder attention stays as it is. Add
``--no-token-positional-embeddings`` for the paper's model (relative positions only, as tensor2tensor).
"""
# no `from __future__ import annotations`: fairseq reads the dataclass annotations as real types

from typing import Dict, Optional, Tuple

import torch
from fairseq import utils
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn


class RelativeMultiheadAttention(MultiheadAttention):
    """fairseq's self-attention plus relative position keys and values, clipped at ``max_relative_position``."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        max_relative_position: int,
        dropout: float = 0.0,
        bias: bool = True,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
    ):
        if max_relative_position < 1:
            raise ValueError(
                f"--relative-positions must be >= 1 (the clipping distance k), got {max_relative_position}"
            )
        super().__init__(
            embed_dim,
            num_heads,
            dropout=dropout,
            bias=bias,
            self_attention=True,
            q_noise=q_noise,
            qn_block_size=qn_block_size,
        )
        self.max_relative_position = max_relative_position
        self.relative_keys = nn.Parameter(torch.empty(2 * max_relative_position + 1, self.head_dim))
        self.relative_values = nn.Parameter(torch.empty(2 * max_relative_position + 1, self.head_dim))
        nn.init.xavier_uniform_(self.relative_keys)
        nn.init.xavier_uniform_(self.relative_values)

    def relative_positions(self, tgt_len: int, src_len: int, device) -> Tensor:
        """``[tgt_len, src_len]`` bucket of each (query, key): ``clip(j - i, -k, k) + k``; queries are the last
        ``tgt_len`` of the ``src_len`` positions (all of them but in incremental decoding)."""
        k = self.max_relative_position
        queries = torch.arange(src_len - tgt_len, src_len, device=device)
        keys = torch.arange(src_len, device=device)
        return (keys[None, :] - queries[:, None]).clamp(-k, k) + k

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Self-attention over ``query`` (``T x B x C``, fairseq's layout; ``key`` and ``value`` are the same
        tensor), with fairseq's masks: ``key_padding_mask`` ``[B, S]`` True at pads, ``attn_mask`` ``[T, S]``
        added to the scores (the decoder's future mask)."""
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.shape
        heads, head_dim = self.num_heads, self.head_dim

        def split(x: Tensor) -> Tensor:  # [T, B, C] -> [B * heads, T, head_dim]
            return x.contiguous().view(-1, bsz * heads, head_dim).transpose(0, 1)

        q = split(self.q_proj(query) * self.scaling)
        k, v = split(self.k_proj(query)), split(self.v_proj(query))
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                k = torch.cat([saved["prev_key"].view(bsz * heads, -1, head_dim), k], dim=1)
                v = torch.cat([saved["prev_value"].view(bsz * heads, -1, head_dim), v], dim=1)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz,
                src_len=k.size(1),
                static_kv=False,
            )
            saved["prev_key"] = k.view(bsz, heads, -1, head_dim)
            saved["prev_value"] = v.view(bsz, heads, -1, head_dim)
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)
        src_len = k.size(1)
        buckets = self.relative_positions(tgt_len, src_len, q.device).expand(bsz * heads, tgt_len, src_len)

        scores = torch.bmm(q, k.transpose(1, 2))
        scores = scores + torch.gather(torch.matmul(q, self.relative_keys.t()), 2, buckets)  # q_i . a^K_ij
        if attn_mask is not None:
            scores = scores + attn_mask.unsqueeze(0)
        if key_padding_mask is not None and key_padding_mask.dim() > 0:
            scores = (
                scores.view(bsz, heads, tgt_len, src_len)
                .masked_fill(key_padding_mask[:, None, None, :].to(torch.bool), float("-inf"))
                .view(bsz * heads, tgt_len, src_len)
            )
        if before_softmax:
            return scores, v
        weights_float = utils.softmax(scores, dim=-1, onnx_trace=self.onnx_trace)
        probs = self.dropout_module(weights_float.type_as(scores))
        per_bucket = probs.new_zeros(bsz * heads, tgt_len, self.relative_values.shape[0]).scatter_add_(
            2, buckets, probs
        )
        attn = torch.bmm(probs, v) + torch.matmul(per_bucket, self.relative_values)  # + sum_j p_ij a^V_ij
        attn = self.out_proj(attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim))
        weights: Optional[Tensor] = None
        if need_weights:
            weights = weights_float.view(bsz, heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return attn, weights


def use_relative_positions(
    model: nn.Module, max_relative_position: int, q_noise: float = 0.0, qn_block_size: int = 8
) -> int:
    """Replace every self-attention of ``model`` (fairseq ``MultiheadAttention`` with ``self_attention=True``) by a
    :class:`RelativeMultiheadAttention` of the same size and dropout, freshly initialised (``q_noise`` /
    ``qn_block_size``: fairseq's ``--quant-noise-pq`` options of the model); returns how many."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is MultiheadAttention and child.self_attention:
                if child.kdim != child.embed_dim or child.vdim != child.embed_dim or child.bias_k is not None:
                    raise ValueError(
                        "--relative-positions: a self-attention with other key / value sizes or "
                        "add_bias_kv is not supported"
                    )
                setattr(
                    parent,
                    name,
                    RelativeMultiheadAttention(
                        child.embed_dim,
                        child.num_heads,
                        max_relative_position,
                        dropout=child.dropout_module.p,
                        bias=child.q_proj.bias is not None,
                        q_noise=q_noise,
                        qn_block_size=qn_block_size,
                    ),
                )
                replaced += 1
    return replaced
