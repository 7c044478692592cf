"""A saved head model always loads, and as the model that saved it (hf_heads/hf/checkpoint.py).

The flow table builds models the ways people do in one process (several models from one config, a loaded model beside
a fresh one, a deep copy, a head config reused), saves every model, loads them all in one fresh process, and checks
that each computes the log-probs it had before saving, and that those equal the same head built on a config of its
own. Then: the saves and loads that must be refused, and the folders softmax-heads 0.2.0 wrote from a shared config
(tests/data/shared_config_0_2_0)."""

import copy
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")

import hf_heads  # noqa: E402
from hf_families import model_class, tiny_config  # noqa: E402

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shared_config_0_2_0")
HEADS = {"softmax": {}, "mos": {"num_components": 2}, "mixtape": {"num_gates": 2, "frequent_fraction": 0.25}}
#: Llama untied, GPT-2 tied, Gemma 2 with its soft-cap (which swap_head moves into the head), BART seq2seq
FAMILIES = ("llama", "gpt2", "gemma2", "bart")
IDS = torch.arange(14).reshape(2, 7) * 5 % 40


def log_probs(model) -> torch.Tensor:
    inputs = {"input_ids": IDS}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = IDS
    with torch.no_grad():
        return model.eval()(**inputs).logits


def auto_class(model) -> str:
    return "AutoModelForSeq2SeqLM" if model.config.is_encoder_decoder else "AutoModelForCausalLM"


def held_configs(model) -> list:
    """The transformers configs that ``model``'s modules hold as ``config``."""
    return [m.config for m in model.modules() if isinstance(vars(m).get("config"), transformers.PretrainedConfig)]


def swapped(family: str, head: str, seed: int, config=None):
    """A tiny ``family`` model, seeded, built from ``config`` (a fresh one of its own by default), with ``head``."""
    cls, _ = model_class(family)
    torch.manual_seed(seed)
    return hf_heads.swap_head(cls(tiny_config(family) if config is None else config), head, **HEADS[head])


def converted(model, seed: int):
    """``model`` (a softmax head) converted to a MoS head, seeded."""
    torch.manual_seed(seed)
    return hf_heads.convert_head(model, "mos", num_components=2)


def plain_config_dict(family: str) -> dict:
    """The config of a plain model built from a fresh tiny config (what a model built from it leaves there)."""
    config = tiny_config(family)
    model_class(family)[0](config)
    return config.to_dict()


def shared_config_flows():
    """One config per family shared by three models swapped to three heads, every one swapped before any is saved;
    the issue's snippet (Llama, softmax then MoS)."""
    cases = {}
    for family in FAMILIES:
        shared = tiny_config(family)
        cls = type(shared)
        for seed, head in enumerate(HEADS):
            cases[f"shared {family} {head}"] = (swapped(family, head, seed, shared), swapped(family, head, seed))
        assert type(shared) is cls and shared.to_dict() == plain_config_dict(family), family
    snippet = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=250,
        tie_word_embeddings=False,
    )
    cfg = transformers.LlamaConfig(**snippet)
    for seed, head in enumerate(("softmax", "mos")):
        torch.manual_seed(seed)
        model = hf_heads.swap_head(transformers.LlamaForCausalLM(cfg), head, **HEADS[head])
        torch.manual_seed(seed)
        alone = hf_heads.swap_head(
            transformers.LlamaForCausalLM(transformers.LlamaConfig(**snippet)), head, **HEADS[head]
        )
        cases[f"snippet {head}"] = (model, alone)
    assert type(cfg) is transformers.LlamaConfig and cfg.to_dict() == transformers.LlamaConfig(**snippet).to_dict()
    return cases


