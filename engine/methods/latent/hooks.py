"""Hooks on a white-box transformers model, and the measures that assign token roles.

``latent_hooks(model)`` captures the last-layer hidden states (the LM head's input) and
substitutes latents or input embeddings at chosen positions; with nothing set the model
computes exactly what it computes without hooks (tests pin this). Used by
``whetstone.engine.methods.latent.tts``; nothing here changes the backend classes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ...errors import ConfigError


class LatentHooks:
    """Hooks on a model's LM head and input embeddings (batch 1 for substitutions).

    - ``capture = True``: keep the LM head's input of each forward in ``captured``
      (the last-layer hidden states, ``(B, T, d)``, detached).
    - ``set_latents(positions, z, length)``: in forwards over ``length`` positions the LM head
      reads ``z`` at ``positions`` instead of the model's states (cached decode steps, whose
      length differs, are left alone).
    - ``set_embeddings(positions, e, length)``: likewise for the input embeddings.
    With nothing set the hooks return ``None``: the model computes exactly what it would
    without them. ``remove()`` detaches them.
    """

    def __init__(self, model: Any) -> None:
        head, emb = model.get_output_embeddings(), model.get_input_embeddings()
        if head is None or emb is None:
            raise ConfigError(f"{type(model).__name__} exposes no LM head or input embeddings",
                              hint="latent refinement needs a transformers causal LM or VLM")
        self.capture = False
        self.captured: Any = None
        self._latents: tuple[Any, Any, int] | None = None
        self._embeds: tuple[Any, Any, int] | None = None
        self._handles = [head.register_forward_pre_hook(self._on_head),
                         emb.register_forward_hook(self._on_embed)]

    def set_latents(self, positions: Any, latents: Any, length: int) -> None:
        """``positions`` (k,) absolute; ``latents`` (B, k, d); None clears."""
        self._latents = None if positions is None else (positions, latents, length)

    def set_embeddings(self, positions: Any, embeds: Any, length: int = 0) -> None:
        """``positions`` (k,) absolute; ``embeds`` (B, k, d); None clears."""
        self._embeds = None if positions is None else (positions, embeds, length)

    def _on_head(self, module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        h = args[0]  # (B, T, d): the last layer's states, after the final norm
        if self.capture:
            self.captured = h.detach()
        if self._latents is None or h.shape[1] != self._latents[2]:
            return None
        pos, z, _ = self._latents
        h = h.clone()
        h[:, pos, :] = z.to(h.dtype)  # (B, k, d) replaces the model's states at pos
        return (h, *args[1:])

    def _on_embed(self, module: Any, args: tuple[Any, ...], out: Any) -> Any:
        if self._embeds is None or out.shape[1] != self._embeds[2]:
            return None
        pos, e, _ = self._embeds
        out = out.clone()
        out[:, pos, :] = e.to(out.dtype)  # (B, k, d)
        return out

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@contextmanager
def latent_hooks(model: Any) -> Iterator[LatentHooks]:
    """``with latent_hooks(model) as hooks:`` -- the hooks exist only inside the block."""
    hooks = LatentHooks(model)
    try:
        yield hooks
    finally:
        hooks.remove()


@contextmanager
def frozen(model: Any) -> Iterator[None]:
    """Weights need no gradient here; restore each flag afterwards."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@contextmanager
def eager_attention(model: Any, needed: bool) -> Iterator[None]:
    """SDPA kernels return no attention weights; switch to eager for one forward if needed."""
    before = getattr(model.config, "_attn_implementation", None)
    if not needed or before == "eager":
        yield
        return
    if not hasattr(model, "set_attn_implementation"):
        raise ConfigError(f"{type(model).__name__} cannot switch to eager attention, so image "
                          "attention cannot be measured",
                          hint="load the model with attn_implementation='eager'")
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


# --- token roles -------------------------------------------------------------------------------

def next_token_entropy(logits: Any) -> Any:
    """Entropy (nats) of each next-token distribution: ``(..., V) -> (...)``."""
    import torch  # heavy: torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def image_attention_mass(attentions: Sequence[Any], image_mask: Any, rows: Any) -> Any:
    """Share of attention each query row puts on image keys, mean over layers and heads.

    ``attentions``: per layer ``(1, H, T, T)``; ``image_mask``: ``(T,)`` bool; ``rows``: ``(k,)``
    absolute query positions. Returns ``(k,)``.
    """
    import torch  # heavy: torch

    per_layer = [a[0][:, rows][:, :, image_mask].sum(-1) for a in attentions]  # each (H, k)
    return torch.stack(per_layer).float().mean(dim=(0, 1))  # (k,)


def top_positions(scores: Any, m: int) -> Any:
    """Indices of the ``m`` largest scores, ascending (ties: the earlier position)."""
    import torch  # heavy: torch

    order = torch.argsort(scores, descending=True, stable=True)
    return order[:min(m, scores.numel())].sort().values
