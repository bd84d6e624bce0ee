"""``python -m cfn_validate``: copy aws-cdk-lib's CloudFormation validation engine into the venv (make run-deps)."""

from cfn_validate import extract

print(f"aws-cdk-lib's CloudFormation validation engine: {extract()}")
