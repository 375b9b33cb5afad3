import sys
from pathlib import Path

# The model builders (tests/models) and the fresh-process runner (tests/ops).
for _sub in ("models", "ops"):
    sys.path.insert(0, str(Path(__file__).parent.parent / _sub))
sys.path.insert(0, str(Path(__file__).parent))
