"""The errors qcompile raises on purpose. Each message states the rule that was broken and
the numbers involved, so that a user can fix the input without reading our source."""


class QCompileError(Exception):
    """Base class of every error qcompile raises on purpose."""


class SpecError(QCompileError, ValueError):
    """A kernel spec breaks a rule (a bit width, a shape, a group size)."""


class FormatError(QCompileError, ValueError):
    """Checkpoint tensors do not follow their format (a shape, a dtype, a packed field)."""


class NoRecordError(QCompileError, LookupError):
    """The database holds no successful tuning record for a workload."""


class LoadError(QCompileError, RuntimeError):
    """An exported kernel cannot be loaded here (manifest, checksum, or host support)."""


class DatabaseError(QCompileError, RuntimeError):
    """The tuning database cannot be used (unreachable, corrupt, or a schema mismatch)."""


class UsageError(QCompileError, ValueError):
    """A command-line or API argument that is not a tensor breaks a rule (a count such as
    ``--trials``, a path that cannot be written, a URL that is not one)."""


class ArgumentError(QCompileError, ValueError):
    """A tensor passed to a kernel has the wrong dtype, shape or device."""


class TargetUnavailableError(QCompileError, RuntimeError):
    """This host cannot run the target an operation needs (tuning measures on the target)."""


class RecordRefused(DatabaseError):
    """A tuning record (from a tune, an import, a merge or a shared database) breaks a rule of
    what a record may hold: an instruction or annotation no design space of ours emits, a
    digest that does not match its content, a latency that is not a finite positive number.
    The message names the record's digest, what was found and the rule."""


class SealKeyError(QCompileError):
    """A seal key file (the host's, or the team's named by $QCOMPILE_TEAM_KEY_FILE) cannot be
    used: unreadable, or too short."""
