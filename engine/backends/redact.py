"""Credentials in upstream addresses and replies, and how they are kept out of sight.

An ``openai:`` spec may carry secrets in its URL (``http://user:PASSWORD@host/v1``,
``?api_key=SECRET``) and its backend holds an API key that an upstream may echo back in an
error ("invalid header: Authorization: Bearer sk-..."). Whatever is shown (``/health``, logs,
traces, error messages, a relayed upstream error) goes through ``redact_text``: the userinfo
of every URL and the value of every query parameter become ``***``, so do ``Bearer`` tokens
and any secret the caller names. ``split_address`` is the one place that finds where a
spec's URL starts (the first ``@`` before a scheme, so a password holding ``@`` stays inside
the URL).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

MASK = "***"
# A URL in free text: a scheme, then anything up to whitespace, a quote or a bracket.
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>()\[\]{}]+""")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")
_QUERY_VALUE = re.compile(r"([?&;][^=&;#]*=)[^&;#]*")
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/=-]{4,}")
_SCHEME_AT = re.compile(r"@(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_MIN_SECRET = 4  # shorter "secrets" (an empty password, "x") would mask ordinary text


def split_address(spec: str) -> tuple[str, str | None]:
    """``(head, url)`` of ``<head>@<url>`` (``openai:qwen@http://h/v1`` -> ``("openai:qwen",
    "http://h/v1")``); ``(spec, None)`` when it names no URL. The URL starts at the first
    ``@`` that a scheme follows; without a scheme, at the last ``@`` (either part may be
    empty: the caller says what is missing)."""
    found = _SCHEME_AT.search(spec)
    if found is not None:
        return spec[:found.start()], spec[found.end():]
    head, at, tail = spec.rpartition("@")
    return (head, tail) if at else (spec, None)


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets a URL carries: its userinfo's password (and user), its query values."""
    try:
        parts = urlsplit(url if "://" in url else "http://" + url)
    except ValueError:
        return ()
    found = [unquote(p) for p in (parts.password, parts.username) if p]
    for pair in re.split(r"[&;]", parts.query):
        _, eq, value = pair.partition("=")
        if eq and value:
            found.append(unquote(value))
    return tuple(found)


def redact_url(url: str) -> str:
    """``url`` without its userinfo and with every query value masked
    (``http://u:p@h/v1?key=s`` -> ``http://***@h/v1?key=***``)."""
    out = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", url)
    head, q, query = out.partition("?")
    if not q:
        return out
    return head + _QUERY_VALUE.sub(lambda m: m.group(1) + MASK, q + query)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL's credentials masked (``redact_url``), ``Bearer`` tokens
    masked, and each of ``secrets`` (an API key, a password) replaced by ``***``."""
    for secret in sorted({s for s in secrets if s and len(s) >= _MIN_SECRET}, key=len,
                         reverse=True):
        text = text.replace(secret, MASK)
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)


UPSTREAM = "<upstream>"
# An address with a port that names a machine (an IP, [IPv6], localhost, or any host after a
# scheme), with the path after it: internal addresses an upstream's message may quote.
_ADDRESS = re.compile(r"""(?:[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>()/@]*@?[^\s'"<>()/:]+:\d{1,5}"""
                      r"""|(?<![\w.:])(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]|localhost)"""
                      r""":\d{1,5})(?:/[^\s'"<>()\[\]{},;]*)?""")


def without_address(text: str, base_url: str) -> str:
    """``text`` (an upstream's own message, relayed to a client) with the upstream's address
    replaced by ``<upstream>``: its base URL (and any path after it), its host with and
    without the port, and any other address with a port (an IP, localhost, a URL), so a
    client learns the message, never where the upstream runs."""
    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        host, port = "", None
    netloc = parts.netloc.rpartition("@")[2] if host else ""
    forms = [base_url, redact_url(base_url), f"{parts.scheme}://{netloc}" if netloc else "",
             netloc, f"{host}:{port}" if port else ""]
    if host and host not in ("localhost",) and "." in host:
        forms.append(host)  # a name or an IP alone ("connect to 10.0.0.5 failed")
    for form in sorted({f for f in forms if f}, key=len, reverse=True):
        # with any scheme and userinfo before it, any port and path after it
        text = re.sub(r"(?:[A-Za-z][A-Za-z0-9+.-]*://(?:[^\s/@]*@)?)?" + re.escape(form)
                      + r"""(?::\d{1,5})?(?:/[^\s'"<>()\[\]{},;]*)?""", UPSTREAM, text)
    return _ADDRESS.sub(UPSTREAM, text)


def redact_spec(spec: str) -> str:
    """A model spec as it may be shown: its URL's credentials masked, nothing else changed
    (``openai:m@http://u:p@h/v1`` -> ``openai:m@http://***@h/v1``)."""
    head, url = split_address(spec)
    if url is None:
        return spec
    return f"{head}@{redact_text(url, url_secrets(url))}"


__all__ = ["MASK", "UPSTREAM", "redact_spec", "redact_text", "redact_url", "split_address",
           "url_secrets", "without_address"]