def other_flows(folder: str):
    """A loaded head model beside a fresh one built from its config and converted; a deep copy converted beside its
    original; ``from_config`` twice on one head config (Gemma 2: the soft-cap each model's head takes over); a plain
    class built from a head config, then swapped."""
    cases = {}
    first = swapped("gpt2", "softmax", 0)
    first.save_pretrained(os.path.join(folder, "first"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(folder, "first"))
    torch.manual_seed(1)
    fresh = converted(transformers.AutoModelForCausalLM.from_config(loaded.config), 2)
    torch.manual_seed(1)
    own = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder + "/first"))
    assert loaded.config.output_head["name"] == "softmax"
    cases["loaded beside fresh: loaded"] = (loaded, first)
    cases["loaded beside fresh: fresh"] = (fresh, converted(own, 2))

    original = swapped("llama", "softmax", 3)
    cases["deepcopy: copy"] = (converted(copy.deepcopy(original), 4), converted(swapped("llama", "softmax", 3), 4))
    cases["deepcopy: original"] = (original, swapped("llama", "softmax", 3))

    reused = hf_heads.head_config(tiny_config("gemma2"), "mos", num_components=2)
    spec = copy.deepcopy(reused.output_head)
    for seed in (5, 6):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(reused)
        torch.manual_seed(seed)
        alone = transformers.AutoModelForCausalLM.from_config(
            hf_heads.head_config(tiny_config("gemma2"), "mos", num_components=2)
        )
        assert model.config.output_head["options"]["logit_softcap"] == 30.0
        cases[f"reused head config {seed}"] = (model, alone)
    assert reused.final_logit_softcapping == 30.0 and reused.output_head == spec

    head_config = hf_heads.head_config(tiny_config("llama"), "mos", num_components=2)
    torch.manual_seed(7)
    model = hf_heads.swap_head(transformers.LlamaForCausalLM(head_config), "mixtape", **HEADS["mixtape"])
    assert model.config.output_head["name"] == "mixtape" and head_config.output_head["name"] == "mos"
    cases["plain class from a head config, swapped"] = (model, swapped("llama", "mixtape", 7))
    return cases


_LOAD_ALL = """
import json, sys, torch, transformers
import hf_heads
cases, ids = json.load(open(sys.argv[1])), torch.load(sys.argv[2])
out = {}
for name, (folder, auto) in cases.items():
    model = getattr(transformers, auto).from_pretrained(folder).eval()
    inputs = {"input_ids": ids, **({"decoder_input_ids": ids} if model.config.is_encoder_decoder else {})}
    with torch.no_grad():
        out[name] = model(**inputs).logits
torch.save(out, sys.argv[3])
"""


def test_every_flow_saves_a_folder_that_loads_in_a_fresh_process_as_the_model_that_saved_it(tmp_path):
    cases = {**shared_config_flows(), **other_flows(str(tmp_path))}
    before, folders = {}, {}
    for i, (name, (model, alone)) in enumerate(cases.items()):
        before[name] = log_probs(model)
        torch.testing.assert_close(before[name], log_probs(alone), rtol=0, atol=1e-6, msg=lambda m: f"{name}: {m}")
        folders[name] = (str(tmp_path / f"case{i}"), auto_class(model))
    for name, (model, _) in cases.items():  # every model built before any is saved
        model.save_pretrained(folders[name][0])
    (tmp_path / "cases.json").write_text(json.dumps(folders))
    torch.save(IDS, tmp_path / "ids.pt")
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOAD_ALL,
            str(tmp_path / "cases.json"),
            str(tmp_path / "ids.pt"),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    after = torch.load(tmp_path / "out", weights_only=True)
    for name in cases:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_swap_head_leaves_the_callers_config_and_other_models_as_they_were():
    shared = tiny_config("gemma2")
    plain = model_class("gemma2")[0](shared)
    head = swapped("gemma2", "mos", 0, shared)
    later = model_class("gemma2")[0](shared)  # built after the swap: keeps the soft-cap
    assert type(shared) is transformers.Gemma2Config and shared.final_logit_softcapping == 30.0
    assert plain.config is shared and later.config.final_logit_softcapping == 30.0
    assert head.config is not shared and head.config.final_logit_softcapping is None
    # every module that held the config holds the model's own copy (the decoder layers read it in forward)
    assert len(held_configs(head)) > 1 and all(c is head.config for c in held_configs(head))
    # a refused swap leaves the model with the caller's config, soft-cap on
    with pytest.raises(ValueError, match="svd_softmax"):
        hf_heads.swap_head(later, "svd_softmax")
    assert later.config is shared and all(c is shared for c in held_configs(later))
    assert shared.final_logit_softcapping == 30.0 and not hasattr(shared, "output_head")


