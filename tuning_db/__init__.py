"""The tuning database: SQLAlchemy models, the storage layer, and MetaSchedule's view of it.

The light names (``Storage``, URL helpers) import without TVM; ``SqlDatabase`` (a MetaSchedule
``PyDatabase``) lives in :mod:`tuning_db.database` and imports TVM.
"""

from tuning_db.models import STATUS_BUILD_ERROR, STATUS_OK, STATUS_RUN_ERROR, STATUSES
from tuning_db.storage import Provenance, RecordInfo, Storage, WorkloadInfo, WorkloadSummary
from tuning_db.url import ENV_VAR, default_url, redact, redact_origin, resolve_url, scrub

__all__ = [
    "ENV_VAR",
    "STATUSES",
    "STATUS_BUILD_ERROR",
    "STATUS_OK",
    "STATUS_RUN_ERROR",
    "Provenance",
    "RecordInfo",
    "Storage",
    "WorkloadInfo",
    "WorkloadSummary",
    "default_url",
    "redact",
    "redact_origin",
    "resolve_url",
    "scrub",
]
