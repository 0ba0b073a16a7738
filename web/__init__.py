"""The dashboard's files (HTML, ES modules, CSS, the vendored chart library); `service.api.web` serves them."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
