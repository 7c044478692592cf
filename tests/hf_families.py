"""Tiny configs of transformers' causal and seq2seq LM families, built offline from their config classes (for
tests/test_hf_families.py): every size field a family's config has set small, dropout off."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Dict, Optional, Tuple

VOCAB = 96
#: a tiny model has fewer parameters than this (else it is skipped, saying so)
MAX_PARAMETERS = 2_000_000
#: small values for the size fields configs use (each family's config takes those it has)
SIZES: Dict[str, Any] = {
    "vocab_size": VOCAB,
    "src_vocab_size": VOCAB,
    "tgt_vocab_size": VOCAB,
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "embed_dim": 32,
    "word_embed_proj_dim": 32,
    "intermediate_size": 64,
    "ffn_dim": 64,
    "d_ff": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "num_layers": 2,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "num_decoder_layers": 1,
    "num_attention_heads": 2,
    "n_head": 2,
    "n_heads": 2,
    "num_heads": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "d_kv": 16,
    "kv_channels": 16,
    "max_position_embeddings": 64,
    "n_positions": 64,
    "n_ctx": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 0,
    "forced_eos_token_id": None,
    "forced_bos_token_id": None,
}
#: the sizes and special ids of the tests' hand-made tiny seq2seq models (BART, FSMT; vocabulary sizes apart)
TINY_SEQ2SEQ: Dict[str, Any] = dict(
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=None,
)
#: families whose configs need more than :data:`SIZES`
_FALCON_H1 = {
    "mamba_d_ssm": 32,
    "mamba_n_heads": 2,
    "mamba_d_head": 16,
    "mamba_n_groups": 1,
    "mamba_d_state": 8,
    "mamba_chunk_size": 8,
    "mamba_expand": 1,
    "projectors_bias": False,
}
OVERRIDES: Dict[str, Dict[str, Any]] = {
    "fsmt": {"langs": ["en", "de"]},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "gptj": {"rotary_dim": 8},
    "codegen": {"rotary_dim": 8},
    "falcon_h1": _FALCON_H1,
    # variants: a family with its logits scaled after lm_head (refused)
    "granite_logits_scaling": {"logits_scaling": 8.0},
    "falcon_h1_lm_head_multiplier": {**_FALCON_H1, "lm_head_multiplier": 0.5},
}
#: families whose forward does not make decoder inputs from the labels (FSMT shifts its input_ids instead)
NEEDS_DECODER_INPUTS = {"fsmt"}
#: test cases that are a family with a changed setting: case -> family
VARIANTS = {"granite_logits_scaling": "granite", "falcon_h1_lm_head_multiplier": "falcon_h1"}


def _fields(config_class) -> Dict[str, Any]:
    """``{field: default}`` of a config class (a dataclass in transformers 5, keyword arguments before)."""
    if dataclasses.is_dataclass(config_class):
        out = {}
        for f in dataclasses.fields(config_class):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = None
            else:
                out[f.name] = None
        return out
    params = inspect.signature(config_class.__init__).parameters
    return {k: (None if p.default is inspect.Parameter.empty else p.default) for k, p in params.items()}


def model_class(model_type: str) -> Tuple[type, str]:
    """``(model class, "causal" | "seq2seq")`` that the Auto classes map ``model_type`` to (seq2seq first)."""
    import transformers
    from transformers.models.auto import modeling_auto

    for kind, names in (
        ("seq2seq", modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
        ("causal", modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
    ):
        if model_type in names:
            name = names[model_type]
            return getattr(transformers, name if isinstance(name, str) else name[0]), kind
    raise KeyError(model_type)


def _small(config_class) -> Dict[str, Any]:
    """The keyword arguments that make ``config_class`` small: the fields :data:`SIZES` names, every dropout off,
    and the same for each sub-config (a multimodal model's text and vision configs, T5Gemma's encoder and
    decoder)."""
    fields = _fields(config_class)
    kwargs = {k: v for k, v in SIZES.items() if k in fields}
    for k, default in fields.items():
        if ("dropout" in k or "pdrop" in k or k.endswith("_drop")) and isinstance(default, float):
            kwargs[k] = 0.0
    for name, sub in (getattr(config_class, "sub_configs", None) or {}).items():
        if isinstance(sub, type) and name in fields and sub is not config_class:
            kwargs[name] = _small(sub)
    return kwargs


def tiny_config(case: str):
    """The tiny config of family ``case`` (or of a variant, :data:`VARIANTS`): its config class with every field
    :data:`SIZES` names set small and every dropout off (sub-configs too)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[VARIANTS.get(case, case)]
    kwargs = _small(config_class)
    kwargs["decoder_start_token_id"] = 0  # (T5Config has no such field, and T5 reads it to shift the labels)
    kwargs.update(OVERRIDES.get(case, {}))
    return config_class(**kwargs)


def tiny_model(case: str, seed: int = 0):
    """``(model, kind)``: a seeded tiny model of ``case`` in eval mode, or ``(None, reason)`` where it cannot be
    built offline from its config class."""
    import torch

    family = VARIANTS.get(case, case)
    try:
        cls, kind = model_class(family)
        config = tiny_config(case)
        with torch.device("meta"):  # sizes first: a field SIZES does not know can leave a config far from tiny
            size = sum(p.numel() for p in cls(config).parameters())
        if size > MAX_PARAMETERS:
            return None, f"{case}: its tiny config still has {size:,} parameters (a size field SIZES does not set)"
        torch.manual_seed(seed)
        model = cls(config).eval()
    except Exception as e:  # noqa: BLE001 (the reason is printed by the skip)
        first = (str(e).splitlines() or [""])[0][:200]
        return None, f"{case}: its tiny config does not build ({type(e).__name__}: {first})"
    return model, kind


def all_families() -> list:
    """Every model type ``AutoModelForCausalLM`` / ``AutoModelForSeq2SeqLM`` map, sorted."""
    from transformers.models.auto import modeling_auto

    return sorted(
        set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        | set(modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
    )


def embedding_size(model) -> Optional[int]:
    """The input embedding's number of ids (None where it has none)."""
    emb = model.get_input_embeddings()
    return getattr(emb, "num_embeddings", None)
