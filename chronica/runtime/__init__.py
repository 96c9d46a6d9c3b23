"""One rank's side of a chronica job, framework-neutral (imports ``core`` and ``comm`` only).

The adapters under ``chronica.adapters`` are thin faces over this layer.
"""
