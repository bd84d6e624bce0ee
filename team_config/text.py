"""Text files people write (team files, price files): one message for bytes that are not UTF-8."""

from __future__ import annotations


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What is wrong and the fix, for a file that ``read_text(encoding="utf-8")`` refused."""
    return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
