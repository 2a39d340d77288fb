"""Latent test-time scaling: hooks-off parity, where the gradient goes, the anchor, token roles.

Fast tests use a tiny random Qwen2 with an in-memory word-level tokenizer. The tiny random VLM
(LLaVA: CLIP tower + Qwen2 text, ~5 M parameters) takes its tokenizer from the embedded model's
cached transformers folder, so those tests are ``slow`` (the first run builds that folder), as
are the tests on the embedded model itself.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from conftest import SHARED_CACHE
from vlm_support import IMAGE_TOKENS, tiny_llava

from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.latent.hooks import (
    frozen,
    image_attention_mass,
    latent_hooks,
    next_token_entropy,
    top_positions,
)
from whetstone.engine.methods.latent.tts import (
    LatentConfig,
    LatentRefiner,
    RefineRecord,
    ScorerReward,
    SelfReward,
)
from whetstone.engine.types import Message, Request

pytestmark = [pytest.mark.latent]  # every test here uses it

WORDS = ["<unk>", "<eos>", "<|im_start|>", "<|im_end|>", "user", "assistant", "Yes", "No"] + [
    f"w{i}" for i in range(120)]
TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
            "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
ASK = Request(messages=[Message("user", "w1 w2 w3 w4 w5")], max_tokens=24)


# --- tiny models -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def word_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>",
                                  pad_token="<eos>")
    tok.chat_template = TEMPLATE
    return tok


def tiny_lm(seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, eos_token_id=1, pad_token_id=1,
                      bos_token_id=None)
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = 1
    return model


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from whetstone.engine.backends.model_cache import dequantized_packaged

    return AutoTokenizer.from_pretrained(str(dequantized_packaged("qwen-0.5b", SHARED_CACHE)),
                                         local_files_only=True)


@pytest.fixture(scope="module")
def transformers_backend() -> Any:
    """The embedded model on the transformers engine (the white-box path; the session's
    ``embedded_backend`` is the ONNX one)."""
    from whetstone.engine.backends import BackendOptions, get_backend

    backend = get_backend("embedded@transformers", BackendOptions(cache_dir=SHARED_CACHE))
    yield backend
    backend.close()


def tiny_vlm(tokenizer: Any, seed: int = 0) -> Any:
    """The shared tiny LLaVA (``vlm_support``), Qwen's ``<|image_pad|>`` as its image token."""
    return tiny_llava(tokenizer, seed=seed)


def vlm_prompt(tokenizer: Any) -> tuple[Any, dict[str, Any]]:
    """A chat prompt holding one image (16 image tokens) and a question, with pixel values."""
    image = "<|vision_start|>" + "<|image_pad|>" * IMAGE_TOKENS + "<|vision_end|>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": image + "What shape is in the picture?"}],
        add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    torch.manual_seed(1)
    return ids, {"pixel_values": torch.randn(1, 3, 32, 32)}


def self_reward(tokenizer: Any, **kw: Any) -> SelfReward:
    """The self-reward for random models: their verdicts put almost no mass on yes or no,
    which the default ``min_mass`` would drop."""
    return SelfReward(tokenizer, min_mass=0.0, **kw)


def greedy(model: Any, ids: Any, n: int, **extra: Any) -> Any:
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=n, do_sample=False, **extra)


def assert_hooks_off_parity(model: Any, ids: Any, n_new: int, **extra: Any) -> None:
    """Logits and greedy tokens: plain model == hooks installed but unset == after removal."""
    with torch.no_grad():
        plain = model(input_ids=ids, **extra).logits
    plain_tokens = greedy(model, ids, n_new, **extra)
    with latent_hooks(model) as hooks:
        with torch.no_grad():
            hooked = model(input_ids=ids, **extra).logits
        hooked_tokens = greedy(model, ids, n_new, **extra)
        assert hooks._handles
    with torch.no_grad():
        after = model(input_ids=ids, **extra).logits
    assert torch.equal(plain, hooked) and torch.equal(plain, after)
    assert torch.equal(plain_tokens, hooked_tokens)
    assert torch.equal(plain_tokens, greedy(model, ids, n_new, **extra))
    assert not model.get_output_embeddings()._forward_pre_hooks
    assert not model.get_input_embeddings()._forward_hooks


