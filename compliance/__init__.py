"""What checks the synthesized templates, apart from the constructs it checks.

- :mod:`compliance.spot_training`: the SpotTraining cdk-nag rule pack (``SpotTraining-ST<n>``).
- :mod:`compliance.nag`: acknowledging a cdk-nag finding on a construct, and a failed plugin's report.
- :mod:`compliance.checkov`: skipping a checkov check on a CloudFormation resource.
"""
