"""Local emulated cloud: moto on loopback, a CloudFormation compatibility layer, real CDK deploys into it.

- :mod:`emulator.cloud`: :class:`EmulatedCloud` starts and always stops the AWS endpoint.
- :mod:`emulator.server`: the endpoint process (moto's server app with :mod:`emulator.cfn_compat`).
- :mod:`emulator.cfn_compat`: what moto lacks for our templates, a module per AWS service, each item documented.
- :mod:`emulator.deploy`: ``cdk bootstrap`` and ``cdk deploy`` with the real CDK CLI into the endpoint.
- ``python -m emulator up``: all of the above, then wait for Ctrl-C.
"""

from emulator.cloud import EmulatedCloud, EmulatorError
from emulator.settings import ACCOUNT_ID, REGION

__all__ = ["ACCOUNT_ID", "REGION", "EmulatedCloud", "EmulatorError"]
