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
