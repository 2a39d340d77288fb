"""Latent test-time scaling on white-box models: refine the answer's hidden states.

    plugin.py    ``LatentTTS`` (``--methods latent``): a wrapper around the think call (``wrap`` at ``model_call``)
    tts.py       the search over latent vectors
    hooks.py     forward hooks that read and replace hidden states (torch, loaded lazily)
    rewards.py   the rewards the search climbs
"""

from ...prompts import Prompts
from ..registry import MethodSpec

# Its prompts, in prompts/ beside this file.
PROMPTS = Prompts(__name__)

METHOD = MethodSpec(name="latent", runtime="whetstone.engine.methods.latent.plugin:LatentTTS",
                    prompts=PROMPTS)
