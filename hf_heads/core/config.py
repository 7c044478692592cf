"""Head options: ``option()`` (a dataclass field with its help text), the validators that name the option, the
value and the allowed range, and :class:`HeadConfig`, the options every head shares."""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional


def option(default: Any, help: str, shown: Optional[str] = None, **kwargs) -> Any:
    """A dataclass field carrying its help text (read by the fairseq / HF adapters and docs) and, where the default
    is resolved later (None standing for a value that depends on what is loaded), ``shown``: the default as the
    README's heads table prints it."""
    metadata = {"help": help, **({"shown": shown} if shown is not None else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


def did_you_mean(name: Any, choices, quote: bool = True) -> str:
    """`` (did you mean X?)`` for the choice nearest ``name``, or ``""`` when none is near (or ``name`` is no str)."""
    close = difflib.get_close_matches(name, list(choices), 1) if isinstance(name, str) else []
    if not close:
        return ""
    return f" (did you mean {close[0]!r}?)" if quote else f" (did you mean {close[0]}?)"


def check_option(head: str, name: str, value: Any, ok: bool, allowed: str) -> None:
    """Raise ``ValueError`` naming the head, the option, the value and what is allowed."""
    if not ok:
        raise ValueError(f"{head}: option {name}={value!r} is out of range; allowed: {allowed}")


def check_type(head: str, name: str, value: Any, ok: bool, expected: str) -> None:
    """Raise ``ValueError`` saying that ``value`` has the wrong type (``"num_gates='4' must be an integer (got
    str)"``), which a range message would hide."""
    if not ok:
        raise ValueError(f"{head}: option {name}={value!r} must be {expected} (got {type(value).__name__})")


def check_int(head: str, name: str, value: Any, lo: int, hi: Optional[int] = None) -> None:
    """Check that ``value`` is an int in ``[lo, hi]`` (``hi=None``: no upper bound)."""
    check_type(head, name, value, isinstance(value, int) and not isinstance(value, bool), "an integer")
    ok = value >= lo and (hi is None or value <= hi)
    check_option(head, name, value, ok, f"an integer in [{lo}, {'inf' if hi is None else hi}]")


def check_float(head: str, name: str, value: Any, lo: float, hi: float, lo_open=False, hi_open=False) -> None:
    """Check that ``value`` is a real number in the given (half-)open or closed interval."""
    check_type(head, name, value, isinstance(value, (int, float)) and not isinstance(value, bool), "a number")
    ok = math.isfinite(value) and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    check_option(head, name, value, ok, f"a number in {interval}")


def check_bool(head: str, name: str, value: Any) -> None:
    """Check that ``value`` is True or False (not a truthy string such as ``"false"``)."""
    check_type(head, name, value, isinstance(value, bool), "True or False")


@dataclass
class HeadConfig:
    """Options shared by every head. Subclasses add the head's own options.

    Fields carry their help text in ``metadata["help"]``; ``__post_init__`` rejects bad values
    with a ``ValueError`` that names the option, the value and the allowed range.
    """

    hidden_size: int = option(512, "size d1 of the last hidden state g fed to the head")
    vocab_size: int = option(10000, "number V of output tokens")
    embedding_size: Optional[int] = option(
        None,
        "size d of the output embedding W (V x d); defaults to hidden_size (heads that "
        "project g to context vectors h_k = tanh(H_k g) may use d != d1)",
    )
    dropout: float = option(0.0, "dropout on the context vector(s) multiplied with the output embedding")
    use_bias: bool = option(True, "add an output bias b (V)")
    logit_scale: float = option(
        1.0,
        "fixed factor s on the logits z = W h + b before the head's softmax(es): s z (a pretrained model's own scale "
        "after its output layer, Cohere's logit_scale, Granite's 1 / logits_scaling, which swap_head moves here)",
    )
    logit_softcap: Optional[float] = option(
        None,
        "fixed soft-cap c on the (scaled) logits before the head's softmax(es): c tanh(s z / c) (Gemma 2's "
        "final_logit_softcapping, which swap_head moves here); None: no cap",
    )

    head_name = "head"  # class attribute, set per subclass for messages

    def __post_init__(self) -> None:
        n = self.head_name
        check_int(n, "hidden_size", self.hidden_size, 1)
        check_int(n, "vocab_size", self.vocab_size, 2)
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        check_int(n, "embedding_size", self.embedding_size, 1)
        check_float(n, "dropout", self.dropout, 0.0, 1.0, hi_open=True)
        check_bool(n, "use_bias", self.use_bias)
        check_float(n, "logit_scale", self.logit_scale, 0.0, 1e6, lo_open=True)
        if self.logit_softcap is not None:
            check_float(n, "logit_softcap", self.logit_softcap, 0.0, 1e6, lo_open=True)

    @property
    def has_logit_map(self) -> bool:
        """Whether ``logit_scale`` / ``logit_softcap`` change the logits (not scale 1 without a cap)."""
        return self.logit_scale != 1.0 or self.logit_softcap is not None

    def to_dict(self) -> Dict[str, Any]:
        """The options as a JSON-serialisable dict (what ``save_head`` writes)."""
        return dataclasses.asdict(self)

    @classmethod
    def option_help(cls) -> Dict[str, str]:
        """``{option name: help text}`` for every option of this config."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}

    @classmethod
    def from_options(cls, **options: Any) -> "HeadConfig":
        """Build the config, rejecting unknown option names with the list of known ones."""
        cls.check_option_names(options)
        return cls(**options)

    @classmethod
    def check_option_names(cls, options: Dict[str, Any], settable: Optional[set] = None) -> None:
        """``ValueError`` for names in ``options`` that are not among ``settable`` (default: every option),
        suggesting the nearest allowed name and listing them all."""
        known = {f.name for f in dataclasses.fields(cls)} if settable is None else set(settable)
        unknown = sorted(set(options) - known)
        if unknown:
            named = [u + did_you_mean(u, known, quote=False) for u in unknown]
            raise ValueError(
                f"{cls.head_name}: unknown option(s) {', '.join(named)}; allowed options: {', '.join(sorted(known))}"
            )


# ----------------------------------------------------------------------------- stored head specs
#: The version of a stored head spec, a transformers config's ``output_head`` (its ``"version"``). A spec stores
#: only the options its user gave, so when a head's default changes, SPEC_VERSION goes up and the head's class
#: records the old value (:attr:`OutputHead.legacy_defaults`): a spec written before gets it back
#: (:func:`~hf_heads.core.registry.versioned_options`), and a model saved then loads and computes as it was trained.
#: (``save_head`` stores every option: it needs no version. fairseq checkpoints keep their ``--head-options`` as
#: given, and fairseq fills a newer field's default into an old checkpoint's config, so they cannot carry this
#: version: a changed default must be read from their weights, as Mixtape's ``scaled_form`` entry is.)
SPEC_VERSION = 2


def check_spec_version(where: str, version: Any) -> int:
    """``version`` if it is a spec version this library reads, else ``ValueError`` naming ``where``."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SPEC_VERSION:
        raise ValueError(
            f"{where}: head spec version {version!r} is not one this version of softmax-heads reads "
            f"(1 to {SPEC_VERSION}); a newer softmax-heads wrote it"
        )
    return version
