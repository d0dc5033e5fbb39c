"""Where the tuning database lives, and how to show its URL without its secrets.

Every URL that qcompile prints, logs, raises, or writes (a manifest, a record's ``origin``, an
export) goes through :func:`redact`; free text that may hold a URL or one of its secrets (a
driver's error message) goes through :func:`scrub`; stored ``origin`` text through
:func:`redact_origin`.

The rule
--------
A secret is

- the password of the userinfo (``scheme://user:PASSWORD@host``), empty or not; when it holds
  an unencoded ``@``, everything up to the last ``@`` before the host;
- the value of every query parameter whose name, lower-cased and stripped of everything but
  letters and digits, contains one of :data:`SECRET_WORDS` (``pass``, ``pwd``, ``secret``,
  ``token``, ``auth``, ``credential``, ``apikey``, ``accesskey``, ``privatekey``) or is one of
  :data:`SECRET_NAMES` (``key``, ``sig``, ``signature``): so ``password``, ``passwd``,
  ``sslpassword``, ``ssl_password``, ``PWD``, ``passfile``, ``client_secret``, ``api-key``,
  ``access_token``, ``auth_token``...;
- inside the value of any other parameter (``odbc_connect=DRIVER=...;PWD=x``), a ``name=value``
  pair whose name is a secret by the same test.

Every secret becomes :data:`MASK` (``***``); nothing else changes meaning, so ``sslmode``,
``charset``, ``options=-csearch_path%3D...``, ``application_name``, the user name, host, port
and database stay readable. A URL that cannot be parsed is never shown: it becomes
:data:`UNPARSEABLE`. The user name is not a secret (a service that takes a token as its user
name needs the token passed as a parameter or through ``$QCOMPILE_DB`` in a file only you read).

In free text (:func:`scrub`) each secret of the URLs given is replaced in every spelling
(raw, percent-decoded, percent-encoded; one shorter than four characters only where it stands
as a word of its own, so that a one-letter password does not eat every "p" of a message), and
any other URL or ``password=...`` pair the text holds is masked by the same rule.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from pathlib import Path
from urllib.parse import quote, quote_plus, unquote, unquote_plus

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from qcompile.errors import DatabaseError

#: Environment variable naming the database URL when ``--db`` is not given.
ENV_VAR = "QCOMPILE_DB"
#: What a secret becomes.
MASK = "***"
#: What a URL that cannot be parsed becomes (it may hold a secret we cannot find).
UNPARSEABLE = "<unparseable database URL>"
#: A query parameter whose normalized name contains one of these carries a secret.
SECRET_WORDS = ("pass", "pwd", "secret", "token", "auth", "credential", "apikey", "accesskey",
                "privatekey")
#: A query parameter whose normalized name is one of these carries a secret.
SECRET_NAMES = frozenset({"key", "sig", "signature"})

_SHORT = 4  # secrets shorter than this are scrubbed from free text only as whole words
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`.,;:)\]]")
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:)(?P<password>.*)@")
# name=value (a libpq DSN, an ODBC string, a query string), value quoted or up to a separator.
_PAIR = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<eq>\s*=\s*)(?P<value>"
                   r"'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?"  # quoted
                   r"|(?:[^\s&;,'\")}\]]*[^\s&;,'\")}\].:])?)")  # up to a separator
# "name": "value" (JSON, a Python dict's repr)
_QUOTED_PAIR = re.compile(r"(?P<q>['\"])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=q)(?P<eq>\s*:\s*)"
                          r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def cache_dir() -> Path:
    """qcompile's per-user cache: $XDG_CACHE_HOME/qcompile, else ~/.cache/qcompile."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qcompile"


def default_url() -> str:
    """The embedded SQLite file in the user's cache directory."""
    return f"sqlite:///{cache_dir() / 'tuning.sqlite'}"


#: Backends the storage layer speaks (its upserts are written for these dialects).
BACKENDS = ("sqlite", "postgresql", "mysql", "mariadb")

