"""The Triton kernels of :mod:`.triton_rows` (its docstring says what they compute): imported on first use."""

try:  # (transformers' remote-code loader reads no import inside a try block: a saved model loads without triton)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton_rows.check_can_run refuses before this module is imported
    raise


@triton.jit
def _scores(
    z,
    scale,
    softcap,
    before_ptr,
    slopes_ptr,
    knot_range,
    num_knots,
    HAS_SCALE: tl.constexpr,
    HAS_CAP: tl.constexpr,
    KIND: tl.constexpr,
):
    """``(s, ds/dz, bin, frac)`` of float32 logits ``z``: s = f(m(z)); bin and frac only for PLIF (else 0)."""
    y = z
    dy = z * 0.0 + 1.0
    if HAS_SCALE:
        y = y * scale
        dy = dy * scale
    if HAS_CAP:
        # tanh(u) = 1 - q = r - 1, q = 2 / (e^2u + 1), r = 2 e^2u / (e^2u + 1), and 1 - tanh^2 = q r without the
        # cancellation of 1 - th^2 near +-1 (no libdevice: the interpreter lacks it; |u| <= 20: tanh is +-1 in fp32)
        u = tl.minimum(tl.maximum(y / softcap, -20.0), 20.0)
        e = tl.exp(2.0 * u)
        q = 2.0 / (e + 1.0)
        r = 2.0 * e / (e + 1.0)
        y = softcap * tl.where(u >= 0.0, 1.0 - q, r - 1.0)
        dy = dy * (q * r)
    bins = (z * 0.0).to(tl.int32)
    frac = z * 0.0
    if KIND == 1:  # sigsoftmax: 2y - softplus(y), derivative 1 + sigmoid(-y)
        softplus = tl.maximum(y, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(y)))
        dy = dy * (1.0 + 1.0 / (1.0 + tl.exp(y)))
        y = 2.0 * y - softplus
    if KIND == 2:  # PLIF: f = D (sum_{j<bin} s_j + s_bin frac) - R, f' = s_bin
        u = (y + knot_range) * (num_knots / (2.0 * knot_range))
        bins = tl.minimum(tl.maximum(u, 0.0), num_knots - 1.0).to(tl.int32)  # (truncation: floor of u >= 0)
        frac = u - bins.to(tl.float32)
        slope = tl.load(slopes_ptr + bins)
        y = tl.load(before_ptr + bins) + slope * frac * (2.0 * knot_range / num_knots)
        dy = dy * slope
    return y, dy, bins, frac


@triton.jit
def _stats_kernel(
    logits_ptr,
    stride,
    target_ptr,
    lse_ptr,
    target_score_ptr,
    score_sum_ptr,
    vocab_size,
    scale,
    softcap,
    before_ptr,
    slopes_ptr,
    knot_range,
    num_knots,
    HAS_SCALE: tl.constexpr,
    HAS_CAP: tl.constexpr,
    KIND: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    m = float("-inf")
    total = 0.0
    score_sum = 0.0
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < vocab_size
        z = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
        s, _, _, _ = _scores(z, scale, softcap, before_ptr, slopes_ptr, knot_range, num_knots, HAS_SCALE, HAS_CAP, KIND)
        score_sum += tl.sum(tl.where(mask, s, 0.0), axis=0)
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new), axis=0)
        m = m_new
    t = tl.load(target_ptr + row)
    zt = tl.load(base + t).to(tl.float32)
    st, _, _, _ = _scores(zt, scale, softcap, before_ptr, slopes_ptr, knot_range, num_knots, HAS_SCALE, HAS_CAP, KIND)
    tl.store(lse_ptr + row, m + tl.log(total))
    tl.store(target_score_ptr + row, st)
    tl.store(score_sum_ptr + row, score_sum)


