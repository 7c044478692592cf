"""TRL's trainers train the head (not a softmax over its output embedding): real trl, a tiny GPT-2, a few steps.

TRL replaces ``model.forward`` by a fused LM head that projects through ``get_output_embeddings().weight``; a head
model keeps its own forward, which answers TRL's ``fused_lm_head=True`` calls with the head (hf_heads/hf/trl.py).
Also: :meth:`OutputHead.token_log_probs`, the memory-lean per-token log-probs those calls use.
"""

import copy
import random

import pytest
import torch

import hf_heads

trl = pytest.importorskip(
    "trl", reason="trl not installed: `make install` installs it on Python >= 3.11 (the clients extra)"
)
datasets = pytest.importorskip("datasets", reason="datasets comes with trl: run `make install`")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast  # noqa: E402

import hf_heads.hf.trl as head_trl  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]
HEADS = {
    "mixtape": {"num_gates": 4, "gate_embedding_size": 8, "gate_noise": 0.0},
    "mos": {"num_components": 2},
    "plif": {"num_knots": 100},
}


def tokenizer():
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def head_model(name):
    torch.manual_seed(0)
    base = GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=len(WORDS) + 4,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return AutoModelForCausalLM.from_config(hf_heads.head_config(base, name, **HEADS.get(name, {})))


#: what every trainer here runs with: the CPU, float32, seed 0, nothing saved or reported
ON_THE_CPU = {"report_to": [], "use_cpu": True, "save_strategy": "no", "seed": 0, "bf16": False}


def head_parameters(model):
    return {n: p.detach().clone() for n, p in model.lm_head.named_parameters()}


def assert_every_head_parameter_moved(model, before):
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in model.lm_head.named_parameters()}
    assert all(v > 0 for v in moved.values()), moved  # (had anything bypassed the head, they would stay put)


def sentences(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(n)]


@pytest.fixture
def spy(monkeypatch):
    """Records every fused call TRL makes (its inputs, its per-token log-probs, the model as it was then); check()
    compares them afterwards with the head's own: the model's plain forward, whose logits are the head's log-probs
    and whose loss is their NLL. (Nothing runs inside the trainer's step but the call itself.)"""
    calls = []
    original = head_trl.fused_forward

    def recording(model, base_forward, args, kwargs):
        out = original(model, base_forward, args, kwargs)
        calls.append(
            {
                "model": copy.deepcopy(model).eval(),
                "args": args,
                "kwargs": dict(kwargs),
                "log_probs": out.log_probs.detach().clone(),
                "loss": out.loss.detach().clone(),
            }
        )
        return out

    def check():
        for call in calls:
            model, kwargs = call["model"], call["kwargs"]
            labels = kwargs["labels"]
            inputs = {k: v for k, v in kwargs.items() if k not in ("labels", "shift_labels", "num_items_in_batch")}
            with torch.no_grad():
                lp = model(*call["args"], **inputs).logits[:, :-1]
                call["nll_sum"] = model(*call["args"], **inputs, labels=labels, num_items_in_batch=1).loss
            target = labels[:, 1:]
            mask = target != -100
            expected = lp.gather(-1, target.clamp(min=0)[..., None]).squeeze(-1).masked_fill(~mask, 0.0)
            torch.testing.assert_close(call["log_probs"], expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(-call["log_probs"].sum(), call["nll_sum"], rtol=1e-5, atol=1e-5)
        return calls

    monkeypatch.setattr(head_trl, "fused_forward", recording)
    return check


@pytest.mark.parametrize("name", sorted(HEADS))
def test_sft_trainer_trains_the_head_and_logs_its_loss(tmp_path, spy, name):
    model = head_model(name)
    before = head_parameters(model)
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        logging_steps=1,
        **ON_THE_CPU,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        processing_class=tokenizer(),
        train_dataset=datasets.Dataset.from_dict({"text": sentences(24, 0)}),
    )
    counts = []  # the token count Trainer divides each step's summed loss by
    compute_loss = trainer.compute_loss
    trainer.compute_loss = lambda *a, num_items_in_batch=None, **k: (
        counts.append(num_items_in_batch) or compute_loss(*a, num_items_in_batch=num_items_in_batch, **k)
    )
    trainer.train()
    assert_every_head_parameter_moved(model, before)
    first = trainer.state.log_history[0]
    calls = spy()
    assert len(calls) >= 3
    assert first["loss"] == pytest.approx(calls[0]["nll_sum"].item() / float(counts[0]), rel=1e-4)  # the head's NLL
    assert 0 < first["entropy"] <= torch.log(torch.tensor(float(len(WORDS) + 4))).item() + 1e-4


