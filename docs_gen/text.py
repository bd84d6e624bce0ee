"""Text from the code, safe in a Markdown table cell."""

from __future__ import annotations

import re


def markdown_text(text: str) -> str:
    """``|`` would end the cell and ``<name>`` would read as an HTML tag."""
    return re.sub(r"<(?=[A-Za-z/!])", "&lt;", text.replace("|", "\\|"))
