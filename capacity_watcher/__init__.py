"""The capacity watcher: a scheduled Lambda function that moves a cluster's group to on-demand when spot capacity does
not come, and back to spot (``handler.py``; its decision, a pure function, in ``decision.py``)."""
