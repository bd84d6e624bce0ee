"""The CDK app behind ``app.py``: the wiring (teams to stacks and gates), the CloudFormation validator's worker and
the one-line errors a synth stops with.

Importing this package loads nothing: :mod:`training_app.validator` is stdlib only (the engine starts before
aws-cdk-lib loads), :mod:`training_app.wiring` loads aws-cdk-lib.
"""
