"""A head on a stock fairseq checkpoint (a model trained without the plugin, as the released WMT / LM ones are):
``--restore-file`` / ``--finetune-from-model`` into ``head_ARCH``, ``hf_heads.convert_head`` on the hub's model, the
``python -m fairseq_plugin.convert`` command and ``--model-overrides``, for every sharing layout. The stock models are
trained for a few updates here, by fairseq's own ``fairseq-train``; with ``start="pretrained"`` each path must give
the stock model's log-probs, beam output, validation loss and step-0 gradient."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

fairseq = pytest.importorskip("fairseq", reason="fairseq not installed: run `make install` (pip install -e .[fairseq])")

import fairseq_plugin  # noqa: E402,F401
import hf_heads  # noqa: E402
from fairseq import checkpoint_utils  # noqa: E402
from fairseq_plugin.checkpoint import MARKER_KEY  # noqa: E402
from test_fairseq_cli import GENERATE, PLUGIN, ROOT, SMALL_LM, SMALL_MT, TRAIN, clean_env, cli, data  # noqa: E402,F401

#: the heads tried on every layout, with options an exact start keeps (MoS: K softmaxes; Mixtape: its gates)
EXACT_HEADS = {
    "mos": {"num_components": 2},
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.5, "gate_embedding_size": 8},
}
#: the sharing layouts of fairseq's translation models, with the flags that make them
MT_LAYOUTS = {
    "share-all": ["--share-all-embeddings"],
    "share-decoder": ["--share-decoder-input-output-embed"],
    "untied": [],
}


#: ``(task, stock arch, its size flags)`` of the stock models
STOCK_SHAPES = {
    "translation": ("transformer_iwslt_de_en", SMALL_MT),
    "language_modeling": ("transformer_lm_gpt2_tiny", SMALL_LM),
}


def _train_stock(data, save_dir, task, flags, updates=4):
    """A stock model (no plugin), trained for a few updates by fairseq-train; the checkpoint's path."""
    arch, sizes = STOCK_SHAPES[task]
    data_dir = data / ("mt-bin" if task == "translation" else "lm-bin")
    cli("fairseq-train", data_dir, "--task", task, "--arch", arch, *sizes, *flags, *TRAIN, "--max-update", updates,
        "--save-dir", save_dir)  # fmt: skip
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def stock(data, tmp_path_factory):
    """``{layout: checkpoint}``: the three translation layouts, a tied and an untied LM, and two older formats made
    from them as fairseq wrote them before (an untied projection under the legacy ``decoder.embed_out`` key; the
    config as an ``args`` Namespace with no ``cfg``)."""
    root = tmp_path_factory.mktemp("stock")
    out = {name: _train_stock(data, root / name, "translation", flags) for name, flags in MT_LAYOUTS.items()}
    out["lm-tied"] = _train_stock(data, root / "lm-tied", "language_modeling", ["--share-decoder-input-output-embed"])
    out["lm-untied"] = _train_stock(data, root / "lm-untied", "language_modeling", [])
    state = torch.load(out["untied"], map_location="cpu", weights_only=False)
    state["model"]["decoder.embed_out"] = state["model"].pop("decoder.output_projection.weight")
    torch.save(state, root / "embed_out.pt")
    out["embed-out"] = root / "embed_out.pt"
    state = torch.load(out["share-all"], map_location="cpu", weights_only=False)
    state["args"], state["cfg"] = state["cfg"]["model"], None
    torch.save(state, root / "args_format.pt")
    out["args-format"] = root / "args_format.pt"
    return out


def _data_dir(data, layout):
    return data / ("lm-bin" if layout.startswith("lm") else "mt-bin")


def _load(path, data_dir, **overrides):
    """fairseq's own loader (what fairseq-generate and the hub call): ``(model in eval mode, task)``."""
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data_dir), **overrides}
    )
    return models[0].eval(), task


def _batch(task, lm: bool):
    """A fixed validation batch of ``task`` (net_input and target)."""
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(6)])
    return sample["net_input"], sample["target"]