def test_the_configs_nested_in_a_models_config_are_its_own_after_swap_head():
    from hf_heads.hf.output_layer import nested_configs

    shared = tiny_config("t5gemma")  # its encoder and decoder modules hold the configs nested in it
    model = swapped("t5gemma", "mos", 0, shared)
    own, callers = nested_configs(model.config), nested_configs(shared)
    assert len(own) == len(callers) == 3 and type(shared) is transformers.T5GemmaConfig
    held = held_configs(model)
    assert any(c is own[1] or c is own[2] for c in held)
    assert all(any(c is o for o in own) for c in held) and not any(c is o for c in held for o in callers)


def test_convert_head_and_save_pretrained_write_only_the_models_own_config(tmp_path):
    shared = hf_heads.head_config(tiny_config("llama"), "softmax")
    cls = hf_heads.hf.head_model_class(transformers.LlamaForCausalLM)
    first, second = cls(shared), cls(shared)  # built directly from one head config
    hf_heads.convert_head(first, "mos", num_components=2)
    first.save_pretrained(tmp_path / "first")
    assert first.config.output_head["name"] == "mos" and first.config.auto_map
    for config in (shared, second.config):
        assert config.output_head["name"] == "softmax" and not getattr(config, "auto_map", None)


def test_a_plain_class_built_from_a_head_config_is_refused_at_save_in_one_line(tmp_path):
    model = transformers.LlamaForCausalLM(hf_heads.head_config(tiny_config("llama"), "mos", num_components=2))
    with pytest.raises(ValueError) as e:
        model.save_pretrained(tmp_path / "plain")
    message = str(e.value)
    assert "\n" not in message and "LlamaForCausalLM is a plain model class" in message
    assert "AutoModelForCausalLM.from_config(config)" in message and "swap_head" in message
    assert not (tmp_path / "plain" / "model.safetensors").exists()


@pytest.mark.parametrize(
    "break_it,expected",
    [
        (
            lambda m: m.config.output_head.update(name="mixtape", options={}),
            "names a mixtape head, but the model's head is mos",
        ),
        (lambda m: setattr(m.config, "base_model_type", "softmax-heads"), "base_model_type is 'softmax-heads'"),
        (lambda m: m.config.output_head["options"].update(num_components=0), "num_components=0 is out of range"),
        (lambda m: delattr(hf_heads.output_head(m), "prior_proj"), "the model's head lacks prior_proj.weight"),
        (
            lambda m: setattr(hf_heads.output_head(m).config, "num_components", 0),
            "the options its head holds build no head (mos: option num_components=0 is out of range",
        ),
    ],
    ids=["other head", "base type", "bad option", "lacks a tensor", "head holds a bad option"],
)
def test_a_save_that_would_not_load_as_the_model_is_refused_before_anything_is_written(tmp_path, break_it, expected):
    model = swapped("gemma2", "mos", 0)
    break_it(model)
    with pytest.raises(ValueError) as e:
        model.save_pretrained(tmp_path / "out")
    message = str(e.value)
    assert "\n" not in message and expected in message and "nothing was written" in message
    assert not (tmp_path / "out").exists()


