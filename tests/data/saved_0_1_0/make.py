"""Writes the saved models that tests/test_saved_compat.py loads: what softmax-heads 0.1.0 saved before the code was
reorganised into hf_heads/core, hf_heads/hf and fairseq_plugin/lm (commit ae9d721).

Made once, with the code of that commit (public API only, so the script runs there)::

    git worktree add /tmp/sh-0.1.0 ae9d721
    cd /tmp/sh-0.1.0 && python /path/to/this/make.py OUT_DIR

Each saved thing comes with ``expected.pt``: the log-probabilities that code computed on fixed inputs, which the
test compares with what today's code computes after loading.
"""

import os
import random
import subprocess
import sys

import torch

import hf_heads

HEADS = {  # head -> options: a head with per-id state (mixtape's order), buffers (ds_softmax's masks), knots (plif)
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.25, "gate_embedding_size": 4},
    "ds_softmax": {"num_experts": 2},
    "plif": {"num_knots": 50},
}


def heads(out):
    torch.manual_seed(0)
    hidden = torch.randn(5, 8)
    expected = {"hidden": hidden}
    for name, options in HEADS.items():
        head = hf_heads.build_head(name, hidden_size=8, vocab_size=20, **options)
        if head.uses_frequency_order:
            head.set_frequency_order(torch.randperm(20))
        with torch.no_grad():  # move every parameter off its initial value, so a load that drops one shows
            for p in head.parameters():
                p.add_(0.1 * torch.randn_like(p))
        head.eval()
        hf_heads.save_head(head, os.path.join(out, f"head_{name}"))
        expected[name] = head(hidden).detach()
    torch.save(expected, os.path.join(out, "heads_expected.pt"))


def hf(out):
    from transformers import AutoModelForCausalLM, BartConfig, GPT2Config, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    ids = torch.randint(0, 40, (2, 6))
    expected = {"ids": ids}
    gpt2 = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=16)
    for name, options in (("mixtape", HEADS["mixtape"]), ("ds_softmax", HEADS["ds_softmax"])):
        model = AutoModelForCausalLM.from_config(hf_heads.head_config(gpt2, name, **options)).eval()
        model.save_pretrained(os.path.join(out, f"hf_gpt2_{name}"))
        expected[f"gpt2_{name}"] = model(ids).logits.detach()
    bart = BartConfig(
        vocab_size=40,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=16,
    )
    model = AutoModelForSeq2SeqLM.from_config(hf_heads.head_config(bart, "mos", num_components=2)).eval()
    model.save_pretrained(os.path.join(out, "hf_bart_mos"))
    expected["bart_mos"] = model(input_ids=ids, decoder_input_ids=ids).logits.detach()
    torch.save(expected, os.path.join(out, "hf_expected.pt"))


def fairseq(out):
    import fairseq_plugin  # noqa: F401

    d = os.path.join(out, "fairseq_lm")
    raw = os.path.join(out, "_raw")
    os.makedirs(raw, exist_ok=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(20)]
    for split in ("train", "valid"):
        with open(os.path.join(raw, split), "w") as f:
            f.writelines(" ".join(rng.choice(words) for _ in range(8)) + "\n" for _ in range(40))
    bin_dir = os.path.dirname(sys.executable)
    subprocess.run(
        [
            os.path.join(bin_dir, "fairseq-preprocess"),
            "--only-source",
            "--trainpref",
            os.path.join(raw, "train"),
            "--validpref",
            os.path.join(raw, "valid"),
            "--destdir",
            d,
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            os.path.join(bin_dir, "fairseq-train"),
            d,
            "--user-dir",
            os.path.dirname(fairseq_plugin.__file__),
            "--task",
            "language_modeling",
            "--arch",
            "head_transformer_lm",
            "--output-head",
            "mixtape",
            "--head-options",
            '{"num_gates": 2, "frequent_fraction": 0.5, "gate_embedding_size": 4}',
            "--criterion",
            "head_cross_entropy",
            "--decoder-layers",
            "1",
            "--decoder-embed-dim",
            "16",
            "--decoder-ffn-embed-dim",
            "32",
            "--decoder-attention-heads",
            "2",
            "--tokens-per-sample",
            "16",
            "--decoder-output-dim",
            "16",
            "--decoder-input-dim",
            "16",
            "--optimizer",
            "adam",
            "--lr",
            "0.003",
            "--max-tokens",
            "256",
            "--max-update",
            "3",
            "--cpu",
            "--no-epoch-checkpoints",
            "--no-last-checkpoints",
            "--no-save-optimizer-state",
            "--num-workers",
            "0",
            "--save-dir",
            d,
            "--seed",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    for f in os.listdir(d):  # keep the dictionary and the model; the binarised data is remade by the test
        if f not in ("dict.txt", "checkpoint_best.pt"):
            os.remove(os.path.join(d, f))
    from fairseq.models.transformer_lm import TransformerLanguageModel

    lm = TransformerLanguageModel.from_pretrained(
        d, "checkpoint_best.pt", user_dir=os.path.dirname(fairseq_plugin.__file__)
    ).eval()
    tokens = lm.encode("w1 w2 w3 w4 w5")
    with torch.no_grad():
        net = lm.models[0]
        lp = net.get_normalized_probs(net(tokens[None]), log_probs=True)
    torch.save({"sentence": "w1 w2 w3 w4 w5", "log_probs": lp}, os.path.join(out, "fairseq_expected.pt"))
    subprocess.run(["rm", "-rf", raw], check=True)


if __name__ == "__main__":
    target = sys.argv[1]
    os.makedirs(target, exist_ok=True)
    heads(target)
    hf(target)
    fairseq(target)