def first_gradient(refiner: LatentRefiner, ids: Any, max_new: int = 24, **extra: Any
                   ) -> tuple[Any, Any, dict[str, Any], RefineRecord]:
    """One reward evaluation and backward, as the search's first step does: (z, z0, sel, rec)."""
    rec = RefineRecord()
    with frozen(refiner.model), latent_hooks(refiner.model) as hooks:
        answer = refiner._generate(ids, max_new, extra)
        body = refiner._body(answer)
        w = min(len(body[0]), 8)
        z0, mass = refiner._states(hooks, ids, body, w, extra, None, rec)
        z = torch.nn.Parameter(z0.clone())
        sel = refiner.select(z, 2, mass)
        _, loss = refiner._evaluate(hooks, z, sel, ids, body, extra, rec)
        (loss + refiner.anchor_loss(z, z0, sel)).backward()
    return z, z0, sel, rec


def chat_ids(tokenizer: Any, request: Request = ASK) -> Any:
    msgs = [{"role": m.role, "content": m.content} for m in request.messages]
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                         return_dict=True, return_tensors="pt")["input_ids"]


# --- hooks ----------------------------------------------------------------------------------

def test_hooks_off_is_bit_identical_on_a_tiny_lm(word_tokenizer: Any) -> None:
    model = tiny_lm()
    assert_hooks_off_parity(model, chat_ids(word_tokenizer), 12)


def test_latents_replace_the_lm_head_input_only_where_set(word_tokenizer: Any) -> None:
    model = tiny_lm()
    ids = chat_ids(word_tokenizer)  # (1, T)
    with torch.no_grad():
        plain = model(input_ids=ids).logits  # (1, T, V)
    pos = torch.tensor([2, 5])
    z = torch.randn(1, 2, 32)
    with latent_hooks(model) as hooks, torch.no_grad():
        hooks.set_latents(pos, z, ids.shape[1])
        swapped = model(input_ids=ids).logits
        hooks.set_latents(pos, z, ids.shape[1] + 1)  # a forward of another length: untouched
        other = model(input_ids=ids).logits
    assert torch.allclose(swapped[:, pos], model.lm_head(z), atol=1e-6)
    keep = [i for i in range(ids.shape[1]) if i not in (2, 5)]
    assert torch.equal(swapped[:, keep], plain[:, keep]) and torch.equal(other, plain)


def test_straight_through_embeddings_keep_the_forward_value(word_tokenizer: Any) -> None:
    """The differentiable reward's forward reads exactly the plain token embeddings (a hook
    registered after ours sees them); only the gradient path differs."""
    model = tiny_lm()
    refiner = LatentRefiner(model, word_tokenizer)
    ids = chat_ids(word_tokenizer)
    rec = RefineRecord()
    seen: list[Any] = []
    with latent_hooks(model) as hooks:
        body = refiner._body(refiner._generate(ids, 12, {}))
        z0, _ = refiner._states(hooks, ids, body, 6, {}, None, rec)
        z = torch.nn.Parameter(z0.clone())
        full = torch.cat([ids, body], dim=1)
        spy = model.get_input_embeddings().register_forward_hook(
            lambda mod, args, out: seen.append(out))
        soft = refiner._soft_forward(hooks, z, torch.tensor([1, 3]), body, {}, True, rec,
                                     full, ids.shape[1])
        spy.remove()
    with torch.no_grad():
        plain_embeds = model.get_input_embeddings()(full)
        plain = model(input_ids=full, logits_to_keep=1).logits[:, -1]
    assert torch.equal(seen[0].detach(), plain_embeds) and seen[0].requires_grad
    assert torch.allclose(soft.detach(), plain, atol=1e-5) and soft.requires_grad


# --- gradient routing and the anchor -------------------------------------------------------

@pytest.mark.parametrize("reward", ["self", "scorer"])
def test_gradient_reaches_only_the_selected_positions(word_tokenizer: Any, reward: str) -> None:
    model = tiny_lm()
    term = (self_reward(word_tokenizer) if reward == "self"
            else ScorerReward(lambda text: 0.25))
    refiner = LatentRefiner(model, word_tokenizer, rewards=[term])
    z, _, sel, _ = first_gradient(refiner, chat_ids(word_tokenizer))
    chosen = sel["reasoning"].tolist()
    others = [i for i in range(z.shape[1]) if i not in chosen]
    assert len(chosen) == 2 and others
    assert torch.all(z.grad[:, others] == 0)
    assert all(z.grad[0, i].abs().sum() > 0 for i in chosen)
    assert all(p.grad is None and p.requires_grad for p in model.parameters())


