"""Grain face: a random-access data source whose records are whole steps of a chronica plan
(imports neither grain nor jax; ``StepSource.sampler()`` imports grain)."""

from chronica.adapters.grain.source import StepSampler, StepSource

__all__ = ["StepSampler", "StepSource"]
