"""Every face takes every plan option of ``ScheduleConfig`` under its own name, documents it,
and hands it to the plan unchanged: a new option is declared once and reaches them all."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

from chronica import OutlierDelay
from chronica.core import ControllerOptions, Packing, ScheduleConfig

# One value other than the default for every plan option, valid next to a static kind.
SAMPLES = {
    "kind": "guided",
    "exact": False,
    "shuffle": False,
    "seed": 5,
    "drop_last": True,
    "cost": "quadratic",
    "jitter": 0.3,
    "groups": (0, 1),
    "window": 4,
    "min_batch": 1,
    "max_batch": 4,
    "controller": ControllerOptions(memory=0.5),
    "packing": Packing(max_tokens=64, outliers=OutlierDelay(max_delay=2)),
    # variable_batch needs kind="dynamic", whose coordinator the faces' dynamic tests start.
    "variable_batch": None,
}
SIZES = np.arange(1, 33)


def _torch_sampler(**options):
    from chronica.torch.utils.data import DistributedSampler

    return DistributedSampler(list(range(32)), 2, 0, batch_size=8, sizes=SIZES, **options)


def _torch_batch_sampler(**options):
    from chronica.torch.utils.data import DistributedBatchSampler

    return DistributedBatchSampler(list(range(32)), 8, 2, 0, sizes=SIZES, **options)


def _jax_iterator(**options):
    import chronica.jax

    source = [np.arange(n) for n in SIZES]
    return chronica.jax.iterator(
        source, SIZES, global_batch_size=8, num_replicas=2, rank=0, **options
    )


def _grain_source(**options):
    import chronica.jax

    source = [np.arange(n) for n in SIZES]
    return chronica.jax.StepSource(
        source, SIZES, global_batch_size=8, num_replicas=2, rank=0, **options
    )


def _tf_schedule(**options):
    import chronica.tf

    return chronica.tf.schedule(SIZES, global_batch_size=8, num_replicas=2, rank=0, **options)


FACES = {  # each face by its public name
    "chronica.torch.utils.data.DistributedSampler": _torch_sampler,
    "chronica.torch.utils.data.DistributedBatchSampler": _torch_batch_sampler,
    "chronica.jax.iterator": _jax_iterator,
    "chronica.jax.StepSource": _grain_source,
    "chronica.tf.schedule": _tf_schedule,
}


# The framework each face needs; a face whose framework is not installed is skipped. (A
# submodule, since the test folders named after the frameworks import as namespaces.)
FRAMEWORKS = {"torch": "torch.nn", "jax": "jax.numpy", "tf": "tensorflow"}


def _needs(face):
    pytest.importorskip(FRAMEWORKS[face.split(".")[1]])


def _face_class(dotted):
    _needs(dotted)
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _config(face):
    # tf.schedule holds its config from construction (its streams wait for the data set).
    if isinstance(vars(face).get("config"), ScheduleConfig):
        return face.config
    return face.scheduler.config


def test_the_samples_cover_every_plan_option():
    assert set(SAMPLES) == set(ScheduleConfig.option_names())


@pytest.mark.parametrize("face", FACES)
def test_every_face_signs_and_documents_every_plan_option(face):
    cls = _face_class(face)
    params = inspect.signature(cls).parameters
    doc = inspect.getdoc(cls) or ""
    for name in ScheduleConfig.option_names():
        assert name in params, (face, name)
        assert f"\n    {name}: " in "\n" + doc or f"\n{name}: " in "\n" + doc, (face, name)


@pytest.mark.parametrize("face", FACES)
def test_every_face_hands_every_plan_option_to_the_plan(face):
    _needs(face)
    build = FACES[face]
    for name, value in SAMPLES.items():
        if value is None:
            continue
        if name == "packing" and face == "chronica.torch.utils.data.DistributedSampler":
            with pytest.raises(ValueError, match="use DistributedBatchSampler"):
                build(packing=value)
            continue
        expected = ScheduleConfig(num_replicas=2, batch_size=8, **{name: value})
        assert getattr(_config(build(**{name: value})), name) == getattr(expected, name), name


@pytest.mark.parametrize("face", FACES)
def test_every_face_refuses_an_unknown_option_by_name(face):
    _needs(face)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'jiter'; did you mean"):
        FACES[face](jiter=0.2)
    config = ScheduleConfig(num_replicas=2, batch_size=8, seed=9)
    with pytest.raises(ValueError, match="pass seed inside it"):
        FACES[face](config=config, seed=3)


@pytest.mark.parametrize(
    "face", ["chronica.torch.utils.data.DistributedBatchSampler", "chronica.jax.iterator"]
)
def test_a_dynamic_config_runs_with_transport_options_beside_it(face):
    # config= holds the plan (kind="dynamic", its window), dynamic= the transport: one rank
    # and a real coordinator on an OS-picked port; every sample once.
    _needs(face)
    from chronica.runtime import DynamicOptions

    config = ScheduleConfig(num_replicas=1, batch_size=8, kind="dynamic", window=2)
    transport = DynamicOptions(port=0, timeout=30.0)
    if face == "chronica.jax.iterator":
        import chronica.jax

        source = [np.arange(n) for n in SIZES]
        it = chronica.jax.iterator(source, SIZES, config=config, dynamic=transport, rank=0)
    else:
        from chronica.torch.utils.data import DistributedBatchSampler

        it = DistributedBatchSampler(
            list(range(32)), sizes=SIZES, config=config, dynamic=transport, rank=0
        )
    try:
        assert it.stream.config is config and it.stream.session is not None
        seen = []
        for batch in it:
            indices = batch["indices"] if isinstance(batch, dict) else batch
            seen.extend(int(i) for i in indices if i >= 0)
            it.report(0.01)
        assert sorted(seen) == list(range(32))
        assert it.stream.session.windows_dynamic >= 1
    finally:
        it.close()
