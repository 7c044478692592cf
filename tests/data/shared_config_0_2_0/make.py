"""Writes the folders that tests/test_checkpoints.py loads: what softmax-heads 0.2.0 saved from models swapped on one
shared config (commit f8fb23f, before swap_head gave each model a config of its own).

Its ``swap_head`` changed the config object the models shared, so every folder's ``config.json`` records
``"base_model_type": "softmax-heads"`` and the head of the last swap, whatever head its weights hold. Made once, with
that commit's code (public API only)::

    git worktree add /tmp/sh-0.2.0 f8fb23f
    cd /tmp/sh-0.2.0 && python /path/to/this/make.py OUT_DIR

Per family, the first model's folder names the second model's head over the first one's weights (loading it would
give another model: refused), the second's names its own head (loads, with a warning). ``expected.pt`` holds the
log-probabilities each model computed before it was saved, on fixed ids. The head's code files (``*.py``) are removed:
the test loads with the installed package.
"""

import os
import sys

import torch

import hf_heads

# family -> ((config class, model class), sizes, the first head, the second head): untied Llama, tied GPT-2
FAMILIES = {
    "llama": (
        ("LlamaConfig", "LlamaForCausalLM"),
        dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=40,
            tie_word_embeddings=False,
        ),
        ("softmax", {}),
        ("mos", {"num_components": 2}),
    ),
    "gpt2": (
        ("GPT2Config", "GPT2LMHeadModel"),
        dict(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=32, bos_token_id=0, eos_token_id=0),
        ("mixtape", {"num_gates": 2, "frequent_fraction": 0.25, "gate_embedding_size": 4}),
        ("softmax", {}),
    ),
}


def main(out: str) -> None:
    import transformers

    torch.manual_seed(0)
    ids = torch.randint(0, 40, (2, 6))
    expected = {"ids": ids}
    for family, ((config_class, model_class), sizes, first, second) in FAMILIES.items():
        shared = getattr(transformers, config_class)(**sizes)
        models = {}  # every model swapped before any is saved
        for tag, (head, options) in (("first", first), ("second", second)):
            plain = getattr(transformers, model_class)(shared)  # keeps `shared` as its config
            models[tag] = hf_heads.swap_head(plain, head, **options).eval()
        for tag, model in models.items():
            with torch.no_grad():
                expected[f"{family}_{tag}"] = model(ids).logits
            folder = os.path.join(out, f"{family}_{tag}")
            model.save_pretrained(folder)
            for f in os.listdir(folder):
                if f.endswith(".py"):
                    os.remove(os.path.join(folder, f))
    torch.save(expected, os.path.join(out, "expected.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
