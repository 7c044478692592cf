"""The vLLM plugin's parts that need no vLLM (it runs in its own environment: `make test-serve`, tests_serve/): the
entry point vLLM finds, the module importing vLLM only when vLLM calls it, what it refuses in one line, and
`softmax-heads serve-check`'s own checks."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hf_heads.serve import vllm as plugin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def engine(architecture="SoftmaxHeadsLlamaForCausalLM", head="mos", tp=1, pp=1, lora=None, speculative=None):
    """What the plugin reads of vLLM's engine config."""
    text = SimpleNamespace(output_head={"name": head, "options": {}})
    hf_config = SimpleNamespace(get_text_config=lambda: text)
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=hf_config, architecture=architecture),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp),
        lora_config=lora,
        speculative_config=speculative,
    )


def test_the_entry_point_names_the_plugin_and_importing_it_loads_no_vllm():
    config = configparser.ConfigParser(interpolation=None)
    config.read(os.path.join(ROOT, "setup.cfg"))
    assert "softmax_heads = hf_heads.serve:register_vllm" in config["options.entry_points"]["vllm.general_plugins"]
    code = "import sys, hf_heads.serve.vllm, hf_heads.serve; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_a_served_head_on_a_served_family_on_one_device_is_not_refused():
    for head in plugin.SERVED_HEADS:
        for base in plugin.BASES:
            assert plugin.refusal(engine("SoftmaxHeads" + base, head)) == ""


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(head="class_softmax"),
            "SoftmaxHeadsLlamaForCausalLM with a class_softmax head: vLLM serves the heads whose forward gives the "
            "exact distribution (softmax, sigsoftmax, plif, mos, mos_plif, mixtape)",
        ),
        (dict(tp=2), "tensor_parallel_size=2, pipeline_parallel_size=1: the head is not sharded yet"),
        (dict(pp=2), "tensor_parallel_size=1, pipeline_parallel_size=2"),
        (dict(lora=object()), "LoRA adapters and speculative decoding would bypass the head"),
        (dict(speculative=object()), "LoRA adapters and speculative decoding would bypass the head"),
        (
            dict(architecture="SoftmaxHeadsGPT2LMHeadModel"),
            "SoftmaxHeadsGPT2LMHeadModel with a mos head: vLLM serves head models of the families LlamaForCausalLM",
        ),
    ],
)
def test_what_the_plugin_cannot_serve_exactly_is_refused_in_one_line(kwargs, message):
    problem = plugin.refusal(engine(**kwargs))
    assert message in problem and "\n" not in problem


def test_a_head_config_and_a_head_model_class_pickle_by_name_into_a_fresh_process():
    """vLLM's CPU engine starts its processes by spawn and pickles the config into them: a head config class (made
    per family when first needed) pickles by its name and unpickles in a process that never imported hf_heads."""
    import pickle

    transformers = pytest.importorskip("transformers")
    import hf_heads
    from hf_heads.hf import config as head_configs
    from hf_heads.hf.modeling import head_model_class

    config = hf_heads.head_config(
        transformers.LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=50), "mos"
    )
    model_class = head_model_class(transformers.LlamaForCausalLM)
    assert pickle.loads(pickle.dumps(model_class)) is model_class
    code = "import pickle, sys; c = pickle.load(sys.stdin.buffer); print(type(c).__name__, c.output_head['name'])"
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(config), capture_output=True, check=True, cwd=ROOT
    )
    assert out.stdout.decode().split() == ["SoftmaxHeadsLlamaConfig", "mos"]
    assert type(config).__module__ == "hf_heads.hf.config"
    with pytest.raises(AttributeError, match="has no attribute 'SoftmaxHeadsNotAConfig'"):
        head_configs.SoftmaxHeadsNotAConfig  # noqa: B018


def test_serve_check_refuses_bad_counts_and_names_the_missing_client(monkeypatch):
    """`softmax-heads serve-check` (compared against a real server in tests_serve/): its own checks, in one line."""
    from hf_heads.cli import serve_check

    with pytest.raises(SystemExit, match="--max-tokens must be >= 1, got 0"):
        serve_check.main(["--model", "m", "--max-tokens", "0"])
    with pytest.raises(SystemExit, match="--logprobs must be >= 1, got -2"):
        serve_check.main(["--model", "m", "--logprobs", "-2"])
    monkeypatch.setitem(sys.modules, "openai", None)  # as where the openai client is not installed
    with pytest.raises(SystemExit, match="through the openai client: pip install openai"):
        serve_check.ask("http://127.0.0.1:1/v1", "Hello", 1, 1)
