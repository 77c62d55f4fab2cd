"""Checkpoint conversion: reading BERT-family checkpoints, lifting them into the global-local encoder, the packaged default model."""
