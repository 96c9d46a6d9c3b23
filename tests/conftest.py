"""Test configuration: hypothesis runs derandomized so every run checks the same cases."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "chronica",
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("chronica")
