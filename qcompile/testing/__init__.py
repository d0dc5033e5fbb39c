"""Test support that ships with the package (other families' tests use it too)."""
