"""The package's stages import downstream, never upstream: no module of the data stage (nmt/corpora/)
imports one of training or inference, directly or through another module (model scoring of pairs
is handed to the store as a scorer by the program that builds it: nmt/inference/pair_scoring.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("nmt.inference", "nmt.training")

# Imports the given modules one after the other in a fresh interpreter, recording which forbidden
# modules each import loads (the first to load one is named). It passes only when none ever loads,
# which is the verdict of a fresh interpreter per module, at one start-up's cost.
PROBE = """
import importlib, json, sys
def forbidden():
    return {m for m in sys.modules if m.split(".")[:2] in [f.split(".") for f in %r]}
loaded = {}
for name in sys.argv[1:]:
    before = forbidden()
    importlib.import_module(name)
    loaded[name] = sorted(forbidden() - before)
print(json.dumps(loaded))
""" % (FORBIDDEN,)


def test_no_data_stage_module_imports_training_or_inference() -> None:
    modules = [f"nmt.corpora.{path.stem}" for path in sorted((ROOT / "nmt" / "corpora").glob("*.py"))
               if path.stem != "__init__"]
    assert "nmt.corpora.store" in modules and "nmt.corpora.cleaning" in modules
    result = subprocess.run([sys.executable, "-c", PROBE, *modules], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded == {name: [] for name in modules}, {name: found for name, found in loaded.items() if found}