def test_sft_metrics_are_the_heads_entropy_and_accuracy():
    model = head_model("mos").eval()
    trl.trainer.utils.add_fused_lm_head(
        model, outputs=("log_probs", "entropy", "is_top1", "log_sum_sq_probs", "mean_logits")
    )
    ids = torch.randint(4, len(WORDS) + 4, (2, 9))
    labels = ids.clone()
    labels[0, :3] = -100
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        lp = model(input_ids=ids).logits[:, :-1]
    mask = labels[:, 1:] != -100
    assert torch.equal(out.label_mask, mask)
    torch.testing.assert_close(out.entropy, (-(lp.exp() * lp).sum(-1)).masked_fill(~mask, 0), rtol=1e-5, atol=1e-6)
    assert torch.equal(out.is_top1, (lp.argmax(-1) == labels[:, 1:]) & mask)
    torch.testing.assert_close(out.log_sum_sq_probs, torch.logsumexp(2 * lp, -1).masked_fill(~mask, 0))
    torch.testing.assert_close(out.mean_logits, lp.mean(-1).masked_fill(~mask, 0))


def test_dpo_trainer_scores_chosen_and_rejected_with_the_head(tmp_path, spy):
    model = head_model("mixtape")
    before = head_parameters(model)
    prompts, chosen, rejected = sentences(8, 1), sentences(8, 2), sentences(8, 3)
    data = datasets.Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})
    args = trl.DPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        logging_steps=1,
        **ON_THE_CPU,
    )
    trainer = trl.DPOTrainer(
        model=model, ref_model=copy.deepcopy(model), args=args, processing_class=tokenizer(), train_dataset=data
    )  # the reference is the head model as it starts
    trainer.train()
    assert len(spy()) >= 2  # policy (and reference) log-probs came through the head's fused forward
    assert_every_head_parameter_moved(model, before)
    assert "logps/chosen" in trainer.state.log_history[0]


def test_a_head_with_an_aux_loss_is_refused_when_the_trainer_is_built(tmp_path):
    model = head_model("ds_softmax")
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=1, **ON_THE_CPU)
    with pytest.raises(
        ValueError,
        match=r"^SFTTrainer: the ds_softmax head has an auxiliary loss .* that TRL's "
        r"losses do not include",
    ):
        trl.SFTTrainer(
            model=model,
            args=args,
            processing_class=tokenizer(),
            train_dataset=datasets.Dataset.from_dict({"text": sentences(4, 0)}),
        )