#: the sharing flags each layout was trained with (what a user passes again to fairseq-train)
LAYOUT_FLAGS = {
    **MT_LAYOUTS,
    "embed-out": [],
    "args-format": ["--share-all-embeddings"],
    "lm-tied": ["--share-decoder-input-output-embed"],
    "lm-untied": [],
}


def _head_model(layout, data_dir, head, options, start="pretrained"):
    """The head_ARCH model fairseq-train builds from the stock model's flags (parse_args_and_arch, the task's
    build_model), in evaluation mode."""
    from fairseq import options as fairseq_options, tasks

    task_name = "language_modeling" if layout.startswith("lm") else "translation"
    arch, sizes = STOCK_SHAPES[task_name]
    argv = [str(data_dir), "--task", task_name, "--arch", f"head_{arch}", *sizes, *LAYOUT_FLAGS[layout]]
    argv += ["--output-head", head, "--head-options", json.dumps(options), "--head-start", start]
    args = fairseq_options.parse_args_and_arch(fairseq_options.get_training_parser(), argv)
    torch.manual_seed(0)
    return tasks.setup_task(args).build_model(args).eval()


def _stock_weights(path):
    """The model weights of a checkpoint as the trainer's restore hands them to ``load_state_dict``."""
    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]


def _same_log_probs(a, b, net_input):
    with torch.no_grad():
        lp_a = a.get_normalized_probs(a(**net_input), log_probs=True)
        lp_b = b.get_normalized_probs(b(**net_input), log_probs=True)
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-5)
    return lp_a


LAYOUTS = ["share-all", "share-decoder", "untied", "embed-out", "args-format", "lm-tied", "lm-untied"]


@pytest.mark.parametrize("head", list(EXACT_HEADS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_restore_path_starts_at_the_stock_model(data, stock, layout, head):
    """The restore's load_state_dict gives the head model the stock model's log-probs (1e-5), ties where the
    checkpoint tied, and at step 0 the same loss and the same gradient of the projection as the stock model."""
    data_dir = _data_dir(data, layout)
    ref, task = _load(stock[layout], data_dir)
    model = _head_model(layout, data_dir, head, EXACT_HEADS[head])
    model.load_state_dict(_stock_weights(stock[layout]), strict=True)
    decoder = model.decoder
    assert decoder.output_projection is None and decoder.head.head_name == head
    tied = ref.decoder.output_projection.weight is ref.decoder.embed_tokens.weight
    assert tied == (layout in ("share-all", "share-decoder", "args-format", "lm-tied"))
    assert (decoder.head.weight is decoder.embed_tokens.weight) == tied
    torch.testing.assert_close(decoder.head.weight, ref.decoder.output_projection.weight, rtol=0, atol=0)
    net_input, target = _batch(task, layout.startswith("lm"))
    _same_log_probs(ref, model, net_input)

    # step 0 in training mode (the same dropout masks): the stock NLL against the head's own loss, and the gradient
    # each gives the output embedding
    ref.train(), model.train()
    pad = task.target_dictionary.pad()
    torch.manual_seed(1)
    lp = ref.get_normalized_probs(ref(**net_input), log_probs=True)
    loss_ref = F.nll_loss(lp.flatten(0, 1), target.flatten(), ignore_index=pad, reduction="sum")
    torch.manual_seed(1)
    features = model(**net_input)[0]
    loss = decoder.head.loss(features, target, ignore_index=pad, reduction="sum")  # the lean loss in training
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-4)
    loss_ref.backward(), loss.backward()
    torch.testing.assert_close(
        decoder.head.weight.grad, ref.decoder.output_projection.weight.grad, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "head,options",
    [
        ("d_softmax", {"band_fractions": [0.25, 0.75], "band_dims": [24, 8]}),
        ("class_softmax", {"num_classes": 8}),
        ("ds_softmax", {"num_experts": 2}),
        ("svd_softmax", {}),
    ],
)
def test_heads_without_an_exact_start_load_a_stock_checkpoint_and_convert(data, stock, head, options, tmp_path):
    """The fast heads through the restore's upgrade and the convert command (untied: DS-Softmax and d_softmax cannot
    tie): strict loading, normalised log-probs; a tied checkpoint is refused for a head that cannot tie."""
    from fairseq_plugin.stock import StockCheckpointError, convert_checkpoint

    model = _head_model("untied", data / "mt-bin", head, options, start="nearest")
    model.load_state_dict(_stock_weights(stock["untied"]), strict=True)
    _, task = _load(stock["untied"], data / "mt-bin")
    net_input, _ = _batch(task, False)
    with torch.no_grad():
        lp = model.get_normalized_probs(model(**net_input), log_probs=True)
    torch.testing.assert_close(lp.logsumexp(-1), torch.zeros(lp.shape[:-1]), rtol=0, atol=1e-4)
    convert_checkpoint(stock["untied"], tmp_path / "fast.pt", head, options)
    loaded, _ = _load(tmp_path / "fast.pt", data / "mt-bin")
    assert loaded.decoder.head.head_name == head
    if not hf_heads.get_head_class(head).can_tie:
        with pytest.raises(StockCheckpointError, match=f"--output-head {head} cannot share its output embedding"):
            convert_checkpoint(stock["share-all"], tmp_path / "tied.pt", head, options)


def test_partial_head_keys_stay_a_strict_error_and_a_mismatched_tie_is_refused(data, stock):
    model = _head_model("share-all", data / "mt-bin", "mos", EXACT_HEADS["mos"])
    model.load_state_dict(_stock_weights(stock["share-all"]), strict=True)
    partial = {k: v for k, v in model.state_dict().items() if k != "decoder.head.prior_proj.weight"}
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"decoder.head.prior_proj.weight\""):
        model.load_state_dict(partial, strict=True)
    model = _head_model("share-decoder", data / "mt-bin", "mos", EXACT_HEADS["mos"])
    with pytest.raises(ValueError, match="output projection is not tied to its input embedding, but the model's is"):
        model.load_state_dict(_stock_weights(stock["untied"]), strict=True)


