"""``chronica.torch.hf``: chronica's samplers under Hugging Face accelerate and the
transformers ``Trainer`` (see ``chronica.adapters.torch.hf``).

``prepare(accelerator, model, optimizer, loader)`` in place of ``accelerator.prepare(...)``;
``Trainer`` in place of ``transformers.Trainer`` (``TrainerMixin`` for its subclasses).
Importing this module imports neither transformers nor accelerate; ``Trainer`` imports
transformers when first used.
"""

from typing import Any

from chronica.adapters.torch.hf import TrainerMixin, prepare, unshard

__all__ = ["Trainer", "TrainerMixin", "prepare", "unshard"]

Trainer: type  # imported from chronica.adapters.torch.hf on first use (``__getattr__``)


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        from chronica.adapters.torch import hf

        return hf.Trainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
