"""Serving head models: the vLLM plugin (:mod:`hf_heads.serve.vllm`), which vLLM loads through the
``vllm.general_plugins`` entry point. Nothing here imports vLLM until vLLM calls :func:`register_vllm`."""


def register_vllm() -> None:
    """vLLM's plugin hook: register the head models' architectures (lazily, by module path)."""
    from hf_heads.serve.vllm import register

    register()
