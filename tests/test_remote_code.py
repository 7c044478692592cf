"""Head models that travel: ``save_pretrained`` writes the code that loads them where softmax-heads is not installed.

Models are saved here, with the log-probs and greedy / beam ``generate`` output they give; a subprocess that cannot
import the package (a ``sys.meta_path`` blocker) loads each with ``from_pretrained(dir, trust_remote_code=True)``,
checks it gives the same, saves it again and reloads that (hf_heads/hf/remote_code.py).
"""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import hf_heads
from hf_heads.hf import HeadModelMixin, remote_code

transformers = pytest.importorskip("transformers")
from transformers.dynamic_module_utils import get_imports  # noqa: E402

from hf_families import TINY_SEQ2SEQ  # noqa: E402

VOCAB = 60
HEADS = {
    "mixtape": {"num_gates": 4, "gate_embedding_size": 8, "gate_noise": 0.0},
    "mos": {"num_components": 2},
    "plif": {"num_knots": 100},
    "ds_softmax": {"num_experts": 4},
}
CASES = [("causal", name) for name in HEADS] + [("seq2seq", "mos"), ("seq2seq", "ds_softmax"), ("fsmt", "mixtape")]
#: families that scale or soft-cap their logits after lm_head (tests/hf_families.py's tiny configs): swap_head moves
#: the map into the head and switches the model's copy off, in the config the saved files load
MAPPED = {"gemma2": ("final_logit_softcapping", None), "cohere": ("logit_scale", 1.0)}
CASES += [("gemma2", "mos"), ("cohere", "mixtape")]
CAUSAL = {"causal", *MAPPED}

#: the start of a script for a fresh interpreter: from there on, softmax-heads cannot be imported
WITHOUT_PACKAGE = textwrap.dedent("""
    import importlib.abc, sys
    class NoSoftmaxHeads(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("hf_heads", "fairseq_plugin", "recipes"):
                raise ImportError(f"{name}: softmax-heads is not installed here")
    sys.meta_path.insert(0, NoSoftmaxHeads())
""")
#: loads each saved model through its own files, where the package cannot be imported
CLEAN = WITHOUT_PACKAGE + textwrap.dedent("""
    import json, tempfile
    import torch, transformers
    results = {}
    for folder, auto in json.loads(sys.argv[1]):
        cls = getattr(transformers, auto)
        model = cls.from_pretrained(folder, trust_remote_code=True).eval()
        saved = torch.load(folder + "/expected.pt")
        again = tempfile.mkdtemp()
        model.save_pretrained(again)  # saved from the loaded files: loads again, the same
        reloaded = cls.from_pretrained(again, trust_remote_code=True).eval()
        out = {"class": type(model).__name__, "module": type(model).__module__}
        with torch.no_grad():
            for key, m in (("loaded", model), ("reloaded", reloaded)):
                out[key + "_diff"] = (m(**saved["inputs"]).logits - saved["log_probs"]).abs().max().item()
            for key, kwargs in (("greedy", {"num_beams": 1}), ("beam", {"num_beams": 3})):
                got = model.generate(saved["prompt"], max_new_tokens=6, do_sample=False, **kwargs)
                out[key] = got.tolist() == saved[key].tolist()
        results[folder] = out
    results["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in ("hf_heads", "fairseq_plugin"))
    print("RESULTS " + json.dumps(results))
""")


def base_config(kind):
    if kind == "fsmt":  # its output layer is the decoder's output_projection (hf_heads.hf.modeling.OUTPUT_LAYERS)
        return transformers.FSMTConfig(langs=["en", "de"], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, **TINY_SEQ2SEQ)
    if kind == "causal":
        return transformers.GPT2Config(
            n_layer=1,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=64,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    return transformers.BartConfig(vocab_size=VOCAB, **TINY_SEQ2SEQ)


def save_case(folder, kind, name):
    """Save a seeded head model in ``folder`` with what it gives (``expected.pt``); returns its Auto class name."""
    torch.manual_seed(0)
    auto = "AutoModelForCausalLM" if kind in CAUSAL else "AutoModelForSeq2SeqLM"
    if kind == "fsmt":  # a plain model given a head by swap_head, started at it
        model = hf_heads.swap_head(
            transformers.FSMTForConditionalGeneration(base_config(kind)), name, start="pretrained", **HEADS[name]
        )
    elif kind in MAPPED:
        from hf_families import tiny_model

        model = hf_heads.swap_head(tiny_model(kind)[0], name, start="pretrained", **HEADS[name])
    else:
        model = getattr(transformers, auto).from_config(hf_heads.head_config(base_config(kind), name, **HEADS[name]))
    with torch.no_grad():  # a trained-looking head: not all experts / gates alike
        for p in hf_heads.output_head(model).parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.eval().save_pretrained(folder)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    inputs = {"input_ids": ids} if kind in CAUSAL else {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    prompt = ids[:1, :4]
    with torch.no_grad():
        expected = {
            "inputs": inputs,
            "log_probs": model(**inputs).logits,
            "prompt": prompt,
            "greedy": model.generate(prompt, max_new_tokens=6, do_sample=False, num_beams=1),
            "beam": model.generate(prompt, max_new_tokens=6, do_sample=False, num_beams=3),
        }
    torch.save(expected, os.path.join(folder, "expected.pt"))
    return auto


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    return {case: (str(root / "_".join(case)), save_case(str(root / "_".join(case)), *case)) for case in CASES}


@pytest.fixture(scope="module")
def clean_results(saved, tmp_path_factory):
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path_factory.mktemp("modules")), "PYTHONPATH": ""}
    proc = subprocess.run(
        [sys.executable, "-c", CLEAN, json.dumps(list(saved.values()))],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path_factory.mktemp("cwd")),
        timeout=600,
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[0][len("RESULTS ") :])


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_loads_without_the_package_with_same_log_probs_and_generate(case, saved, clean_results):
    folder, auto = saved[case]
    got = clean_results[folder]
    assert got["class"].startswith("SoftmaxHeads") and got["module"].startswith("transformers_modules.")
    assert got["loaded_diff"] < 1e-5 and got["reloaded_diff"] < 1e-5
    assert got["greedy"] and got["beam"]
    assert clean_results["imported"] == []
    config = json.load(open(os.path.join(folder, "config.json")))
    assert config["auto_map"] == {
        "AutoConfig": "configuration_softmax_heads."
        + re.sub("(LMHeadModel|ForCausalLM|ForConditionalGeneration)$", "", config["architectures"][0])
        + "Config",
        auto: "modeling_softmax_heads." + config["architectures"][0],
    }