def test_anchor_pulls_unselected_positions_back(word_tokenizer: Any) -> None:
    refiner = LatentRefiner(tiny_lm(), word_tokenizer, LatentConfig(anchor=1.0))
    torch.manual_seed(0)
    z0 = torch.randn(1, 6, 32)
    z = torch.nn.Parameter(z0 + 0.5 * torch.randn(1, 6, 32))
    sel = {"reasoning": torch.tensor([1, 4])}
    free = [0, 2, 3, 5]
    opt = torch.optim.Adam([z], lr=0.03)
    dist = [float((z.detach() - z0)[:, free].norm())]
    sel_start = z[:, [1, 4]].detach().clone()
    for _ in range(5):
        opt.zero_grad()
        refiner.anchor_loss(z, z0, sel).backward()
        assert torch.all(z.grad[:, [1, 4]] == 0)  # the anchor leaves selected positions alone
        opt.step()
        dist.append(float((z.detach() - z0)[:, free].norm()))
    assert all(b < a for a, b in itertools.pairwise(dist))
    assert torch.equal(z[:, [1, 4]].detach(), sel_start)


def test_anchor_in_the_step_moves_a_dropped_position_back(word_tokenizer: Any) -> None:
    """In a real step (reward + anchor), a position displaced earlier but no longer selected
    gets only the anchor's gradient, pointing back to its start."""
    model = tiny_lm()
    refiner = LatentRefiner(model, word_tokenizer, rewards=[self_reward(word_tokenizer)])
    ids = chat_ids(word_tokenizer)
    rec = RefineRecord()
    with latent_hooks(model) as hooks:
        body = refiner._body(refiner._generate(ids, 24, {}))
        z0, _ = refiner._states(hooks, ids, body, 8, {}, None, rec)
        z = torch.nn.Parameter(z0.clone())
        sel = refiner.select(z, 2, None)
        free = next(i for i in range(8) if i not in sel["reasoning"].tolist())
        with torch.no_grad():
            z[:, free] += 0.3  # as if an earlier step had moved it
        _, loss = refiner._evaluate(hooks, z, sel, ids, body, {}, rec)
        (loss + refiner.anchor_loss(z, z0, sel)).backward()
    assert torch.allclose(z.grad[0, free], torch.full((32,), 0.3), atol=1e-5)


# --- token roles ---------------------------------------------------------------------------

def test_role_measures_on_constructed_inputs() -> None:
    # entropy: a zero latent gives a uniform distribution, the largest entropy there is
    head = torch.nn.Linear(8, 50, bias=False)
    torch.manual_seed(0)
    z = 5 * torch.randn(1, 6, 8)
    z[:, [1, 4]] = 0
    ent = next_token_entropy(head(z))[0]
    assert torch.allclose(ent[[1, 4]], torch.full((2,), math.log(50)), atol=1e-5)
    assert top_positions(ent, 2).tolist() == [1, 4]
    # attention: rows 5 and 7 look at the image keys (1..3) only
    t = 8
    att = torch.full((1, 2, t, t), 1.0 / t)
    att[0, :, 5] = torch.tensor([0, 0.3, 0.3, 0.4, 0, 0, 0, 0])
    att[0, :, 7] = torch.tensor([0, 0.5, 0.5, 0, 0, 0, 0, 0])
    mask = torch.zeros(t, dtype=torch.bool)
    mask[1:4] = True
    mass = image_attention_mass([att, att], mask, torch.tensor([4, 5, 6, 7]))
    assert torch.allclose(mass, torch.tensor([3 / t, 1.0, 3 / t, 1.0]))
    assert top_positions(mass, 2).tolist() == [1, 3]  # window rows 5 and 7
    assert top_positions(torch.tensor([1.0, 2.0, 2.0, 0.0]), 1).tolist() == [1]  # ties: earlier


@pytest.mark.slow
def test_hooks_off_is_bit_identical_on_a_tiny_vlm(qwen_tokenizer: Any) -> None:
    model = tiny_vlm(qwen_tokenizer)
    ids, extra = vlm_prompt(qwen_tokenizer)
    assert_hooks_off_parity(model, ids, 10, **extra)