#: Backends named without a driver (the URL forms people type) -> the drivers that ship with
#: qcompile (setup.cfg: psycopg2-binary, pymysql). SQLAlchemy's own defaults (psycopg for
#: ``postgresql://`` since 2.1, mysqlclient for ``mysql://`` and ``mariadb://``) are not
#: installed with qcompile. ``postgres://`` (libpq's and Heroku's spelling) is read as
#: ``postgresql://``.
SHIPPED_DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+pymysql",
                   "mariadb": "mariadb+pymysql"}

#: What a database URL looks like, for messages.
URL_EXAMPLES = ("sqlite:////path/to/tuning.sqlite, postgresql://user@host/db, "
                "mysql://user@host/db, mariadb://user@host/db")


def resolve_url(url: str | None = None) -> str:
    """The database URL to open: ``url`` if given, else $QCOMPILE_DB, else :func:`default_url`,
    with a driver-less ``postgresql://``, ``postgres://``, ``mysql://`` or ``mariadb://``
    rewritten to the driver qcompile ships (:data:`SHIPPED_DRIVERS`).

    Parameters
    ----------
    url : str, optional
        A SQLAlchemy URL (``--db``).

    Returns
    -------
    str
        The URL, unchanged when it names a driver or is SQLite.

    Raises
    ------
    qcompile.errors.DatabaseError
        When the text is not a URL, or names a backend the tuning database does not support.
    """
    text = url or os.environ.get(ENV_VAR) or default_url()
    source = "--db" if url else f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "the default URL"
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):
        # Echo the text only when it cannot hold a password (no user part, no query).
        shown = f" {text!r}" if "@" not in text and "?" not in text else ""
        raise DatabaseError(f"{source}{shown} is not a database URL; expected e.g. "
                            f"{URL_EXAMPLES}") from None
    backend, _, driver = parsed.drivername.partition("+")
    backend = "postgresql" if backend == "postgres" else backend
    if backend not in BACKENDS:
        raise DatabaseError(f"{source}: database kind {backend!r} is not supported; supported: "
                            f"{', '.join(BACKENDS)} (e.g. {URL_EXAMPLES})")
    drivername = f"{backend}+{driver}" if driver else SHIPPED_DRIVERS.get(backend, backend)
    if drivername == parsed.drivername:
        return text
    return parsed.set(drivername=drivername).render_as_string(hide_password=False)


def is_secret_name(name: str, *, in_url: bool = True) -> bool:
    """Whether a query parameter (or ``name=value`` key) called ``name`` carries a secret.

    Parameters
    ----------
    name : str
        The parameter's name, percent-decoded.
    in_url : bool
        A URL's query parameter (True), or a ``name=value`` pair in free text (False), where
        the short :data:`SECRET_NAMES` ("key=value" in a message) are ordinary words.

    Returns
    -------
    bool
        True when its lower-cased letters and digits contain one of :data:`SECRET_WORDS` or,
        in a URL, are one of :data:`SECRET_NAMES` (the module's rule).
    """
    normal = re.sub(r"[^a-z0-9]", "", str(name).lower())
    return (in_url and normal in SECRET_NAMES) or any(word in normal for word in SECRET_WORDS)


def redact(url) -> str:
    """The database URL with every secret replaced by ``***``: safe for output, logs, errors,
    manifests and stored provenance.

    Parameters
    ----------
    url : str or sqlalchemy.engine.URL
        Any database URL (``postgresql://``, ``postgresql+psycopg2://``, ``mysql+pymysql://``,
        ``mariadb://``, ``sqlite:///path?...``...).

    Returns
    -------
    str
        The URL with the userinfo password and the values of secret query parameters (the
        module's rule) masked, repeated parameters each masked; :data:`UNPARSEABLE` when the
        URL cannot be parsed. Never raises.
    """
    try:
        parsed = make_url(url)
        host = parsed.host
        if host and "@" in host:
            # "user:p@ss@host": the password held an unencoded "@"; everything up to the last
            # "@" is userinfo, and none of it is shown.
            parsed = parsed.set(host=host.rsplit("@", 1)[1], password=MASK)
        query = {}
        for name, value in parsed.query.items():
            values = value if isinstance(value, tuple) else (value,)
            if is_secret_name(name):
                values = tuple(MASK for _ in values)
            else:
                values = tuple(_mask_pairs(v) for v in values)
            query[name] = values if isinstance(value, tuple) else values[0]
        shown = parsed.set(query=query).render_as_string(hide_password=True)
        return shown.replace(quote(MASK, safe=""), MASK)  # the query's *** percent-encoded
    except Exception:  # noqa: BLE001 - a URL we cannot read is never shown
        return UNPARSEABLE