@pytest.mark.parametrize("layout", ["share-all", "untied", "lm-tied"])
def test_convert_head_on_the_hubs_stock_model(data, stock, layout):
    """hf_heads.convert_head on a loaded stock model: exact with start='pretrained' (log-probs, beam output), tied
    where it was; a head with no exact start is refused for start='pretrained'."""
    data_dir = _data_dir(data, layout)
    ref, task = _load(stock[layout], data_dir)
    model, _ = _load(stock[layout], data_dir)
    with pytest.raises(ValueError, match="sigsoftmax head has no start that equals the model it replaces"):
        hf_heads.convert_head(model, "sigsoftmax", start="pretrained")
    assert hf_heads.convert_head(model, "mixtape", start="pretrained", **EXACT_HEADS["mixtape"]) is model
    assert type(model).__name__.startswith("HeadTransformer") and model.decoder.head.head_name == "mixtape"
    assert (model.decoder.head.weight is model.decoder.embed_tokens.weight) == (layout != "untied")
    net_input, _ = _batch(task, layout.startswith("lm"))
    _same_log_probs(ref, model, net_input)
    if not layout.startswith("lm"):
        from fairseq.sequence_generator import SequenceGenerator

        sample = {"net_input": net_input}
        outs = [
            SequenceGenerator([m], task.target_dictionary, beam_size=3, max_len_b=6).generate([m], sample)
            for m in (ref, model)
        ]
        for a, b in zip(*outs):
            assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
            torch.testing.assert_close(
                torch.stack([h["score"] for h in a]), torch.stack([h["score"] for h in b]), rtol=0, atol=1e-5
            )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_converted_checkpoint_of_every_layout_loads_as_the_stock_model(data, stock, layout, tmp_path):
    """convert_checkpoint (the convert command's work) on every layout and both config formats: fairseq's own loader
    builds head_ARCH from the written file, tied as the stock model was, with the stock log-probs."""
    from fairseq_plugin.stock import convert_checkpoint

    data_dir = _data_dir(data, layout)
    done = convert_checkpoint(stock[layout], tmp_path / "mos.pt", "mos", EXACT_HEADS["mos"], "pretrained")
    ref, task = _load(stock[layout], data_dir)
    model, _ = _load(tmp_path / "mos.pt", data_dir)
    assert type(model.decoder).__name__ == "HeadTransformerDecoder" and model.decoder.head.head_name == "mos"
    tied = ref.decoder.output_projection.weight is ref.decoder.embed_tokens.weight
    assert done["tied"] == tied == (model.decoder.head.weight is model.decoder.embed_tokens.weight)
    saved = torch.load(tmp_path / "mos.pt", map_location="cpu", weights_only=False)
    assert (saved["cfg"] is None) == (layout == "args-format")  # the format kept
    net_input, _ = _batch(task, layout.startswith("lm"))
    _same_log_probs(ref, model, net_input)


