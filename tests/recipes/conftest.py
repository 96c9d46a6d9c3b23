"""The recipes (``examples/recipes/*.py``) are scripts users run and paste from; their tests
import them as modules from that folder."""

import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"
if str(RECIPES) not in sys.path:
    sys.path.insert(0, str(RECIPES))
