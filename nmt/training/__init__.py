"""Training: the loss, AdamW and its learning-rate schedule, the plan to the clock, checkpoints,
the run lock and torchrun's ranks; train.py runs them."""
