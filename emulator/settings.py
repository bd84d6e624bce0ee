"""Fixed identity of the emulated cloud: moto's default account, one region, fake credentials."""

from __future__ import annotations

ACCOUNT_ID = "123456789012"
REGION = "us-east-1"
# moto accepts any credentials; these are obviously fake so nothing can mistake them for real ones.
ACCESS_KEY_ID = "AKIAEMULATOREXAMPLE0"
SECRET_ACCESS_KEY = "emulator-secret-access-key-not-a-real-secret"  # noqa: S105
