"""How the command line checks its arguments and reports errors (TVM-free, like every module
the CLI imports before a command needs TVM).

Every user error is one line on stderr, ``qcompile[ <command>]: error: <rule and numbers>``,
with exit status 2 and no traceback: argparse's own errors (an unknown flag, ``--trials 0``),
every :class:`~qcompile.errors.QCompileError`, and an operating-system error that names a file.
Anything else is a bug in qcompile: one line saying so, exit status 1. ``--debug`` or
``QCOMPILE_DEBUG=1`` prints the traceback before that line. Ctrl-C exits with 130.

Light: ``tuning_db`` (SQLAlchemy, most of a second) is imported only when an error is reported,
so that ``--help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from qcompile.errors import QCompileError, UsageError

#: Set to 1 (or any value but 0 and empty) for tracebacks, as ``--debug`` does.
DEBUG_ENV_VAR = "QCOMPILE_DEBUG"

#: Exit statuses: a user error, a bug, Ctrl-C (128 + SIGINT).
EXIT_USAGE, EXIT_BUG, EXIT_INTERRUPTED = 2, 1, 130


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (the rule, then where help is), not the
    usage block argparse prints; its subparsers are of the same class."""

    def error(self, message: str):
        """Print ``<prog>: error: <message>; see <prog> --help`` and exit with status 2.

        Parameters
        ----------
        message : str
            argparse's description of what is wrong.
        """
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)}; see {self.prog} "
                              "--help\n")


def one_line(text: str) -> str:
    """``text`` with its lines joined by "; " (an error message must be one line).

    Parameters
    ----------
    text : str
        A message, perhaps of several lines (a database driver's, a wrapped exception's).

    Returns
    -------
    str
    """
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return "; ".join(lines)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--debug`` to ``parser`` and every subcommand's parser below it, so that it may
    stand before or after the command (``qcompile --debug tune``, ``qcompile tune --debug``).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The top-level parser, after every subcommand was added.
    """
    help_text = f"print the traceback of an error (also ${DEBUG_ENV_VAR}=1)"
    parser.add_argument("--debug", action="store_true", help=help_text)
    pending = [parser]
    while pending:
        for action in pending.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                    sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                     help=help_text)
                    pending.append(sub)


def debug_requested(args: argparse.Namespace | None = None) -> bool:
    """Whether ``--debug`` was given or ``$QCOMPILE_DEBUG`` is set (to anything but 0).

    Parameters
    ----------
    args : argparse.Namespace, optional
        The parsed command line.

    Returns
    -------
    bool
    """
    if args is not None and getattr(args, "debug", False):
        return True
    return os.environ.get(DEBUG_ENV_VAR, "") not in ("", "0")


def run_command(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a parsed command and turn what it raises into one line on stderr and an exit status.

    Parameters
    ----------
    command : callable
        The subcommand's function (``args.func``).
    args : argparse.Namespace
        Its parsed arguments.

    Returns
    -------
    int
        The command's own status; 2 for a user error (:class:`~qcompile.errors.QCompileError`,
        an operating-system error naming a file); 1 for anything else (a bug); 130 on Ctrl-C.
    """
    debug = debug_requested(args)
    try:
        return command(args)
    except KeyboardInterrupt:
        print("qcompile: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early (qcompile db ls | head): not an error
        # Python's advice for SIGPIPE: point stdout at /dev/null so that the flush at exit
        # does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except QCompileError as error:
        return _report(f"qcompile: error: {error}", EXIT_USAGE, debug, args)
    except OSError as error:
        if error.filename is None:
            return _report_bug(error, debug, args)
        return _report(f"qcompile: error: {_describe_os_error(error)}", EXIT_USAGE, debug, args)
    except Exception as error:  # noqa: BLE001 - the last resort: one line, not a traceback
        return _report_bug(error, debug, args)


def _report(message: str, status: int, debug: bool, args=None) -> int:
    """Print ``message`` as one line, with the secrets of every URL on the command line (and
    of $QCOMPILE_DB) masked, after the traceback when debugging."""
    from tuning_db.url import scrub_arguments

    if debug:
        traceback.print_exc()
    print(one_line(scrub_arguments(message, args)), file=sys.stderr)
    return status


def _report_bug(error: BaseException, debug: bool, args=None) -> int:
    what = one_line(f"{type(error).__name__}: {error}")
    hint = "the traceback is above" if debug else \
        f"rerun with --debug (or {DEBUG_ENV_VAR}=1) for the traceback"
    return _report(f"qcompile: internal error (a bug in qcompile, please report it): {what}; "
                   f"{hint}", EXIT_BUG, debug, args)


def _describe_os_error(error: OSError) -> str:
    path = error.filename if error.filename2 is None else f"{error.filename} -> {error.filename2}"
    return f"{path}: {error.strerror or error}"


# ---- argument types: each raises argparse.ArgumentTypeError, printed as one line ------------


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts that must be at least 1 (``--trials``, ``--keep``).

    Parameters
    ----------
    text : str
        The flag's value as typed.

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        When the text is not an integer, or the integer is below 1.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (at least 1); got {value}")
    return value


def positive_ints(text: str) -> tuple[int, ...]:
    """An argparse ``type`` for a comma-separated list of counts of at least 1 (``--batch
    1,16``).

    Parameters
    ----------
    text : str
        The flag's value as typed.

    Returns
    -------
    tuple of int
        In the order typed, each once.

    Raises
    ------
    argparse.ArgumentTypeError
        When an item is not an integer, or is below 1.
    """
    return tuple(dict.fromkeys(positive_int(item.strip()) for item in text.split(",")))


def token_ids(text: str) -> list[int]:
    """An argparse ``type`` for token ids, comma-separated (``--prompt-tokens 1,2,3``).

    Parameters
    ----------
    text : str
        The flag's value as typed.

    Returns
    -------
    list of int
        At least one id, each at least 0, in the order typed.

    Raises
    ------
    argparse.ArgumentTypeError
        When an item is not an integer, or is negative.
    """
    ids = []
    for item in text.split(","):
        try:
            ids.append(int(item.strip()))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected token ids separated by commas (e.g. 1,2,3); got {item.strip()!r}"
            ) from None
        if ids[-1] < 0:
            raise argparse.ArgumentTypeError(f"token ids are at least 0; got {ids[-1]}")
    return ids