def secrets_of(url) -> list[str]:
    """The secrets a URL carries, in every spelling a message might echo them in.

    Parameters
    ----------
    url : str or sqlalchemy.engine.URL
        A database URL; it need not parse (a tolerant reading finds its secrets anyway).

    Returns
    -------
    list of str
        Non-empty strings, longest first: the userinfo password and secret parameter values,
        each raw, percent-decoded and percent-encoded.
    """
    found: set[str] = set()
    try:
        text = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    except Exception:  # noqa: BLE001
        return []
    try:
        parsed = make_url(text)
        if parsed.password:
            found.add(str(parsed.password))
        for name, value in parsed.query.items():
            values = value if isinstance(value, tuple) else (value,)
            if is_secret_name(name):
                found.update(values)
            else:  # odbc_connect=...;PWD=x;...
                found.update(_pair_secrets(" ".join(values)))
    except Exception:  # noqa: BLE001 - unparseable: the tolerant reading below still runs
        pass
    head = _USERINFO.match(text)
    if head:
        # "user:PASSWORD@" up to the last "@"; when a password holds an unencoded "@" the
        # readings are ambiguous, and every reading and every piece of them is a secret.
        userinfo = head.group("password")
        found.add(userinfo)
        if "@" in userinfo:
            found.update(userinfo[:at] for at in range(len(userinfo)) if userinfo[at] == "@")
            found.update(re.split(r"[@:]", userinfo))
    query = text.split("?", 1)[1] if "?" in text else ""
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if is_secret_name(unquote_plus(name)):
            found.update((value, unquote_plus(value), unquote(value)))
        else:
            found.update(_pair_secrets(unquote_plus(value)))
    for value in list(found):
        found.update((quote(value, safe=""), quote_plus(value), quote(value),
                      repr(value)[1:-1]))
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text, *urls) -> str:
    """Free text (a driver's error message, a log line) with every secret taken out.

    Parameters
    ----------
    text : str
        The text; anything else is turned into ``str`` first.
    *urls : str
        URLs whose secrets the text may echo, percent-encoded or not: each occurrence of one
        of them becomes its :func:`redact` form, each of their secrets (:func:`secrets_of`)
        becomes ``***``.

    Returns
    -------
    str
        The text where, besides, any URL it holds has its userinfo password and secret
        parameters masked, and any ``name=value`` or ``"name": "value"`` pair whose name is a
        secret (:func:`is_secret_name`, a libpq DSN's ``password=...`` say) has its value
        masked. Never raises.
    """
    try:
        text = str(text)
        for url in urls:
            if not url:
                continue
            raw = url if isinstance(url, str) else url.render_as_string(hide_password=False)
            text = text.replace(raw, redact(raw))
            for secret in secrets_of(raw):
                if len(secret) >= _SHORT:
                    text = text.replace(secret, MASK)
                else:  # a short one only as a word of its own, or every "p" of a text goes
                    text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])",
                                  MASK, text)
        text = _URL_IN_TEXT.sub(lambda m: _mask_url_text(m.group(0)), text)
        return _mask_pairs(text)
    except Exception:  # noqa: BLE001
        return "<message withheld: it may hold a database secret>"


def scrub_arguments(text, args=None) -> str:
    """:func:`scrub` with the URLs of a parsed command line and of ``$QCOMPILE_DB``: what the
    CLI applies to every line of an error it prints.

    Parameters
    ----------
    text : str or BaseException
        The message.
    args : argparse.Namespace, optional
        The parsed command line: every string argument holding ``://`` (``--db``, ``--from``)
        counts as a URL whose secrets the message may echo.

    Returns
    -------
    str
        The scrubbed text. Never raises.
    """
    values = vars(args).values() if args is not None and hasattr(args, "__dict__") else ()
    urls = [v for v in values if isinstance(v, str) and "://" in v]
    return scrub(text, *urls, os.environ.get(ENV_VAR))


