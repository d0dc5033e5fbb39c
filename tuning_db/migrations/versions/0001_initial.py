"""The first schema: workloads (a kernel spec on a target) and their tuning records.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("spec_digest", sa.String(64), nullable=False),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("target_key", sa.String(64), nullable=False),
        sa.Column("target_json", sa.Text, nullable=False),
        sa.Column("mod_hash", sa.String(40), nullable=False),
        sa.Column("mod_json", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_workloads_spec_digest", "workloads", ["spec_digest"])
    op.create_index("ix_workloads_target_key", "workloads", ["target_key"])
    op.create_table(
        "tuning_records",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("workload_id", sa.Integer, sa.ForeignKey("workloads.id"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("mean_us", sa.Float, nullable=True),
        sa.Column("run_secs_json", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("trace_json", sa.Text, nullable=False),
        sa.Column("args_info_json", sa.Text, nullable=False),
        sa.Column("target_json", sa.Text, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("device_model", sa.String(255), nullable=False),
        sa.Column("tvm_version", sa.String(64), nullable=False),
        sa.Column("tvm_ffi_version", sa.String(64), nullable=False),
        sa.Column("qcompile_version", sa.String(64), nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_records_best", "tuning_records", ["workload_id", "status", "mean_us"])


def downgrade() -> None:
    op.drop_index("ix_records_best", table_name="tuning_records")
    op.drop_table("tuning_records")
    op.drop_index("ix_workloads_target_key", table_name="workloads")
    op.drop_index("ix_workloads_spec_digest", table_name="workloads")
    op.drop_table("workloads")