@triton.jit
def _grads_kernel(
    logits_ptr,
    stride,
    target_ptr,
    lse_ptr,
    weight_ptr,
    per_bin_ptr,
    at_bin_ptr,
    vocab_size,
    smoothing,
    scale,
    softcap,
    before_ptr,
    slopes_ptr,
    knot_range,
    num_knots,
    HAS_SCALE: tl.constexpr,
    HAS_CAP: tl.constexpr,
    KIND: tl.constexpr,
    SLOPE_GRADS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    lse = tl.load(lse_ptr + row)
    w = tl.load(weight_ptr + row)
    t = tl.load(target_ptr + row)
    for start in range(0, vocab_size, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < vocab_size
        z = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
        s, dz, bins, frac = _scores(
            z, scale, softcap, before_ptr, slopes_ptr, knot_range, num_knots, HAS_SCALE, HAS_CAP, KIND
        )
        g = tl.exp(s - lse) - smoothing / vocab_size
        g = tl.where(offs == t, g - (1.0 - smoothing), g) * w
        if SLOPE_GRADS:
            tl.atomic_add(per_bin_ptr + bins, g, mask=mask)
            tl.atomic_add(at_bin_ptr + bins, g * frac, mask=mask)
        tl.store(base + offs, (g * dz).to(logits_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tree_priors(gates_ptr, shared_ptr, gate_bias_ptr, row, offs, mask, num_ids, K: tl.constexpr, LEVELS: tl.constexpr):
    """The K leaf priors ``[K, BLOCK_S]`` of row ``row``'s ids ``offs`` (Mixtape's sigmoid tree, heap order: node
    ``2^t - 1 + (k >> (L - t))`` at depth t on leaf k's path, left where bit ``L - 1 - t`` of k is 0)."""
    leaves = tl.arange(0, K)
    pi = (leaves[:, None] + offs[None, :]) * 0.0 + 1.0
    for t in tl.static_range(LEVELS):
        p, q, bit = _tree_gate(gates_ptr, shared_ptr, gate_bias_ptr, row, offs, mask, num_ids, leaves, t, K, LEVELS)
        pi = pi * tl.where(bit[:, None] == 0, p, q)
    return pi


@triton.jit
def _tree_gate(
    gates_ptr,
    shared_ptr,
    gate_bias_ptr,
    row,
    offs,
    mask,
    num_ids,
    leaves,
    t: tl.constexpr,
    K: tl.constexpr,
    LEVELS: tl.constexpr,
):
    """``(sigmoid(l), sigmoid(-l), bit)`` ``[K, BLOCK_S]`` of the gate at depth ``t`` on each leaf's path:
    ``l = gates[row, node, id] + shared[row, node] + gate_bias[id, node]`` (float32), ``bit`` 0 where the leaf is
    left of it."""
    node = (1 << t) - 1 + (leaves >> (LEVELS - t))
    bit = (leaves >> (LEVELS - 1 - t)) & 1
    m2 = mask[None, :] & (node[:, None] >= 0)
    g = tl.load(gates_ptr + (row * (K - 1) + node[:, None]) * num_ids + offs[None, :], mask=m2, other=0.0)
    u = tl.load(shared_ptr + row * (K - 1) + node).to(tl.float32)
    b = tl.load(gate_bias_ptr + offs[None, :] * (K - 1) + node[:, None], mask=m2, other=0.0)
    gate = g.to(tl.float32) + u[:, None] + b.to(tl.float32)
    return 1.0 / (1.0 + tl.exp(-gate)), 1.0 / (1.0 + tl.exp(gate)), bit


@triton.jit
def _tree_mix_kernel(
    comp_ptr,
    gates_ptr,
    shared_ptr,
    gate_bias_ptr,
    bias_ptr,
    out_ptr,
    num_ids,
    HAS_BIAS: tl.constexpr,
    K: tl.constexpr,
    LEVELS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """``out[row, id] = sum_k pi_k comp[row, k, id] (+ bias[id])``: Mixtape's gated logits of its frequent ids."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    mask = offs < num_ids
    pi = _tree_priors(gates_ptr, shared_ptr, gate_bias_ptr, row, offs, mask, num_ids, K, LEVELS)
    leaves = tl.arange(0, K)
    m2 = mask[None, :] & (leaves[:, None] >= 0)
    c = tl.load(comp_ptr + (row * K + leaves[:, None]) * num_ids + offs[None, :], mask=m2, other=0.0)
    z = tl.sum(pi * c.to(tl.float32), axis=0)
    if HAS_BIAS:
        z += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * num_ids + offs, z.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tree_mix_backward_kernel(
    comp_ptr,
    gates_ptr,
    shared_ptr,
    gate_bias_ptr,
    grad_ptr,
    num_ids,
    K: tl.constexpr,
    LEVELS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """In place: ``comp`` becomes ``dz pi_k``, ``gates`` ``dz dz/dl_j``, with ``dpi_k / dl_j = pi_k sigmoid(-l_j)``
    for the leaves left of node j and ``-pi_k sigmoid(l_j)`` for those right of it (summed over j's leaves)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    mask = offs < num_ids
    leaves = tl.arange(0, K)
    m2 = mask[None, :] & (leaves[:, None] >= 0)
    pi = _tree_priors(gates_ptr, shared_ptr, gate_bias_ptr, row, offs, mask, num_ids, K, LEVELS)
    comp_at = comp_ptr + (row * K + leaves[:, None]) * num_ids + offs[None, :]
    mixed = pi * tl.load(comp_at, mask=m2, other=0.0).to(tl.float32)  # pi_k c_k
    dz = tl.load(grad_ptr + row * num_ids + offs, mask=mask, other=0.0).to(tl.float32)
    for t in tl.static_range(LEVELS):  # each depth's gates are read (for p) before they are overwritten
        p, q, bit = _tree_gate(gates_ptr, shared_ptr, gate_bias_ptr, row, offs, mask, num_ids, leaves, t, K, LEVELS)
        term = tl.reshape(mixed * tl.where(bit[:, None] == 0, q, -p), (1 << t, K >> t, BLOCK_S))
        nodes = (1 << t) - 1 + tl.arange(0, 1 << t)
        at = gates_ptr + (row * (K - 1) + nodes[:, None]) * num_ids + offs[None, :]
        m3 = mask[None, :] & (nodes[:, None] >= 0)
        tl.store(at, (tl.sum(term, axis=1) * dz[None, :]).to(gates_ptr.dtype.element_ty), mask=m3)
    tl.store(comp_at, (pi * dz[None, :]).to(comp_ptr.dtype.element_ty), mask=m2)
