"""Tests (a package, so each folder's conftest has its own module name)."""
