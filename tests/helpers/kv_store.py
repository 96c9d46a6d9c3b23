"""An in-process key-value store with the calls a coordination service gives
``chronica.runtime.KeyValueAgreement`` (``put``, a blocking ``get``, ``delete``), for tests
whose ranks are threads of one process."""

from __future__ import annotations

import threading

__all__ = ["LocalStore"]


class LocalStore:
    """``values`` holds what was put and not deleted; ``get`` waits on a condition (no
    polling) and raises ``RuntimeError`` when ``timeout_ms`` pass first, as a coordination
    service's deadline does; a key is written once."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self._changed = threading.Condition()

    def put(self, key: str, value: str) -> None:
        with self._changed:
            assert key not in self.values, f"{key} written twice"
            self.values[key] = value
            self._changed.notify_all()

    def get(self, key: str, timeout_ms: int) -> str:
        with self._changed:
            if not self._changed.wait_for(lambda: key in self.values, timeout_ms / 1000):
                raise RuntimeError(f"DEADLINE_EXCEEDED {key}")
            return self.values[key]

    def delete(self, key: str) -> None:
        with self._changed:
            self.values.pop(key, None)

    def calls(self):
        """``(put, get, delete)``, what ``key_value_agreement``'s ``store`` returns."""
        return self.put, self.get, self.delete
