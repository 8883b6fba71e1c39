"""The library behind the programs at the top level (train.py, translate.py, evaluate.py, clean.py,
export.py, serve.py), one folder per stage of the data's path:

- `nmt.corpora`: reading corpora of every form, cleaning them, the tokenizers and the tokenized store;
- `nmt.training`: the loss, the optimizer and its schedule, the plan to the clock, checkpoints,
  torchrun's ranks;
- `nmt.inference`: decoding, glossaries, confidence, the translator over two engines, sentences and
  documents, scores;
- `nmt.serving`: what the HTTP server needs besides its routes.

Beside them, what every stage uses: atomic files (`atomic_files`), the device (`device`), the
precision (`precision`), the CPU's fast kernels (`cpu_kernels`) and stderr's lines (`diagnostics`).
The tutorial's own files (config.py, dataset.py, model.py) stay at the top level, and the package
imports them from there; no stage imports a later one's modules, but for training, whose
validation decodes. Run everything from the repository's root.
"""