def tracker_address(text: str) -> tuple[str, int]:
    """An argparse ``type`` for an RPC tracker's address, ``HOST:PORT`` (``--rpc-tracker``,
    ``--tracker``), checked before TVM loads.

    Parameters
    ----------
    text : str
        The address as typed (``127.0.0.1:9190``, ``tracker.lan:9190``).

    Returns
    -------
    tuple of (str, int)
        The host and the port.

    Raises
    ------
    argparse.ArgumentTypeError
        When there is no host, or the port is not an integer in 1..65535.
    """
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host.strip("[]") or not port:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:9190); got {text!r}")
    return host.strip("[]"), port_number(port, "the port of HOST:PORT")


def port_number(text: str, what: str = "a port") -> int:
    """An argparse ``type`` for a TCP port: an integer in 1..65535.

    Parameters
    ----------
    text : str
        The port as typed.
    what : str
        What the number is, for the message.

    Returns
    -------
    int

    Raises
    ------
    argparse.ArgumentTypeError
        When the text is not an integer in 1..65535.
    """
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} must be an integer in 1..65535; got {text!r}") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{what} must be in 1..65535; got {number}")
    return number


def existing_file(text: str) -> str:
    """An argparse ``type`` for an input file that must exist and be a file (not a directory).

    Parameters
    ----------
    text : str
        The path as typed.

    Returns
    -------
    str
        ``text`` itself.

    Raises
    ------
    argparse.ArgumentTypeError
        When nothing is there, or a directory is.
    """
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    return text


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _can_create_in(directory: Path) -> bool:
    """Whether a file can be created in ``directory`` (tried, not guessed from mode bits:
    root passes every permission check, yet cannot write /proc or a read-only mount)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".qcompile-probe-"):
            return True
    except OSError:
        return False


def check_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Refuse an output directory that cannot be written, before any work is done: it must be
    a writable directory, or not exist yet below a writable one (created later, by the command).

    Parameters
    ----------
    path : str or Path
        The directory as given.
    flag : str
        The flag that named it, for the message.

    Returns
    -------
    Path

    Raises
    ------
    qcompile.errors.UsageError
        Naming the flag, the path and the rule.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a directory")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise UsageError(f"{flag} {path}: {base} is a file, not a directory")
    if not _can_create_in(base):
        where = "" if base == path.absolute() else " (the nearest directory of it that exists)"
        raise UsageError(f"{flag} {path}: cannot create files in {base}{where}")
    return path


def check_output_file(path: str | Path, flag: str = "--out") -> Path:
    """Refuse an output file that cannot be written, before any work is done: not a
    directory, and its directory exists and is writable.

    Parameters
    ----------
    path : str or Path
        The file as given.
    flag : str
        The flag that named it, for the message.

    Returns
    -------
    Path

    Raises
    ------
    qcompile.errors.UsageError
        Naming the flag, the path and the rule.
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; expected a file path")
    parent = path.absolute().parent
    if not parent.is_dir():
        state = "is not a directory" if parent.exists() else "does not exist"
        raise UsageError(f"{flag} {path}: directory {parent} {state}")
    if not _can_create_in(parent):
        raise UsageError(f"{flag} {path}: directory {parent} is not writable")
    return path
