"""Alembic migrations of the tuning database (``qcompile db upgrade`` runs them).

Each revision declares the table shapes it creates or changes itself, never through
:mod:`tuning_db.models`, so that an old revision keeps meaning what it meant.
"""