@pytest.mark.slow
def test_role_routing_on_a_tiny_vlm(qwen_tokenizer: Any) -> None:
    """Visual feedback goes to the image-sensitive window positions, reasoning feedback to the
    high-entropy ones. The VLM's attention is made uniform (q and k projections zeroed), so a
    state at absolute row q puts exactly 16/(q+1) of its attention on the 16 image tokens."""
    model = tiny_vlm(qwen_tokenizer)
    with torch.no_grad():  # sharper next-token distributions: entropies far apart
        model.get_output_embeddings().weight.mul_(30)
    for layer in model.model.language_model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            torch.nn.init.zeros_(proj.weight)
            torch.nn.init.zeros_(proj.bias)
    ids, extra = vlm_prompt(qwen_tokenizer)
    rewards = [self_reward(qwen_tokenizer), self_reward(qwen_tokenizer, role="visual",
                                                        prompt="verify_visual")]
    cfg = LatentConfig(fraction=0.1, prefix=0.5, max_steps=1, threshold=1.0)
    refiner = LatentRefiner(model, qwen_tokenizer, cfg, rewards)
    _, rec = refiner.refine_ids(ids, max_new_tokens=40, model_inputs=extra)
    n, p = rec.answer_tokens, ids.shape[1]
    assert n >= 20, "the random VLM should write at least 20 tokens before EOS"
    m = math.ceil(0.1 * n)
    rows = torch.arange(p - 1, p - 1 + rec.window)  # the states that chose window tokens
    assert torch.allclose(torch.tensor(rec.image_mass), IMAGE_TOKENS / (rows + 1.0), atol=1e-5)
    assert rec.updated[0]["visual"] == list(range(m))  # the rows that see the image most
    # reasoning: the top-m entropies of the plain model's own next-token distributions
    plain = greedy(model, ids, 40, **extra)  # (1, P + n + 1): the same greedy answer
    assert rec.initial_text == qwen_tokenizer.decode(plain[0, p:p + n], skip_special_tokens=True)
    with torch.no_grad():
        logits = model(input_ids=plain, **extra).logits[0, rows]  # (W, V)
    entropy = next_token_entropy(logits)  # (W,)
    chosen = rec.updated[0]["reasoning"]
    others = [i for i in range(rec.window) if i not in chosen]
    assert len(chosen) == m and float(entropy[chosen].min()) >= float(entropy[others].max()) - 1e-4
    assert chosen != rec.updated[0]["visual"]  # the two roles route to different tokens here
    assert rec.forward == 1 + 2 * len(rec.rewards) and rec.backward == 1


@pytest.mark.slow
def test_visual_feedback_without_an_image_is_refused(qwen_tokenizer: Any) -> None:
    model = tiny_vlm(qwen_tokenizer)
    ids = qwen_tokenizer("Hello there", return_tensors="pt")["input_ids"]
    refiner = LatentRefiner(model, qwen_tokenizer,
                            rewards=[self_reward(qwen_tokenizer, role="visual")])
    with pytest.raises(ConfigError, match="visual feedback needs an image"):
        refiner.refine_ids(ids, max_new_tokens=8)


# --- the search ----------------------------------------------------------------------------

def test_refine_stops_at_the_threshold_without_updates(word_tokenizer: Any) -> None:
    model = tiny_lm()
    refiner = LatentRefiner(model, word_tokenizer, rewards=[ScorerReward(lambda t: 1.0)])
    result = refiner.refine(ASK)
    rec = result.record
    assert rec.stopped == "threshold" and rec.rewards == [0.0] and rec.steps == 0
    assert rec.backward == 0 and rec.redecodes == 0 and rec.forward == 1
    assert result.completion.text == rec.initial_text == rec.final_text


def test_refine_keeps_the_best_answer_and_counts_its_cost(word_tokenizer: Any) -> None:
    """A scorer that likes any answer other than the plain one: once a window token flips
    and the answer changes, the reward reaches 0 and the search stops there."""
    model = tiny_lm()
    plain = LatentRefiner(model, word_tokenizer, LatentConfig(max_steps=0)).refine(ASK)
    first = plain.record.initial_text
    refiner = LatentRefiner(model, word_tokenizer, LatentConfig(lr=0.3, max_steps=10),
                            rewards=[ScorerReward(lambda t: float(t != first))])
    result = refiner.refine(ASK)
    rec = result.record
    assert rec.initial_text == first and rec.rewards[0] == -1.0
    assert rec.stopped == "threshold" and rec.rewards[-1] == 0.0
    assert rec.best_step == len(rec.rewards) - 1 and result.completion.text != first
    assert result.completion.text == rec.final_text
    assert rec.backward == rec.steps == len(rec.rewards) - 1
    assert rec.redecodes == sum(1 for c in rec.changed if c) >= 1
    assert rec.forward == 1 and all(len(u["reasoning"]) == 3 for u in rec.updated)
    assert rec.to_dict()["steps"] == rec.steps


