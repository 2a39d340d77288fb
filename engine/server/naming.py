"""What the server shows of its upstream: a name, never an address.

``upstream_model_name`` is the name clients send as ``model`` by default: the upstream's own
model name, as LiteLLM's ``model_name`` is (``openai:qwen@http://10.0.0.5:8000/v1`` is served
as ``qwen``), so ``/v1/models`` and every 404 name a model and not the internal URL.
``public_spec`` is the spec without its URL, for ``/health``.
"""

from __future__ import annotations

from pathlib import PurePath

from ..backends.redact import split_address

_PATH_KINDS = ("hf", "llamacpp", "vllm")  # specs whose argument is a file or folder


def public_spec(spec: str) -> str:
    """``spec`` without the ``@<url>`` part (``openai:qwen@http://h:8000/v1`` ->
    ``openai:qwen``). The URL starts at the first ``@`` before a scheme
    (``redact.split_address``): a password holding ``@`` stays with the URL, never in the
    name; an ``openai:`` spec's address goes even when it has no scheme."""
    head, address = split_address(spec)
    if address is not None and ("://" in address or spec.startswith("openai:")):
        return head
    return spec


def upstream_model_name(spec: str) -> str:
    """The upstream's own model name in ``spec``: the model of an ``openai:`` spec, the file
    or folder name of a local one (``hf:/models/qwen`` -> ``qwen``), the spec itself for the
    built-in ones (``embedded``)."""
    public = public_spec(spec)
    kind, sep, arg = public.partition(":")
    if not sep or not arg:
        return public
    if kind in _PATH_KINDS or arg.startswith(("/", "./", "../", "~")):
        name = PurePath(arg.split("#", 1)[0].rstrip("/")).name.removesuffix(".gguf")
        return name or public
    return public if kind == "embedded" else arg
