"""Fixtures for the compiler tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def host_target():
    from compiler.target import resolve_target

    return resolve_target("host")
