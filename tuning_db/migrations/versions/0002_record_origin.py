"""Records say how they came (tune, import FILE, merge URL); JSON columns are LONGTEXT on MySQL.

MySQL's and MariaDB's TEXT holds 64 KiB, less than a large workload's IRModule; other backends'
TEXT has no such limit and is left as it is.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_JSON_COLUMNS = {
    "workloads": [("spec_json", False), ("target_json", False), ("mod_json", False)],
    "tuning_records": [("run_secs_json", True), ("error", True), ("trace_json", False),
                       ("args_info_json", False), ("target_json", False)],
}


def _is_mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    op.add_column("tuning_records",
                  sa.Column("origin", sa.String(255), nullable=False, server_default=""))
    if _is_mysql():
        for table, columns in _JSON_COLUMNS.items():
            for column, nullable in columns:
                op.alter_column(table, column, type_=mysql.LONGTEXT(), existing_type=sa.Text(),
                                existing_nullable=nullable)


def downgrade() -> None:
    if _is_mysql():
        for table, columns in _JSON_COLUMNS.items():
            for column, nullable in columns:
                op.alter_column(table, column, type_=sa.Text(), existing_type=mysql.LONGTEXT(),
                                existing_nullable=nullable)
    with op.batch_alter_table("tuning_records") as batch:
        batch.drop_column("origin")