def test_a_save_records_the_options_the_head_holds_where_its_config_would_build_others(tmp_path):
    gemma = swapped("gemma2", "mos", 0)
    gemma.config.output_head["options"].update(num_components=3)  # a spec edited without the head: the head wins
    gemma.config.output_head["options"].pop("logit_softcap")
    gpt2 = swapped("gpt2", "mixtape", 0)
    hf_heads.output_head(gpt2).config.gate_noise = 0.0  # an option set on the head itself
    sampling = swapped("llama", "softmax", 0)
    hf_heads.convert_head(sampling, "adaptive_sampling")
    scale = hf_heads.output_head(sampling).calibrate(torch.randn(64, 32), steps=3)["variance_scale"]
    assert scale != 1.0
    for name, model, options in (
        ("gemma", gemma, {"num_components": 2, "logit_softcap": 30.0}),
        ("gpt2", gpt2, {"gate_noise": 0.0}),
        ("sampling", sampling, {"variance_scale": scale}),
    ):
        model.save_pretrained(tmp_path / name)
        saved = json.loads((tmp_path / name / "config.json").read_text())["output_head"]["options"]
        assert {k: saved[k] for k in options} == options, name
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name)
        assert hf_heads.output_head(loaded).config.to_dict() == hf_heads.output_head(model).config.to_dict(), name
        torch.testing.assert_close(log_probs(loaded), log_probs(model), rtol=0, atol=1e-6)


def test_a_head_models_config_saves_alone_where_its_base_config_named_a_plain_class(tmp_path):
    hub_like = tiny_config("llama")
    hub_like.architectures = ["LlamaForCausalLM"]  # as a config from the Hub names its class
    model = hf_heads.swap_head(transformers.LlamaForCausalLM(hub_like), "softmax")
    model.config.save_pretrained(tmp_path / "swapped")
    config = hf_heads.head_config(hub_like, "mos", num_components=2)
    config.save_pretrained(tmp_path / "new")
    for folder, head in (("swapped", "softmax"), ("new", "mos")):
        assert transformers.AutoConfig.from_pretrained(tmp_path / folder).output_head["name"] == head


