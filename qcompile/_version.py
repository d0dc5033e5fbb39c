"""qcompile's version, on the bottom floor (docs/architecture.md): the database stamps it on
every record it stores, and ``import qcompile`` re-exports it."""

__version__ = "0.1.0"
