"""chronica's ``Dataset``: a ``torch.utils.data.Dataset`` whose samples say how big they
are (``__sizeof__(self, index)``), and the warnings a sampler gives when the sizes it reads
would silently be one per sample or would break ``sys.getsizeof``."""

from __future__ import annotations

import functools
import inspect
import warnings
from types import FunctionType
from typing import Any

from torch.utils.data import Dataset as _TorchDataset

from chronica.adapters.hf import size_columns
from chronica.core.sizes import defines_sizeof

__all__ = ["Dataset", "check_sizes_source"]


class Dataset(_TorchDataset):
    """A ``torch.utils.data.Dataset`` whose samples can say how big they are.

    Override ``__sizeof__(self, index)`` to return the relative size of sample ``index``
    (frames, tokens, seconds); chronica calls it once per sample when a sampler is built.
    The default makes every sample size 1. Called without an index it is Python's usual
    ``__sizeof__``, so ``sys.getsizeof`` keeps working, also for a subclass whose override
    takes the index only (``def __sizeof__(self, index)``, as in the quick start): such an
    override is wrapped when the subclass is defined.

    Example::

        class Clips(chronica.torch.utils.data.Dataset):
            def __sizeof__(self, index):
                return self.frames[index]
    """

    def __sizeof__(self, index: int | None = None) -> int:
        if index is None:
            return object.__sizeof__(self)
        return 1

    __sizeof__.__chronica_default__ = True  # type: ignore[attr-defined]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        method = vars(cls).get("__sizeof__")
        if isinstance(method, FunctionType) and not hasattr(method, "__chronica_wrapped__"):
            cls.__sizeof__ = _memory_size_without_index(method)  # type: ignore[method-assign]


def _memory_size_without_index(method: Any) -> Any:
    """``method`` (a ``__sizeof__(self, index)``) that, called without an index as
    ``sys.getsizeof`` does, gives the object's memory size instead of a ``TypeError``."""

    @functools.wraps(method)
    def __sizeof__(self: Any, index: int | None = None) -> Any:
        if index is None:
            return object.__sizeof__(self)
        return method(self, index)

    __sizeof__.__chronica_wrapped__ = True  # type: ignore[attr-defined]
    return __sizeof__


def check_sizes_source(dataset: Any, sizes: Any, warn_missing: bool) -> None:
    """Warn, naming the fix, when a balancing sampler's sizes would silently be one per
    sample, or when the data set's ``__sizeof__(self, index)`` breaks ``sys.getsizeof``."""
    if defines_sizeof(dataset):
        method = type(dataset).__sizeof__
        if not hasattr(method, "__chronica_wrapped__") and not _index_optional(method):
            warnings.warn(
                f"{type(dataset).__name__}.__sizeof__(self, index) makes sys.getsizeof("
                "dataset) raise a TypeError (Python calls it without an index); write "
                "def __sizeof__(self, index=None) returning object.__sizeof__(self) for "
                "None, or subclass chronica.torch.utils.data.Dataset, which does that",
                stacklevel=4,
            )
        return
    if sizes is not None or getattr(dataset, "sizes", None) is not None or not warn_missing:
        return
    columns = size_columns(dataset)
    hint = f" (a column name: one of {columns})" if columns else ""
    warnings.warn(
        f"chronica: no sample sizes for {type(dataset).__name__}, so every sample weighs 1: "
        "nothing can be balanced and stats() reports a perfect balance that is not real. "
        f"Pass sizes= (one number per sample{hint}), give the data set a sizes attribute, "
        "or define __sizeof__(self, index)",
        stacklevel=4,
    )


def _index_optional(method: Any) -> bool:
    """Whether ``method(self)``, without an index, is a valid call."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    params = list(signature.parameters.values())[1:]
    return (
        not params
        or params[0].default is not inspect.Parameter.empty
        or params[0].kind
        in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        )
    )
