"""Alembic's entry point: runs the revisions on the connection :mod:`tuning_db.schema` hands it.

Online only: qcompile always migrates a live database, through the connection (and so the
transaction, and the schema lock) of the caller.
"""

from alembic import context

from tuning_db.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("tuning_db migrations run through tuning_db.schema.upgrade(), "
                       "which passes the connection: use `qcompile db upgrade`")

context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite",
                  transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
