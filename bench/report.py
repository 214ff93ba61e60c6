"""How every benchmark hands over its figures: indented JSON on standard output, and the same in a file if asked."""

from __future__ import annotations

import json
from pathlib import Path


def save(result: dict, out: Path | None) -> None:
    """Print `result` as JSON and, when `out` is given, write it there (its folder made if need be)."""
    text = json.dumps(result, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)
