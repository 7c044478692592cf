"""``start``: one word for "start the new head at the model it replaces".

A head that replaces a trained output layer ``log_softmax(W g + b)`` starts from its ``W`` and ``b``
(``build_head(..., weight=W, bias=b)``, :func:`hf_heads.swap_head`, :func:`hf_heads.convert_head`, a stock fairseq
checkpoint restored into ``head_ARCH``). Whether step 0 then *equals* the model depends on the head's other
options: MoS and Mixtape mix context vectors ``h_k = act(H_k g + c_k)`` that equal ``g`` only with ``H_k = I``,
``c_k = 0`` and no tanh. ``start="pretrained"`` sets whatever the head needs for that (each head class says what, in
:attr:`~hf_heads.core.interface.OutputHead.pretrained_start`), and refuses a head that has no exact start
(Sigsoftmax, DS-Softmax, class-based and differentiated softmax) unless ``start="nearest"`` is asked for, which
builds it from the projection as near as it comes and warns how far that is
(:attr:`~hf_heads.core.interface.OutputHead.pretrained_start_gap`).

The options it returns are plain head options: a saved model or checkpoint records them, not the word, so it
rebuilds the same head without knowing how it was started.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Tuple

from .config import did_you_mean

#: the values of ``start`` (None: the head's own initialisation, the papers')
START_CHOICES = ("pretrained", "nearest")


def check_start(start: Any, where: str = "start") -> Optional[str]:
    """``start`` if it is None or one of :data:`START_CHOICES`, else ``ValueError`` naming ``where``."""
    if start is None or start in START_CHOICES:
        return start
    raise ValueError(
        f"{where}={start!r} is not a start{did_you_mean(start, START_CHOICES)}; allowed: "
        f"{', '.join(repr(s) for s in START_CHOICES)} or None (the head's own initialisation)"
    )


def options_for_start(cls: type, start: Optional[str], options: Dict[str, Any], where: str = "start") -> Dict[str, Any]:
    """The options of the head class ``cls`` for ``start``: ``options`` as given for None; for ``"pretrained"`` the
    head's exact start added (``ValueError`` where the head has none, or where ``options`` set one of those options
    otherwise); for ``"nearest"`` the same where the head has an exact start that ``options`` allow, else ``options``
    as given and a warning saying how far the start is from the model. ``where`` names the caller's option in
    messages (``"--head-start"`` in fairseq). By name: :func:`hf_heads.start_options`."""
    check_start(start, where)
    options = dict(options)
    if start is None:
        return options
    name, exact = cls.head_name, cls.pretrained_start
    conflicts = [k for k, v in (exact or {}).items() if k in options and options[k] != v]
    if exact is None or (start == "nearest" and conflicts):  # no exact start, or one the given options rule out
        if start == "pretrained":
            raise ValueError(
                f"{where}='pretrained': the {name} head has no start that equals the model it replaces "
                f"({cls.pretrained_start_gap}); {where}='nearest' builds it from the model's projection anyway"
            )
        ruled_out = f" (its exact start needs {', '.join(f'{k}={exact[k]!r}' for k in conflicts)})" if conflicts else ""
        warnings.warn(
            f"{where}='nearest': the {name} head does not start as the model it replaces{ruled_out}: "
            f"{cls.pretrained_start_gap}",
            stacklevel=3,
        )
        return options
    for key in conflicts:
        raise ValueError(
            f"{where}={start!r} sets the {name} option {key}={exact[key]!r} (the exact start), but the options give "
            f"{key}={options[key]!r}; leave {key} out, use {where}='nearest', or leave out {where}"
        )
    return {**options, **exact}


def start_row(cls: type) -> Tuple[bool, str]:
    """``(exact, what it sets or how far it is)`` for the head class ``cls``: a row of the docs' table of starts."""
    if cls.pretrained_start is None:
        return False, cls.pretrained_start_gap
    sets = ", ".join(f"{k}={v!r}" for k, v in cls.pretrained_start.items())
    note = f"; {cls.pretrained_start_gap}" if cls.pretrained_start_gap else ""
    return True, (f"sets {sets}" if sets else "the projection copied") + note
