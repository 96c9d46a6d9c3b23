"""TensorFlow adapter: ``tf.data`` transformations (importing it imports tensorflow)."""

from chronica.adapters.tf.data import Schedule, schedule

__all__ = ["Schedule", "schedule"]