def test_self_reward_refinement_runs_and_never_returns_a_worse_answer(word_tokenizer: Any
                                                                       ) -> None:
    model = tiny_lm()
    seen: list[int] = []
    refiner = LatentRefiner(model, word_tokenizer, LatentConfig(lr=0.3, max_steps=3),
                            [self_reward(word_tokenizer)],
                            on_step=lambda r: seen.append(len(r.rewards)))
    rec = refiner.refine(ASK).record
    assert seen == [1, 2, 3, 4]  # on_step after each reward evaluation
    assert len(rec.rewards) == 4 and all(r <= 0 for r in rec.rewards)
    assert len(rec.step_seconds) == len(rec.redecode_seconds) == 3
    assert rec.rewards[rec.best_step] == max(rec.rewards)
    assert rec.forward == 1 + len(rec.rewards) and rec.backward == 3


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"lr": 0}, {"fraction": 1.5}, {"prefix": 0}, {"max_steps": -1},
                                {"anchor": -1.0}, {"max_prefix": 0}])
def test_bad_config_is_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="latent config"):
        LatentConfig(**kw)


def test_bad_requests_and_rewards_are_refused(word_tokenizer: Any) -> None:
    model = tiny_lm()
    refiner = LatentRefiner(model, word_tokenizer)
    with pytest.raises(ConfigError, match="max_tokens"):
        refiner.refine(ASK.with_(max_tokens=0))
    with pytest.raises(ConfigError, match="unknown feedback role"):
        ScorerReward(lambda t: 1.0, role="audio")
    with pytest.raises(ConfigError, match="at least one reward"):
        LatentRefiner(model, word_tokenizer, rewards=[])
    with pytest.raises(ConfigError, match="weight"):
        LatentRefiner(model, word_tokenizer, rewards=[ScorerReward(lambda t: 1.0, weight=0)])
    bad = LatentRefiner(model, word_tokenizer, rewards=[ScorerReward(lambda t: 2.0)])
    with pytest.raises(ConfigError, match=r"returned 2\.0"):
        bad.refine(ASK)


def test_a_black_box_backend_is_refused() -> None:
    from whetstone.engine.backends.scripted import ScriptedBackend

    with pytest.raises(ConfigError, match="no access to hidden states"):
        LatentRefiner.from_backend(ScriptedBackend(["x"]))


# --- the embedded model -----------------------------------------------------------------------

@pytest.mark.slow
def test_hooks_off_is_bit_identical_on_the_embedded_model(transformers_backend: Any) -> None:
    tok, model = transformers_backend.tokenizer, transformers_backend.model
    ids = chat_ids(tok, Request(messages=[Message("user", "What is 12 + 30?")]))
    assert_hooks_off_parity(model, ids, 12)


@pytest.mark.slow
def test_refine_on_the_embedded_model(transformers_backend: Any) -> None:
    request = Request(messages=[Message("user", "What is 17 * 23? Answer briefly.")],
                      max_tokens=24)
    refiner = LatentRefiner.from_backend(transformers_backend,
                                         LatentConfig(max_steps=1, threshold=1.0))
    result = refiner.refine(request)
    rec = result.record
    assert rec.initial_text.strip() == transformers_backend.complete(request).text
    assert len(rec.rewards) == 2 and rec.backward == 1 and rec.forward == 3
    assert rec.window >= 1 and rec.updated[0]["reasoning"]
    assert result.completion.model == transformers_backend.spec


# --- GPU --------------------------------------------------------------------------------------

def _cuda() -> bool:
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (bf16 path)")
def test_bf16_on_cuda(qwen_tokenizer: Any) -> None:
    model = tiny_vlm(qwen_tokenizer).to("cuda", torch.bfloat16)
    ids, extra = vlm_prompt(qwen_tokenizer)
    extra = {"pixel_values": extra["pixel_values"].to("cuda", torch.bfloat16)}
    assert_hooks_off_parity(model, ids.to("cuda"), 8, **extra)
    rewards = [self_reward(qwen_tokenizer), self_reward(qwen_tokenizer, role="visual",
                                                        prompt="verify_visual")]
    refiner = LatentRefiner(model, qwen_tokenizer, LatentConfig(max_steps=2, threshold=1.0),
                            rewards)
    answer, rec = refiner.refine_ids(ids, max_new_tokens=24, model_inputs=extra)
    assert answer.device.type == "cuda" and rec.backward == 2
    assert all(math.isfinite(r) for r in rec.rewards) and len(rec.image_mass) == rec.window