@functools.lru_cache(maxsize=1024)  # every record of a merge carries the same origin
def redact_origin(text: str) -> str:
    """A record's ``origin`` (``"tune"``, ``"import FILE"``, ``"merge URL"``) with any secret of
    a URL in it masked.

    For provenance on its way into or out of a database (``merge`` writes it, ``db export``
    and ``db best`` show it), and for the data migration that cleans the origins already
    stored: ``merge`` before this redaction copied the source URL's secret query parameters
    into every merged record, and an old database still holds them.

    Parameters
    ----------
    text : str
        The stored origin (up to 255 characters; a URL cut off there is still masked).

    Returns
    -------
    str
        The origin with the URL after ``merge`` passed through :func:`redact` (kept as it is
        when it is already safe) and anything else through :func:`scrub`; empty stays empty.
    """
    if not text:
        return text or ""
    try:
        verb, _, rest = str(text).partition(" ")
        if verb == "merge" and "://" in rest:
            shown = redact(rest)
            return f"merge {scrub(rest) if shown == UNPARSEABLE else shown}"
        return scrub(text)
    except Exception:  # noqa: BLE001
        return "<origin withheld: it may hold a database secret>"


def is_redacted(display_url: str) -> bool:
    """Whether a :func:`redact` result hides something (so it is not the URL to pass).

    Parameters
    ----------
    display_url : str
        What :func:`redact` returned.

    Returns
    -------
    bool
        True when it holds ``***`` or is :data:`UNPARSEABLE`.
    """
    return display_url == UNPARSEABLE or MASK in display_url


def db_option(display_url: str) -> str:
    """``--db URL`` for a command a message tells the user to run, from a redacted URL.

    A URL with nothing hidden is given as it is (shell-quoted), ready to paste. One with a
    secret hidden is never given with ``***`` inside as if it were runnable: the option reads
    ``--db URL`` and says which URL to pass and that its secrets were not printed.

    Parameters
    ----------
    display_url : str
        What :func:`redact` returned for the database's URL.

    Returns
    -------
    str
        ``--db sqlite:////path/x.sqlite`` (shell-quoted where it needs it), or ``--db URL,
        where URL is
        postgresql://alice:***@host/db with the secrets shown as *** put back (they are not
        printed)``.
    """
    if not is_redacted(display_url):
        return f"--db {shlex.quote(display_url)}"
    if display_url == UNPARSEABLE:
        return "--db URL, where URL is the database URL you gave (not printed: it does not parse)"
    return (f"--db URL, where URL is {display_url} with the secrets shown as {MASK} put back "
            "(they are not printed)")


def _mask_pairs(text: str) -> str:
    """``name=value`` and ``"name": "value"`` pairs with a secret name get a masked value."""
    def mask(match: re.Match) -> str:
        value = match.group("value")
        if not value or value.lstrip("'\"").startswith(MASK) \
                or not is_secret_name(match.group("name"), in_url=False):
            return match.group(0)
        quote_char = value[0] if value[0] in "'\"" else ""
        return f"{match.group(0)[:match.start('value') - match.start()]}" \
               f"{quote_char}{MASK}{quote_char}"

    return _QUOTED_PAIR.sub(mask, _PAIR.sub(mask, text))


def _pair_secrets(text: str) -> set[str]:
    """The values of the secret ``name=value`` pairs in ``text``, unquoted."""
    found = set()
    for match in _PAIR.finditer(text):
        value = match.group("value")
        if value and is_secret_name(match.group("name"), in_url=False):
            found.update((value, value.strip("'\"")))
    return found


def _mask_url_text(text: str) -> str:
    """A URL found in free text with its userinfo password and secret parameters masked, in
    place (the rest of it as it was written; names may be percent-encoded)."""
    head = _USERINFO.match(text)
    if head:
        text = f"{head.group('head')}{MASK}@{text[head.end():]}"
    if "?" not in text:
        return text
    base, _, query = text.partition("?")
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        secret = eq and value and not value.startswith(MASK) \
            and is_secret_name(unquote_plus(name))
        parts.append(f"{name}={MASK}" if secret else part)
    return f"{base}?{'&'.join(parts)}"
