"""Liger Kernel's fused linear cross-entropy on head models: the head trains, never a softmax over its embedding.

Liger replaces ``model.forward`` by one that projects through ``lm_head.weight``; a head model keeps its own forward
(whose loss is the head's lean NLL) and refuses a model class whose forward Liger patched (hf_heads/hf/liger.py).
Liger's GPU kernels (RMSNorm, RoPE, SwiGLU) are switched off: applying Liger, which is what could bypass the head,
runs on CPU.
"""

import tempfile
import warnings

import pytest
import torch

import hf_heads

liger = pytest.importorskip(
    "liger_kernel.transformers",
    reason="liger-kernel not installed: `make install` installs "
    "it on Linux x86_64 with Python >= 3.11 (the clients extra)",
)

from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

GPU_KERNELS_OFF = {"rope": False, "rms_norm": False, "swiglu": False}
HEAD_PARAMS = ("gate_embedding", "gate_proj", "context_proj")


def llama_head_model():
    torch.manual_seed(0)
    base = LlamaConfig(
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=60,
        max_position_embeddings=64,
    )
    config = hf_heads.head_config(base, "mixtape", num_gates=4, gate_embedding_size=8, gate_noise=0.0)
    return AutoModelForCausalLM.from_config(config)


def head_nll(model, ids):
    """The head's own mean NLL of the next tokens: its log-probs (the model's logits) gathered, no Liger involved."""
    with torch.no_grad():
        log_probs = model.eval()(input_ids=ids).logits[:, :-1]
    model.train()
    return -log_probs.gather(-1, ids[:, 1:, None]).mean()


def head_params(model):
    head = hf_heads.output_head(model)
    return {n: p.detach().clone() for n, p in head.named_parameters() if n.split(".")[0] in HEAD_PARAMS}


def assert_moved(before, model):
    after = head_params(model)
    assert set(before) == set(after) and len(before) >= 3
    for name in before:
        assert (after[name] - before[name]).abs().max() > 1e-6, f"{name} did not move"


def test_apply_to_model_keeps_the_heads_forward_and_trains_the_head():
    model = llama_head_model()
    ids = torch.randint(0, 60, (2, 9), generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="fused linear cross-entropy was not installed.*mixtape head"):
        liger.apply_liger_kernel_to_llama(model=model, fused_linear_cross_entropy=True, **GPU_KERNELS_OFF)
    assert "forward" not in model.__dict__  # Liger's forward was kept out
    expected = head_nll(model, ids)
    before = head_params(model)
    loss = model.train()(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert_moved(before, model)


def test_class_patched_by_liger_is_refused_at_construction():
    class MyLlama(modeling_llama.LlamaForCausalLM):  # a class no head model was built on yet
        pass

    original = modeling_llama.LlamaForCausalLM.forward
    try:
        liger.apply_liger_kernel_to_llama(fused_linear_cross_entropy=True, **GPU_KERNELS_OFF)
        assert modeling_llama.LlamaForCausalLM.forward is not original
        base = MyLlama(
            LlamaConfig(
                num_hidden_layers=1,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=2,
                num_key_value_heads=2,
                vocab_size=60,
            )
        )
        with pytest.raises(
            ValueError,
            match=r"^MyLlama.forward is Liger's fused linear cross-entropy forward.*"
            r"fused_linear_cross_entropy=False",
        ):
            hf_heads.swap_head(base, "mos")
    finally:
        modeling_llama.LlamaForCausalLM.forward = original


def test_trainer_use_liger_kernel_trains_the_head():
    model = llama_head_model()
    ids = torch.randint(0, 60, (4, 9), generator=torch.Generator().manual_seed(2))
    rows = [{"input_ids": r, "labels": r} for r in ids]  # one batch: whatever the sampler's order, the first step's
    expected = head_nll(model, ids)  # loss is the head's mean NLL of all four rows
    before = head_params(model)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            use_liger_kernel=True,
            liger_kernel_config=GPU_KERNELS_OFF,
            per_device_train_batch_size=4,
            max_steps=2,
            learning_rate=1e-2,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            prediction_loss_only=True,
            seed=0,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows)
            trainer.train()
        assert any("fused linear cross-entropy was not installed" in str(w.message) for w in caught)
        evaluated = trainer.evaluate()  # Trainer passes Liger's skip_logits=True here
    assert_moved(before, model)
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert torch.isfinite(torch.tensor(evaluated["eval_loss"]))
