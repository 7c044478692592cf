"""Relative position representations (Shaw et al. 2018) in the plugin's transformer: the attention against a slow
loop of the paper's equations, incremental decoding against the full pass, the degenerate case (zero tables) against
fairseq's own attention. (The option on a model, through fairseq's command line: tests/test_fairseq_cli.py.)"""

import pytest
import torch

pytest.importorskip("fairseq", reason="fairseq not installed: run `make install`")

from fairseq.modules import MultiheadAttention  # noqa: E402

from fairseq_plugin.relative_attention import RelativeMultiheadAttention  # noqa: E402

T, B, C, HEADS, K = 7, 3, 16, 4, 3


def attention(seed=0, k=K):
    torch.manual_seed(seed)
    return RelativeMultiheadAttention(C, HEADS, k).eval()


def slow_reference(attn, x, key_padding_mask=None, causal=False):
    """Shaw et al.'s equations, one (batch, head, query) at a time:
    e_ij = q_i . (k_j + a^K[clip(j - i)]) / sqrt(d), z_i = sum_j softmax(e)_ij (v_j + a^V[clip(j - i)])."""
    d = attn.head_dim
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)  # [T, B, C]
    out = torch.zeros(T, B, C)
    for b in range(B):
        for h in range(HEADS):
            cols = slice(h * d, (h + 1) * d)
            for i in range(T):
                scores = []
                for j in range(T):
                    r = max(-attn.max_relative_position, min(attn.max_relative_position, j - i))
                    s = (q[i, b, cols] @ (k[j, b, cols] + attn.relative_keys[r + attn.max_relative_position])) / d**0.5
                    masked = (causal and j > i) or (key_padding_mask is not None and bool(key_padding_mask[b, j]))
                    scores.append(torch.tensor(float("-inf")) if masked else s)
                p = torch.softmax(torch.stack(scores), 0)
                z = torch.zeros(d)
                for j in range(T):
                    r = max(-attn.max_relative_position, min(attn.max_relative_position, j - i))
                    z = z + p[j] * (v[j, b, cols] + attn.relative_values[r + attn.max_relative_position])
                out[i, b, cols] = z
    return attn.out_proj(out)


def causal_mask(n):
    return torch.triu(torch.full((n, n), float("-inf")), 1)


@torch.no_grad()
def test_equals_the_papers_equations_with_padding_and_a_causal_mask():
    attn = attention()
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, -2:] = True
    got, weights = attn(x, x, x, key_padding_mask=pad, need_weights=True)
    torch.testing.assert_close(got, slow_reference(attn, x, key_padding_mask=pad), rtol=1e-5, atol=1e-5)
    assert weights.shape == (B, T, T) and torch.all(weights[1, :, -2:] == 0)
    got = attn(x, x, x, attn_mask=causal_mask(T), need_weights=False)[0]
    torch.testing.assert_close(got, slow_reference(attn, x, causal=True), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_clipping_distance_matters_and_positions_clip_beyond_it():
    attn = attention(k=2)
    buckets = attn.relative_positions(4, 4, "cpu")
    assert buckets.tolist() == [[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]]
    assert attn.relative_positions(1, 4, "cpu").tolist() == [[0, 0, 1, 2]]  # a decoding step: the last query
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(2))
    near, far = attention(k=1), attention(k=5)
    far.load_state_dict(
        {**near.state_dict(), "relative_keys": far.relative_keys, "relative_values": far.relative_values}
    )
    with torch.no_grad():  # the same tables for distances up to 1, different beyond: other outputs
        far.relative_keys[4:7] = near.relative_keys
        far.relative_values[4:7] = near.relative_values
        far.relative_keys[:4] = near.relative_keys[0]
        far.relative_keys[7:] = near.relative_keys[2]
        far.relative_values[:4] = near.relative_values[0]
        far.relative_values[7:] = near.relative_values[2]
    torch.testing.assert_close(far(x, x, x)[0], near(x, x, x)[0])  # k=5 with tables constant beyond 1 == k=1


@torch.no_grad()
def test_incremental_decoding_equals_the_causal_pass():
    attn = attention(seed=3)
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(4))
    full = attn(x, x, x, attn_mask=causal_mask(T), need_weights=False)[0]
    state = {}
    steps = [
        attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)[0] for t in range(T)
    ]
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-5, atol=1e-5)
    # beam search reorders the cache: the same as decoding the reordered batch
    order = torch.tensor([2, 0, 1])
    attn.reorder_incremental_state(state, order)
    nxt = torch.randn(1, B, C, generator=torch.Generator().manual_seed(5))
    stepped = attn(nxt, nxt, nxt, incremental_state=state, need_weights=False)[0]
    seq = torch.cat([x[:, order], nxt])
    expected = attn(seq, seq, seq, attn_mask=causal_mask(T + 1), need_weights=False)[0][-1:]
    torch.testing.assert_close(stepped, expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_zero_tables_are_fairseqs_own_attention():
    attn = attention(seed=6)
    attn.relative_keys.zero_()
    attn.relative_values.zero_()
    plain = MultiheadAttention(C, HEADS, self_attention=True).eval()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("relative_")})
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(7))
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, -1] = True
    torch.testing.assert_close(
        attn(x, x, x, key_padding_mask=pad, attn_mask=causal_mask(T))[0],
        plain(x, x, x, key_padding_mask=pad, attn_mask=causal_mask(T))[0],
        rtol=1e-5,
        atol=1e-6,
    )


def test_bad_clipping_distance_is_refused():
    with pytest.raises(ValueError, match="--relative-positions must be >= 1"):
        RelativeMultiheadAttention(C, HEADS, 0)
