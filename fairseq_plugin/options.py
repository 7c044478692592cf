"""The head flags every ``head_ARCH`` model adds: ``--output-head NAME`` and ``--head-options JSON``, their parsing
and checks (a bad flag is a usage error, one line and exit 2), and building a decoder's head from them."""
# no `from __future__ import annotations`: fairseq reads the dataclass annotations as real types

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass

import hf_heads
from hf_heads.core.config import did_you_mean
from hf_heads.heads import OutputHead, get_head_class, head_specific_options

#: head options that come from the model's dimensions, not from --head-options
MODEL_SUPPLIED = ("hidden_size", "vocab_size", "embedding_size")


class HeadFlagError(ValueError):
    """A bad ``--output-head`` / ``--head-options`` (or a head they cannot build on this model): the fairseq
    entry points turn it into a usage error (:func:`usage_error`); its message starts with the flag."""


def _head_options_help() -> str:
    parts = [
        f"{name}: {', '.join(f.name for f in head_specific_options(name)) or '-'}"
        for name in hf_heads.available_heads()
    ]
    shared = [f.name for f in dataclasses.fields(hf_heads.HeadConfig) if f.name not in MODEL_SUPPLIED]
    return (
        'JSON object of options for --output-head, e.g. \'{"num_gates": 4, "frequent_fraction": 0.5}\'. '
        "Options per head: " + "; ".join(parts) + f". Every head also takes {' and '.join(shared)}. "
        f"{', '.join(MODEL_SUPPLIED)} come from the model."
    )


@dataclass
class HeadArgs(FairseqDataclass):
    """The two options every ``head_ARCH`` model adds to its architecture."""

    # a str checked when the model is built (parse_head_options), not a ChoiceEnum: argparse's "invalid choice"
    # cannot say "did you mean"
    output_head: str = field(
        default="softmax",
        metadata={
            "help": "output head replacing the decoder's output projection + softmax; one "
            f"of: {', '.join(hf_heads.available_heads())}"
        },
    )
    head_options: str = field(default="{}", metadata={"help": _head_options_help()})
    # "" (not None): fairseq's argparse bridge turns an Optional[str] default of None into the string "None"
    head_start: str = field(
        default="",
        metadata={
            "help": "'pretrained': the head starts exactly as the output projection it replaces (a stock checkpoint "
            "given to --restore-file / --finetune-from-model), setting the options that needs (MoS, Mixtape: "
            "identity contexts); refused for a head with no exact start. 'nearest': such a head too, as near as "
            "it comes (a warning says how far). Empty: the head's own initialisation"
        },
    )


def parse_head_options(output_head: Any, head_options: Any, head_start: Any = "") -> Tuple[str, Dict[str, Any]]:
    """``(name, options)`` from the command-line values, with what ``--head-start`` sets
    (:func:`hf_heads.start_options`); :class:`HeadFlagError` naming the flag for an unknown head, bad JSON, an
    unknown option or a start the head does not have."""
    name = str(output_head)
    if name not in hf_heads.available_heads():
        raise HeadFlagError(
            f"--output-head {name!r} is not a head{did_you_mean(name, hf_heads.available_heads())}; "
            f"choose one of: {', '.join(hf_heads.available_heads())}"
        )
    if isinstance(head_options, dict):
        options = dict(head_options)
    else:
        try:
            options = json.loads(head_options or "{}")
        except json.JSONDecodeError as e:
            raise HeadFlagError(
                f"--head-options {head_options!r} is not valid JSON ({e}); expected an object such "
                f"as '{{\"num_gates\": 4}}'"
            ) from None
    if not isinstance(options, dict):
        raise HeadFlagError(f"--head-options {head_options!r} must be a JSON object (a dict of option: value)")
    for reserved in MODEL_SUPPLIED:
        if reserved in options:
            raise HeadFlagError(f"--head-options must not set {reserved!r}: it comes from the model's dimensions")
    config_class = get_head_class(name).config_class
    settable = {f.name for f in dataclasses.fields(config_class)} - set(MODEL_SUPPLIED)
    try:
        config_class.check_option_names(options, settable)
    except ValueError as e:
        raise HeadFlagError(f"--output-head {name} --head-options: {e}") from None
    try:
        options = hf_heads.start_options(name, head_start or None, options, where="--head-start")
    except ValueError as e:
        raise HeadFlagError(f"--output-head {name}: {e}") from None
    return name, options


def usage_error(message: str):
    """A bad flag: under a fairseq command (fairseq-train, -generate, ...) one line on stderr and exit 2, as
    argparse does for its own checks (head flags can only be checked once the model is built); in library use
    (hub loading, tests) a ``ValueError``."""
    prog = os.path.basename(sys.argv[0] if sys.argv else "")
    if prog.startswith("fairseq-"):
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.stdout.flush(), sys.stderr.flush()
        # os._exit, not SystemExit: raised inside a training step, unwinding through fairseq's trainer and
        # torch's autograd threads can abort the interpreter (exit -6) instead of exiting with 2
        os._exit(2)
    raise ValueError(message)


def build_decoder_head(
    name: str, options: Dict[str, Any], hidden_size: int, vocab_size: int, embed_tokens=None
) -> OutputHead:
    """Build the head for a decoder; tie its output embedding to ``embed_tokens`` when given.

    Errors (:class:`HeadFlagError`) name the flag: fairseq stops before any training step.
    """
    embedding_size = embed_tokens.weight.shape[1] if embed_tokens is not None else hidden_size
    try:
        head = hf_heads.build_head(
            name, hidden_size=hidden_size, vocab_size=vocab_size, embedding_size=embedding_size, **options
        )
    except ValueError as e:
        raise HeadFlagError(f"--output-head {name} --head-options: {e}") from None
    if embed_tokens is not None:
        try:
            head.tie_weight(embed_tokens)
        except ValueError as e:  # DS-Softmax: --share-decoder-input-output-embed / --share-all-embeddings
            raise HeadFlagError(f"--output-head {name}: {e}") from None
    return head


def add_head_args(parser) -> None:
    """Add ``--output-head`` and ``--head-options`` to a model's argparse parser (models that take
    ``add_args``; dataclass-configured models inherit :class:`HeadArgs` instead)."""
    gen_parser_from_dataclass(parser, HeadArgs())