def _hypotheses(out):
    return sorted(line for line in out.splitlines() if re.match(r"^H-\d+\t", line))


def _scores_and_words(lines):
    return [(line.split("\t")[0], round(float(line.split("\t")[1]), 4), line.split("\t")[2]) for line in lines]


def _validate_loss(data_dir, path, task):
    out = cli(
        "fairseq-validate",
        data_dir,
        "--user-dir",
        PLUGIN,
        "--path",
        path,
        "--task",
        task,
        "--criterion",
        "cross_entropy",
        "--cpu",
        "--max-tokens",
        "1024",
        "--num-workers",
        "0",
        *(["--tokens-per-sample", "32"] if task == "language_modeling" else []),
    )
    match = re.search(r"valid on 'valid' subset \| loss ([0-9.]+)", out)
    assert match, out[-2000:]
    return float(match.group(1))


@pytest.mark.long
def test_convert_command_gives_a_checkpoint_the_fairseq_tools_load(data, stock, tmp_path):
    """python -m fairseq_plugin.convert: the written checkpoint keeps the stock config (task, bpe, tokenizer,
    sharing flags; no user_dir) and marks itself; fairseq-generate gives the stock model's beam output and scores,
    fairseq-validate its loss, fairseq-interactive and the hub load it, and refusals are one line, exit 2."""
    target = tmp_path / "mixtape.pt"
    options = json.dumps(EXACT_HEADS["mixtape"])
    convert = [sys.executable, "-m", "fairseq_plugin.convert"]
    run = subprocess.run(
        [*convert, stock["share-all"], target, "--output-head", "mixtape", "--head-options", options, "--head-start",
         "pretrained"],
        capture_output=True, text=True, cwd=ROOT, env=clean_env(),
    )  # fmt: skip
    assert run.returncode == 0 and "head_transformer_iwslt_de_en with the mixtape head" in run.stderr, run.stderr
    assert "RuntimeWarning" not in run.stderr
    before = torch.load(stock["share-all"], map_location="cpu", weights_only=False)
    after = torch.load(target, map_location="cpu", weights_only=False)
    assert next(iter(after)) == MARKER_KEY and "last_optimizer_state" not in after
    for section in ("task", "bpe", "tokenizer", "common"):
        assert after["cfg"][section] == before["cfg"][section], section
    m_before, m_after = vars(before["cfg"]["model"]), vars(after["cfg"]["model"])
    assert m_after["arch"] == m_after["_name"] == "head_transformer_iwslt_de_en"
    resolved = hf_heads.start_options("mixtape", "pretrained", EXACT_HEADS["mixtape"])  # recorded, not the word
    assert (m_after["output_head"], json.loads(m_after["head_options"]), m_after["head_start"]) == (
        "mixtape",
        resolved,
        "",
    )
    assert {k: v for k, v in m_after.items() if k in m_before and k not in ("arch", "_name")} == {
        k: v for k, v in m_before.items() if k not in ("arch", "_name")
    }
    assert after["cfg"]["common"]["user_dir"] is None

    gen = [data / "mt-bin", "--user-dir", PLUGIN, *GENERATE, "--beam", "3", "--gen-subset", "test"]
    stock_out = _hypotheses(cli("fairseq-generate", *gen, "--path", stock["share-all"]))
    head_out = _hypotheses(cli("fairseq-generate", *gen, "--path", target))
    assert len(stock_out) > 40 and _scores_and_words(head_out) == _scores_and_words(stock_out)
    assert _validate_loss(data / "mt-bin", target, "translation") == _validate_loss(
        data / "mt-bin", stock["share-all"], "translation"
    )
    out = cli(
        "fairseq-interactive", data / "mt-bin", "--user-dir", PLUGIN, "--path", target, *GENERATE, stdin="w1 w2 w3\n"
    )
    assert re.search(r"^H-0\t", out, re.M), out[-2000:]

    # refusals: a plugin checkpoint, a head with no exact start, an output layer that is not a plain projection
    for source, args, message in (
        (target, ["--output-head", "mos"], "is a checkpoint of the plugin's already"),
        (stock["share-all"], ["--output-head", "sigsoftmax", "--head-start", "pretrained"], "has no start that equals"),
    ):
        run = subprocess.run([*convert, source, tmp_path / "x.pt", *args], capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert len([line for line in run.stderr.splitlines() if "error:" in line]) == 1


@pytest.mark.parametrize(
    "key,message",
    [
        ("decoder.adaptive_softmax.head.weight", "an adaptive softmax (--adaptive-softmax-cutoff)"),
        ("decoder.embed_tokens.embeddings.0.0.weight", "adaptive inputs (--adaptive-input)"),
        ("decoder.output_projection.bias", "output projection has a bias"),
    ],
)
def test_an_output_layer_that_is_not_a_plain_projection_is_refused(key, message):
    """What no head can start from, said in one line (the restore, the hub and the convert command share the check)."""
    from fairseq_plugin.stock import StockCheckpointError, stock_projection

    weights = {
        "decoder.embed_tokens.weight": torch.zeros(10, 4),
        "decoder.output_projection.weight": torch.zeros(10, 4),
    }
    assert stock_projection(weights, "decoder.", tied=True) is weights["decoder.output_projection.weight"]
    with pytest.raises(StockCheckpointError, match=re.escape(message)):
        stock_projection({**weights, key: torch.zeros(3)}, "decoder.", tied=False)
    assert stock_projection({**weights, "decoder.head.weight": torch.zeros(10, 4)}, "decoder.", tied=False) is None


@pytest.mark.slow
def test_convert_command_on_a_language_model_and_adaptive_softmax_refused(data, stock, tmp_path):
    """The LM's converted checkpoint: fairseq-eval-lm gives the stock perplexity; a stock LM with an adaptive softmax
    is refused in one line that says why."""
    target = tmp_path / "mos.pt"
    run = subprocess.run(
        [sys.executable, "-m", "fairseq_plugin.convert", stock["lm-untied"], target, "--output-head", "mos",
         "--head-options", json.dumps(EXACT_HEADS["mos"]), "--head-start", "pretrained"],
        capture_output=True, text=True, cwd=ROOT, env=clean_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    after = torch.load(target, map_location="cpu", weights_only=False)
    assert after["cfg"]["model"]["_name"] == "head_transformer_lm_gpt2_tiny" and "arch" not in after["cfg"]["model"]
    eval_lm = [data / "lm-bin", "--user-dir", PLUGIN, "--cpu", "--tokens-per-sample", "32", "--max-tokens", "1024"]

    def ppl(path):
        out = cli("fairseq-eval-lm", *eval_lm, "--num-workers", "0", "--path", path)
        return re.search(r"Perplexity: ([0-9.]+)", out).group(1)

    assert ppl(target) == ppl(stock["lm-untied"])
    adaptive = _train_stock(
        data,
        tmp_path / "adaptive",
        "language_modeling",
        ["--adaptive-softmax-cutoff", "20", "--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"],
        updates=1,
    )
    run = subprocess.run(
        [sys.executable, "-m", "fairseq_plugin.convert", adaptive, tmp_path / "x.pt", "--output-head", "mos"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 2 and "an adaptive softmax (--adaptive-softmax-cutoff)" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr


def test_model_overrides_give_a_stock_checkpoint_a_head_at_generation(data, stock):
    """fairseq-generate --model-overrides naming head_ARCH and the head: the stock checkpoint loads through the
    decoder's upgrade, and with --head-start pretrained decodes as the stock model."""
    gen = [data / "mt-bin", "--user-dir", PLUGIN, *GENERATE, "--beam", "2", "--gen-subset", "test"]
    overrides = {
        "arch": "head_transformer_iwslt_de_en",
        "_name": "head_transformer_iwslt_de_en",
        "output_head": "mos",
        "head_options": json.dumps(EXACT_HEADS["mos"]),
        "head_start": "pretrained",
    }
    stock_out = _hypotheses(cli("fairseq-generate", *gen, "--path", stock["share-decoder"]))
    out = cli("fairseq-generate", *gen, "--path", stock["share-decoder"], "--model-overrides", repr(overrides))
    assert _scores_and_words(_hypotheses(out)) == _scores_and_words(stock_out)


TRAIN_HEAD = [
    "--arch",
    "head_transformer_iwslt_de_en",
    *SMALL_MT,
    "--share-all-embeddings",
    "--output-head",
    "mixtape",
    "--head-options",
    json.dumps(EXACT_HEADS["mixtape"]),
    "--head-start",
    "pretrained",
    "--criterion",
    "head_cross_entropy",
]


@pytest.mark.long
def test_restore_file_and_finetune_from_model_on_the_command_line(data, stock, tmp_path):
    """fairseq-train into head_ARCH from a stock checkpoint: without --reset-optimizer one line, exit 2; with it (lr
    0: the weights stay the start), or from a checkpoint without an optimizer state, the saved model validates as the
    stock one; --finetune-from-model trains and lowers the valid loss."""
    base = ["fairseq-train", data / "mt-bin", "--user-dir", PLUGIN, "--task", "translation", *TRAIN_HEAD]
    train = list(TRAIN)
    restore = ["--restore-file", stock["share-all"]]
    code, out = cli(*base, *train, "--max-update", 1, "--save-dir", tmp_path / "a", *restore, check=False)
    assert code == 2 and "Traceback" not in out, out[-2000:]
    assert "is a stock fairseq checkpoint (no output head): add --reset-optimizer" in out
    lr = train.index("--lr") + 1
    frozen = train[:lr] + ["0"] + train[lr + 1 :]
    out = cli(*base, *frozen, "--max-update", 1, "--save-dir", tmp_path / "b", *restore, "--reset-optimizer")
    assert "a stock checkpoint: the mixtape head starts from its output projection (tied" in out
    stock_loss = _validate_loss(data / "mt-bin", stock["share-all"], "translation")
    assert _validate_loss(data / "mt-bin", tmp_path / "b" / "checkpoint_last.pt", "translation") == stock_loss
    # a released checkpoint without its optimizer state: fairseq restores none, so no --reset-optimizer is needed
    released = torch.load(stock["share-all"], map_location="cpu", weights_only=False)
    assert released.pop("last_optimizer_state", None) is not None
    torch.save(released, tmp_path / "released.pt")
    released_restore = ["--restore-file", tmp_path / "released.pt"]
    out = cli(*base, *frozen, "--max-update", 1, "--save-dir", tmp_path / "d", *released_restore)
    assert "a stock checkpoint: the mixtape head starts" in out
    assert _validate_loss(data / "mt-bin", tmp_path / "d" / "checkpoint_last.pt", "translation") == stock_loss
    out = cli(
        *base, *train, "--max-update", 12, "--save-dir", tmp_path / "c", "--finetune-from-model", stock["share-all"]
    )
    assert "a stock checkpoint" in out
    assert _validate_loss(data / "mt-bin", tmp_path / "c" / "checkpoint_last.pt", "translation") < stock_loss - 0.05
