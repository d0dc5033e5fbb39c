"""Trust: which records a host may believe, and how busy the machine was when it measured.

- ``tuning_records.claimed``: the record came by an import or a merge, so its provenance (who
  measured it, where) is what the file or the other database said, not what anyone here saw.
- ``tuning_records.seal``: an HMAC over the record's digest, device model and run times, made
  with the measuring host's key (or a team's key); see ``qcompile.trust.seals``.
- ``tuning_records.other_load``: how many cores other processes (and the hypervisor) kept busy
  while the record was measured.
- ``measurements``: later measurements of a record (``build`` re-measuring the few fastest
  candidates here, ``tune`` re-measuring its best when the machine is quieter, ``db verify``),
  each with its own provenance, load and seal. Unique by ``digest`` so imports stay idempotent.
- Origins written before this revision by ``db merge`` may carry a URL's secrets: they are
  scrubbed here.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_JsonText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    with op.batch_alter_table("tuning_records") as batch:
        batch.add_column(sa.Column("claimed", sa.Boolean, nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("seal", sa.String(160), nullable=False, server_default=""))
        batch.add_column(sa.Column("other_load", sa.Float, nullable=True))
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("record_id", sa.Integer,
                  sa.ForeignKey("tuning_records.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("run_secs_json", _JsonText, nullable=False),
        sa.Column("mean_us", sa.Float, nullable=False),
        sa.Column("other_load", sa.Float, nullable=True),
        sa.Column("host", sa.String(255), nullable=False, server_default=""),
        sa.Column("device_model", sa.String(255), nullable=False, server_default=""),
        sa.Column("user", sa.String(128), nullable=False, server_default=""),
        sa.Column("tvm_version", sa.String(64), nullable=False, server_default=""),
        sa.Column("qcompile_version", sa.String(64), nullable=False, server_default=""),
        sa.Column("claimed", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("seal", sa.String(160), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=sa.func.now()),
    )
    _scrub_origins()


def _scrub_origins() -> None:
    from tuning_db.url import redact_origin

    records = sa.table("tuning_records", sa.column("id", sa.Integer),
                       sa.column("origin", sa.String))
    bind = op.get_bind()
    rows = bind.execute(sa.select(records.c.id, records.c.origin)
                        .where(records.c.origin != "")).all()
    for record_id, origin in rows:
        clean = redact_origin(origin)
        if clean != origin:
            bind.execute(records.update().where(records.c.id == record_id)
                         .values(origin=clean[:255]))


def downgrade() -> None:
    op.drop_table("measurements")
    with op.batch_alter_table("tuning_records") as batch:
        batch.drop_column("other_load")
        batch.drop_column("seal")
        batch.drop_column("claimed")
