"""On-node helpers for training scripts: ``spot_training.checkpoint`` (the checkpoint helper) and
``spot_training.launch`` (torchrun with its TCP stores bound to one address). The node agent puts this
directory on the trainer's PYTHONPATH."""