def test_a_save_checks_the_state_dict_it_is_given_and_refuses_a_peft_wrapped_head(tmp_path):
    peft = pytest.importorskip("peft", reason="peft not installed: run `make install`")
    model = swapped("llama", "mos", 0)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("lm_head.prior_proj")}
    with pytest.raises(ValueError, match=r"the model's head lacks prior_proj.weight"):
        model.save_pretrained(tmp_path / "partial", state_dict=state)  # as FSDP / DeepSpeed pass the tensors to write
    model.save_pretrained(tmp_path / "whole", state_dict=model.state_dict())
    config = peft.LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"], task_type="CAUSAL_LM")
    wrapped = peft.get_peft_model(model, config)
    with pytest.raises(ValueError, match=r"its head is wrapped by PEFT .*merge_and_unload\(\)"):
        wrapped.get_base_model().save_pretrained(tmp_path / "wrapped")
    assert not (tmp_path / "wrapped").exists()
    wrapped.save_pretrained(tmp_path / "adapter")  # the adapter itself saves as PEFT writes it
    merged = wrapped.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    torch.testing.assert_close(
        log_probs(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")), log_probs(merged)
    )


def _mos_folder(tmp_path) -> str:
    folder = str(tmp_path / "mos")
    swapped("llama", "mos", 0).save_pretrained(folder)
    return folder


def _drop_tensors(folder: str, prefix: str) -> None:
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = {k: v for k, v in load_file(path).items() if not k.startswith(prefix)}
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_head_checkpoint_lacking_head_tensors_is_refused_naming_them(tmp_path):
    folder = _mos_folder(tmp_path)
    _drop_tensors(folder, "lm_head.context_proj")
    with pytest.raises(ValueError) as e:
        transformers.AutoModelForCausalLM.from_pretrained(folder)
    message = str(e.value)
    assert "\n" not in message and "lack lm_head.context_proj.bias, lm_head.context_proj.weight" in message
    assert "which its mos head needs" in message and "config=hf_heads.head_config" in message
    # the checkpoint's own config passed explicitly names the same head: refused the same way
    with pytest.raises(ValueError, match="lack lm_head.context_proj.bias"):
        transformers.AutoModelForCausalLM.from_pretrained(
            folder, config=transformers.AutoConfig.from_pretrained(folder)
        )


def test_a_head_tensor_of_another_shape_is_refused_even_with_ignore_mismatched_sizes(tmp_path):
    folder = _mos_folder(tmp_path)
    config = json.loads(open(os.path.join(folder, "config.json")).read())
    config["output_head"]["options"]["num_components"] = 3
    (tmp_path / "mos" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as e:
        transformers.AutoModelForCausalLM.from_pretrained(folder, ignore_mismatched_sizes=True)
    assert "lm_head.prior_proj.weight in another shape than its mos head's" in str(e.value)


def test_weights_given_as_a_state_dict_load_without_a_checkpoint_to_read():
    model = swapped("llama", "mos", 0)
    cls = type(model)
    loaded = cls.from_pretrained(None, config=model.config, state_dict=model.state_dict())
    torch.testing.assert_close(log_probs(loaded), log_probs(model), rtol=0, atol=0)


def test_a_complete_head_checkpoint_loads_and_output_loading_info_still_answers(tmp_path):
    folder = _mos_folder(tmp_path)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert isinstance(model, hf_heads.hf.HeadModelMixin) and not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(log_probs(model), log_probs(swapped("llama", "mos", 0)), rtol=0, atol=1e-6)


def test_a_plain_checkpoint_loaded_with_a_head_config_still_starts_the_head_on_purpose(tmp_path):
    torch.manual_seed(0)
    plain = transformers.LlamaForCausalLM(tiny_config("llama"))
    plain.save_pretrained(tmp_path / "plain")
    config = hf_heads.head_config(tiny_config("llama"), "mos", num_components=2, start="pretrained")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain", config=config)
    expected = torch.log_softmax(log_probs(plain), -1)
    torch.testing.assert_close(log_probs(model), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_folders_written_from_a_shared_config_by_0_2_0_load_when_their_weights_hold_their_head(tmp_path, family):
    expected = torch.load(os.path.join(LEGACY, "expected.pt"), weights_only=True)
    with pytest.warns(
        UserWarning, match=r"records base_model_type 'softmax-heads'.*save it again with save_pretrained"
    ):
        model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(LEGACY, f"{family}_second")).eval()
    assert model.config.base_model_type == family
    with torch.no_grad():
        torch.testing.assert_close(model(expected["ids"]).logits, expected[f"{family}_second"], rtol=0, atol=1e-6)
    model.save_pretrained(tmp_path / "again")  # saved again: a config.json that loads without a warning
    assert json.loads((tmp_path / "again" / "config.json").read_text())["base_model_type"] == family
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(expected["ids"]).logits, expected[f"{family}_second"], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "family,found",
    [
        (
            "llama",
            "lack lm_head.context_proj.bias, lm_head.context_proj.weight, lm_head.prior_proj.weight, which its "
            "mos head needs",
        ),
        ("gpt2", "hold lm_head.context_proj.bias, lm_head.context_proj.weight, lm_head.frequency_order"),
    ],
)
def test_folders_written_from_a_shared_config_by_0_2_0_are_refused_where_their_weights_hold_another_head(family, found):
    with pytest.warns(UserWarning, match="records base_model_type"), pytest.raises(ValueError) as e:
        transformers.AutoModelForCausalLM.from_pretrained(os.path.join(LEGACY, f"{family}_first"))
    assert "\n" not in str(e.value) and found in str(e.value) and "it would load as another model" in str(e.value)


def test_a_base_model_type_no_architecture_names_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "legacy"
    folder.mkdir()
    config = json.loads(open(os.path.join(LEGACY, "llama_second", "config.json")).read())
    config["architectures"] = ["SoftmaxHeadsNoSuchModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as e:
        transformers.AutoConfig.from_pretrained(folder)
    assert "\n" not in str(e.value) and "set base_model_type in config.json" in str(e.value)
