"""HuggingFace transformers adapter: put a softmax-heads head on any causal or seq2seq LM.

``swap_head(model, name, **options)`` replaces the model's output embeddings (``lm_head``) by a
head started from them, keeping the tie to the input embedding. The head returns normalised
log-probs where the model expects logits, so everything downstream works unchanged:

* the model's own loss (cross-entropy on ``logits``) is the head's NLL, since
  ``log_softmax(log p) = log p``; the head's ``aux_loss()`` is added to it;
* in training (grad enabled, ``labels`` given, the head's ``lean_loss`` on), the loss is instead the head's
  memory-lean :meth:`OutputHead.loss` on the hidden states the head would have seen, with the model's own
  label handling (causal LMs shift, ``shift_labels`` / ``num_items_in_batch`` as transformers' loss reads
  them; seq2seq models build ``decoder_input_ids`` from ``labels`` and average over the labels, as BART,
  T5 and Marian do). No ``[tokens, V]`` tensor is made, so
  such outputs have no ``logits`` (``None``); set ``head.lean_loss = False`` to get them back;
* ``generate`` (greedy, beam search, sampling, top-k/top-p, temperature, which then acts on the
  head's distribution) sees log-probs;
* ``save_pretrained`` / ``from_pretrained`` (safetensors) round-trip through the Auto classes.

Saved configs have ``model_type = "softmax-heads"``, the wrapped model's type in
``base_model_type`` and the head in ``output_head``. ``import hf_heads`` registers
``"softmax-heads"`` with ``AutoConfig``; the per-family config and model classes (e.g.
``SoftmaxHeadsGPT2LMHeadModel``, a subclass of ``GPT2LMHeadModel``) are created when first needed
and registered with ``AutoModelForCausalLM`` / ``AutoModelForSeq2SeqLM``. Without softmax-heads
installed, transformers refuses such a checkpoint naming the model type ``softmax-heads``: the
package to install.
"""

from .auto import SoftmaxHeadsConfig, head_config, register_auto_classes
from .config import MODEL_TYPE, head_config_class
from .modeling import HeadModelMixin, head_model_class, output_head, swap_head
from .peft import running_head
from . import convert as _convert  # noqa: F401,E402  (registers convert_head for transformers models)

__all__ = [
    "MODEL_TYPE",
    "SoftmaxHeadsConfig",
    "HeadModelMixin",
    "head_config",
    "head_config_class",
    "head_model_class",
    "output_head",
    "register_auto_classes",
    "running_head",
    "swap_head",
]