@pytest.mark.parametrize("name", sorted(HEADS))
def test_token_log_probs_equal_the_heads_log_probs_and_keep_no_vocabulary_wide_tensor(name):
    """Lean per-token log-probs (chunks under checkpoint): the values and every gradient of a weighted sum equal the
    plain path's, at temperature 1 and 2; what autograd keeps for backward has no [tokens, V] tensor."""
    torch.manual_seed(0)
    vocab, n = 300, 40
    head = hf_heads.build_head(name, hidden_size=8, vocab_size=vocab, dropout=0.2, **HEADS[name]).train()
    head.lean_chunk_tokens = lambda: 16  # three chunks, one partial
    hidden = torch.randn(4, n // 4, 8, requires_grad=True)
    target = torch.randint(0, vocab, (4, n // 4))
    target[0, :3] = -100
    weights = torch.randn(target.shape)
    for temperature in (1.0, 2.0):
        results = []
        for lean in (True, False):
            head.lean_loss = lean
            head.zero_grad()
            hidden.grad = None
            saved = []
            torch.manual_seed(1)
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
                lp = head.token_log_probs(hidden, target, temperature=temperature)
            (lp * weights).sum().backward()
            grads = [hidden.grad.clone()] + [p.grad.clone() for p in head.parameters() if p.grad is not None]
            results.append((lp.detach(), grads, max(saved)))
        (lean_lp, lean_grads, lean_saved), (ref_lp, ref_grads, ref_saved) = results
        assert torch.equal(lean_lp[0, :3], torch.zeros(3))
        torch.testing.assert_close(lean_lp, ref_lp, rtol=1e-5, atol=1e-6)
        for a, b in zip(lean_grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert ref_saved >= (n - 3) * vocab > lean_saved  # the plain path keeps [tokens, V]; the lean one does not


# ----------------------------------------------------------------------------- the audit: TRL's options on a head
# Each row of docs/huggingface.md's TRL table is a test here: the trainer's own per-token log-probs equal the head's
# (tests/trl_check.py), and the head's own parameters move under TRL's loss; or the option is refused in one line
# when the trainer is built.

from trl_check import assert_trainer_scores_with_the_head  # noqa: E402


#: the trunk of the tiny Llama and Mixtral models below
TRUNK = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
         "vocab_size": len(WORDS) + 4}  # fmt: skip


def llama_head_folder(folder, name="mixtape"):
    """A tiny untied Llama with head ``name``, saved with its tokenizer (TRL rebuilds reference models from the
    folder)."""
    from transformers import LlamaConfig

    torch.manual_seed(0)
    base = LlamaConfig(
        **TRUNK,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    AutoModelForCausalLM.from_config(hf_heads.head_config(base, name, **HEADS.get(name, {}))).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def reward_length(completions, **kwargs):
    return [float(len(c.split())) for c in completions]


def online_trainer(kind, tmp_path, model, **options):
    """GRPO or RLOO on ``model`` (4 prompts, 4 completions each of 6 tokens, 2 steps at lr 1e-2)."""
    config, trainer = {"grpo": (trl.GRPOConfig, trl.GRPOTrainer), "rloo": (trl.RLOOConfig, trl.RLOOTrainer)}[kind]
    args = config(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        learning_rate=1e-2,
        logging_steps=1,
        **ON_THE_CPU,
        **options,
    )
    data = datasets.Dataset.from_dict({"prompt": sentences(8, 4)})
    return trainer(model=model, reward_funcs=reward_length, args=args, train_dataset=data, processing_class=tokenizer())


GRPO_OPTIONS = {
    "defaults": {},
    "cast_lm_head_to_fp32": {"cast_lm_head_to_fp32": True},
    "temperature": {"temperature": 0.7},
    "reference": {"beta": 0.1, "sync_ref_model": True, "ref_model_sync_steps": 1, "ref_model_mixup_alpha": 0.5},
    "entropy": {"entropy_coef": 0.1, "use_adaptive_entropy": True, "top_entropy_quantile": 0.5},
    "loss_type": {"loss_type": "grpo"},
    # Liger's layer kernels need a GPU: off here, as tests/test_liger.py has them; TRL turns the fused loss off itself
    "use_liger_kernel": {
        "use_liger_kernel": True,
        "liger_kernel_config": {"rope": False, "rms_norm": False, "swiglu": False},
    },
}


@pytest.mark.parametrize("option", sorted(GRPO_OPTIONS))
def test_grpo_option_scores_with_the_head_and_trains_it(tmp_path, option):
    """The GRPO run on a Llama Mixtape head model with each option: TRL's per-token log-probs (the ones its loss,
    ratios and KL use) are the head's before and after two steps, and every head parameter moved."""
    model = AutoModelForCausalLM.from_pretrained(llama_head_folder(tmp_path / "model"))
    options = GRPO_OPTIONS[option]
    trainer = online_trainer("grpo", tmp_path, model, **options)
    ids = torch.randint(4, len(WORDS) + 4, (2, 9), generator=torch.Generator().manual_seed(0))
    temperature = options.get("temperature", 1.0)
    assert_trainer_scores_with_the_head(trainer, ids, temperature=temperature)
    before = head_parameters(model)
    trainer.train()
    assert_every_head_parameter_moved(model, before)
    assert_trainer_scores_with_the_head(trainer, ids, temperature=temperature)
    if option == "reference":  # TRL rebuilt the reference from the folder: the head model, synced from the policy
        assert_trainer_scores_with_the_head(trainer, ids, temperature=temperature, model=trainer.ref_model)
    if option == "cast_lm_head_to_fp32":
        assert "forward" not in model.lm_head.__dict__ and model.lm_head.weight.dtype == torch.float32


def test_rloo_scores_with_the_head_and_its_reference_is_the_saved_head_model(tmp_path):
    """RLOO (beta 0.05 by default: a reference TRL rebuilds from the model's folder) at temperature 0.7."""
    model = AutoModelForCausalLM.from_pretrained(llama_head_folder(tmp_path / "model", "mos"))
    trainer = online_trainer("rloo", tmp_path, model, temperature=0.7)
    ids = torch.randint(4, len(WORDS) + 4, (2, 9), generator=torch.Generator().manual_seed(0))
    before = head_parameters(model)
    trainer.train()
    assert_every_head_parameter_moved(model, before)
    assert_trainer_scores_with_the_head(trainer, ids, temperature=0.7)
    assert_trainer_scores_with_the_head(trainer, ids, temperature=0.7, model=trainer.ref_model)


def offline_trainer(kind, tmp_path, model, **options):
    """KTO or DPO on ``model``, 2 steps of 4 examples, its reference rebuilt by TRL (``ref_model`` not given)."""
    prompts, good, bad = sentences(8, 1), sentences(8, 2), sentences(8, 3)
    if kind == "kto":
        config, trainer = trl.KTOConfig, trl.KTOTrainer
        data = {"prompt": prompts + prompts, "completion": good + bad, "label": [True] * 8 + [False] * 8}
    else:
        config, trainer = trl.DPOConfig, trl.DPOTrainer
        data = {"prompt": prompts, "chosen": good, "rejected": bad}
    args = config(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        **ON_THE_CPU,
        **options,
    )
    return trainer(model=model, args=args, processing_class=tokenizer(), train_dataset=datasets.Dataset.from_dict(data))


OFFLINE_OPTIONS = {
    "kto": ("kto", {}),
    "dpo": ("dpo", {}),
    "dpo-weighting": ("dpo", {"use_weighting": True}),
    "dpo-precompute": ("dpo", {"precompute_ref_log_probs": True}),
    "kto-precompute": ("kto", {"precompute_ref_log_probs": True}),
}


@pytest.mark.parametrize("case", sorted(OFFLINE_OPTIONS))
def test_kto_and_dpo_score_with_the_head_and_its_reference(tmp_path, spy, case):
    """KTO and DPO without ``ref_model``: TRL rebuilds the reference from the saved head model's folder, or (with
    ``precompute_ref_log_probs``) scores the dataset with the policy as it starts and keeps no reference. Every fused
    call (the precomputed reference log-probs among them; WPO's ``use_weighting`` reads their ``log_sum_sq_probs``)
    is the head's, checked by the spy against the model as it was then; afterwards the trainer's log-probs, and its
    reference's, are the head's, and every head parameter moved."""
    kind, options = OFFLINE_OPTIONS[case]
    model = AutoModelForCausalLM.from_pretrained(llama_head_folder(tmp_path / "model", "plif"))
    trainer = offline_trainer(kind, tmp_path, model, **options)
    precomputed = len(spy())  # (precompute_ref_log_probs: the dataset scored when the trainer was built)
    assert (precomputed > 0) == ("precompute_ref_log_probs" in options)
    assert (trainer.ref_model is None) == ("precompute_ref_log_probs" in options)
    ids = torch.randint(4, len(WORDS) + 4, (2, 9), generator=torch.Generator().manual_seed(0))
    before = head_parameters(model)
    trainer.train()
    assert len(spy()) > precomputed
    assert_every_head_parameter_moved(model, before)
    assert_trainer_scores_with_the_head(trainer, ids)
    if trainer.ref_model is not None:
        assert_trainer_scores_with_the_head(trainer, ids, model=trainer.ref_model)


def test_a_reference_model_trl_would_rebuild_without_the_head_is_refused_when_the_trainer_is_built(tmp_path):
    """A head swapped in memory leaves config._name_or_path at the plain model's folder: GRPO with a KL term would
    load that plain model as its reference. Refused in one line; from the saved head model it runs (above)."""
    from transformers import LlamaForCausalLM

    folder = llama_head_folder(tmp_path / "model")
    plain = LlamaForCausalLM.from_pretrained(folder)  # (the head's weights left out: the plain Llama of that folder)
    plain.save_pretrained(tmp_path / "plain")
    model = hf_heads.swap_head(LlamaForCausalLM.from_pretrained(tmp_path / "plain"), "mixtape", **HEADS["mixtape"])
    with pytest.raises(ValueError, match=r"^GRPOTrainer: the reference model TRL loaded from .*plain' .* is a plain "
                       r"LlamaForCausalLM, not this mixtape head model, .* save this model"):  # fmt: skip
        online_trainer("grpo", tmp_path, model, beta=0.1)
    online_trainer("grpo", tmp_path, model)  # beta 0: no reference model


def test_distillation_trainer_which_reads_the_output_weight_is_refused_when_built(tmp_path):
    model = head_model("mos")
    args = trl.DistillationConfig(output_dir=str(tmp_path), max_steps=1, **ON_THE_CPU)
    with pytest.raises(ValueError, match=r"^DistillationTrainer: its loss reads the output layer's weight directly "
                       r"and never runs the mos head"):  # fmt: skip
        trl.DistillationTrainer(
            model=model,
            teacher_model=head_model("softmax"),
            args=args,
            processing_class=tokenizer(),
            train_dataset=datasets.Dataset.from_dict({"prompt": sentences(4, 0), "completion": sentences(4, 1)}),
        )


def test_the_fused_entropy_carries_the_heads_gradient():
    """GRPO's entropy bonus (entropy_coef) differentiates TRL's per-token entropy: the fused forward's entropy has the
    gradient of the head's, for the hidden states' trunk and every head parameter."""
    model = head_model("mixtape").train()
    trl.trainer.utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    ids = torch.randint(4, len(WORDS) + 4, (2, 9), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :3] = -100
    grads = []
    for fused in (True, False):
        model.zero_grad()
        if fused:
            entropy = model(input_ids=ids, labels=labels, fused_lm_head=True).entropy
        else:
            lp = torch.log_softmax(model(input_ids=ids).logits[:, :-1] / 0.7, -1)
            entropy = (-(lp.exp() * lp).sum(-1)).masked_fill(labels[:, 1:] == -100, 0)
        (entropy * torch.linspace(0.5, 1.5, entropy.numel()).view_as(entropy)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(n.startswith("lm_head.") for n in grads[0])
    for n in grads[1]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_a_mixture_of_experts_trunks_router_loss_reaches_trl():
    """With ``output_router_logits`` (TRL's ``router_aux_loss_coef`` adds ``outputs.aux_loss``), the fused forward
    returns the trunk's router loss: the one the model's own forward gives."""
    from transformers import MixtralConfig

    torch.manual_seed(0)
    base = MixtralConfig(
        **TRUNK,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
    )
    model = AutoModelForCausalLM.from_config(hf_heads.head_config(base, "mos", num_components=2))
    trl.trainer.utils.add_fused_lm_head(model)
    ids = torch.randint(4, len(WORDS) + 4, (2, 9), generator=torch.Generator().manual_seed(1))
    fused = model(input_ids=ids, labels=ids, fused_lm_head=True)
    plain = model(input_ids=ids, labels=ids)
    assert fused.aux_loss is not None and fused.aux_loss.requires_grad
    torch.testing.assert_close(fused.aux_loss, plain.aux_loss)


@pytest.mark.parametrize("option", ["padding_free", "completion_only_loss"])
def test_sft_option_scores_with_the_head(tmp_path, spy, option):
    """``padding_free`` packs the batch into one row with ``position_ids``; ``completion_only_loss`` scores a
    prompt-completion dataset's completions only (labels -100 on the prompt). Either way the fused call's log-probs
    are the head's (the spy checks each against the model's own forward on the same inputs) and the head trains."""
    model = AutoModelForCausalLM.from_pretrained(llama_head_folder(tmp_path / "model", "mos"))
    before = head_parameters(model)
    if option == "padding_free":
        options, data = {"padding_free": True, "max_length": None}, {"text": sentences(16, 0)}
    else:
        options, data = {"completion_only_loss": True}, {"prompt": sentences(16, 0), "completion": sentences(16, 1)}
    args = trl.SFTConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        **options,
        **ON_THE_CPU,
    )
    data = datasets.Dataset.from_dict(data)
    trl.SFTTrainer(model=model, args=args, processing_class=tokenizer(), train_dataset=data).train()
    calls = spy()
    if option == "padding_free":
        assert calls and "position_ids" in calls[0]["kwargs"]
    else:  # (the prompt's tokens are not scored: more ignored labels than padding)
        kwargs = calls[0]["kwargs"]
        assert (kwargs["labels"] == -100).sum() > (kwargs["attention_mask"] == 0).sum()
    assert_every_head_parameter_moved(model, before)


def test_grpo_cast_lm_head_to_fp32_on_a_bfloat16_model_scores_with_the_head_in_float32(tmp_path):
    """What the option is for: a bfloat16 model whose output layer computes in float32. The head's parameters become
    float32, the trunk stays bfloat16, the head keeps its own forward, and TRL's log-probs are the head's on the
    trunk's bfloat16 hidden states, before and after training."""
    model = AutoModelForCausalLM.from_pretrained(llama_head_folder(tmp_path / "model"), dtype=torch.bfloat16)
    trainer = online_trainer("grpo", tmp_path, model, cast_lm_head_to_fp32=True)
    assert {p.dtype for p in model.lm_head.parameters()} == {torch.float32}
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16 and "forward" not in model.lm_head.__dict__
    ids = torch.randint(4, len(WORDS) + 4, (2, 9), generator=torch.Generator().manual_seed(0))
    assert_trainer_scores_with_the_head(trainer, ids)
    before = head_parameters(model)
    trainer.train()
    assert_every_head_parameter_moved(model, before)
    assert_trainer_scores_with_the_head(trainer, ids)