@pytest.mark.parametrize("kind", sorted(MAPPED))
def test_a_moved_logit_map_is_saved_in_the_head_and_off_in_the_model(kind, saved):
    """Gemma 2's soft-cap and Cohere's scale (copied into the model at __init__) are in the saved head spec and
    switched off in the saved model config, so the files (loaded with and without the package) apply them once."""
    folder, _ = saved[next(c for c in CASES if c[0] == kind)]
    config = json.load(open(os.path.join(folder, "config.json")))
    field, neutral = MAPPED[kind]
    assert config[field] == neutral
    moved = {k: v for k, v in config["output_head"]["options"].items() if k.startswith("logit_")}
    assert moved == ({"logit_softcap": 30.0} if kind == "gemma2" else {"logit_scale": 0.0625})


def test_saved_files_import_only_torch_transformers_and_the_standard_library(saved):
    folder, _ = saved[("causal", "mixtape")]
    files = [f for f in os.listdir(folder) if f.endswith(".py")]
    assert {"configuration_softmax_heads.py", "modeling_softmax_heads.py", "softmax_heads_heads_mixtape.py"} <= set(
        files
    )
    allowed = {"torch", "transformers"} | set(sys.stdlib_module_names)
    for file in files:
        assert set(get_imports(os.path.join(folder, file))) <= allowed, file
    # every file is reachable through `from .x import` lines from the modeling file (what transformers copies)
    reachable = {
        os.path.basename(p)
        for p in transformers.dynamic_module_utils.get_relative_import_files(
            os.path.join(folder, "modeling_softmax_heads.py")
        )
    }
    assert reachable == set(files) - {"modeling_softmax_heads.py"}


def test_with_the_package_imported_the_package_loads_them(saved):
    """transformers prefers a model type registered in the process (``import hf_heads`` registers it) over the files
    saved with the model, even with trust_remote_code=True: the installed version runs, as before this change."""
    folder, _ = saved[("causal", "mos")]
    expected = torch.load(os.path.join(folder, "expected.pt"))
    for kwargs in ({}, {"trust_remote_code": True}):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()
        assert isinstance(model, HeadModelMixin) and type(model).__module__ == "hf_heads.hf.modeling"
        with torch.no_grad():
            torch.testing.assert_close(model(**expected["inputs"]).logits, expected["log_probs"])


def test_flat_files_rewrite_every_relative_import():
    files = remote_code.code_files()
    assert "softmax_heads_hf_modeling.py" in files and "softmax_heads_core_lean.py" in files
    for name, source in files.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom):
                assert node.level in (0, 1), (name, node.lineno)
                if node.level == 1:  # `from .x import y`, or `from . import x as y`: a file saved beside this one
                    targets = [node.module] if node.module else [a.name for a in node.names]
                    assert all(t + ".py" in files for t in targets), (name, node.lineno)
                assert node.level == 1 or node.module.split(".")[0] not in ("hf_heads", "fairseq_plugin"), name
    assert 'VERSION = "' + hf_heads.__version__ + '"' in files["softmax_heads_hf_remote_code.py"]


@pytest.mark.long
def test_push_to_hub_uploads_the_code_with_the_weights(monkeypatch, tmp_path):
    """Both ways to push (``push_to_hub`` and ``save_pretrained(push_to_hub=True)``, which uploads before it returns)
    send the code files and config.json's auto_map; the Hub itself is faked (no network)."""
    import types
    from transformers import modeling_utils
    from transformers.utils import hub

    uploads = []

    def upload(self, working_dir, repo_id, files_timestamps, **kwargs):
        stamps = hub.PushToHubMixin._get_files_timestamps(self, working_dir)
        sent = {f for f in os.listdir(working_dir) if stamps[f] > files_timestamps.get(f, 0)}
        uploads.append((sent, json.load(open(os.path.join(working_dir, "config.json")))))

    api = types.SimpleNamespace(create_repo=lambda repo_id, **kwargs: types.SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(hub.PushToHubMixin, "_upload_modified_files", upload)
    monkeypatch.setattr(modeling_utils, "hf_api", lambda: api)
    monkeypatch.setattr(hub, "hf_api", lambda: api)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(base_config("causal"), "mos"))
    model.save_pretrained(tmp_path / "out", push_to_hub=True, repo_id="someone/mos")
    model.push_to_hub("someone/mos")
    assert len(uploads) == 2
    for sent, config in uploads:
        assert {
            "model.safetensors",
            "config.json",
            "modeling_softmax_heads.py",
            "configuration_softmax_heads.py",
            "softmax_heads_heads_mos.py",
            "softmax_heads_hf_modeling.py",
        } <= sent
        assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_softmax_heads.SoftmaxHeadsGPT2LMHeadModel"
