"""Latent test-time scaling as a runtime method (``--methods latent``): registration, the
white-box check, refinement of the agent's answer recorded in the trace, calls passing
through, pluggable scorers, and the self-reward's verdict repaired or dropped, never fatal.

The model is the tiny random Qwen2 of ``test_latent_tts`` behind a real ``HFBackend``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from test_latent_tts import (  # noqa: F401 (fixtures)
    self_reward,
    tiny_lm,
    transformers_backend,
    word_tokenizer,
)

from whetstone.engine.backends.hf import HFBackend
from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.base import make_config, options_from_text
from whetstone.engine.methods.latent.plugin import (
    LatentTTS,
    LatentTTSConfig,
    is_answer,
    load_scorer,
)
from whetstone.engine.methods.latent.rewards import RewardContext, RewardDropped, SelfReward
from whetstone.engine.methods.latent.tts import LatentRefiner
from whetstone.engine.methods.registry import default_registry
from whetstone.engine.runtime.prompting import CODE_OUTPUT_STOP
from whetstone.engine.runtime.state import RunConfig
from whetstone.engine.types import Completion, Message, Request, ToolCall

pytestmark = [pytest.mark.latent]  # every test here uses it

TASK = "w1 w2 w3 w4 w5"
# native: no stop strings (transformers cannot build its stop-string matcher for the word-level
# test tokenizer)
RUN = RunConfig(max_tokens_per_call=16, max_steps=3, tool_format="native")


def prefer_w7(text: str) -> float:
    """A scorer for ``latent.scorer``: how much of the answer is the word w7."""
    words = text.split()
    return words.count("w7") / len(words) if words else 0.0


@pytest.fixture
def tiny(word_tokenizer: Any) -> Callable[[], HFBackend]:  # noqa: F811 (imported fixture)
    """A fresh backend over the same tiny model (an Engine closes its backend)."""
    return lambda: HFBackend(tiny_lm(), word_tokenizer, name="tiny")


def engine_run(backend: Any, tmp_path: Path, methods: list[Any], config: RunConfig = RUN
               ) -> Any:
    from whetstone.engine.api import Engine

    with Engine(backend, library=tmp_path / "lib", skills=False, tools=(), methods=methods,
                checkpointing=False, config=config, create=True) as engine:
        return engine.run(TASK)


# --- registration and config ---------------------------------------------------------------

def test_registered_with_latentseeks_defaults() -> None:
    assert default_registry().entry("runtime", "latent").load() is LatentTTS
    cfg = LatentTTSConfig()
    assert (cfg.lr, cfg.fraction, cfg.max_steps, cfg.threshold) == (0.03, 0.1, 10, -0.2)
    typed = options_from_text(LatentTTSConfig, {"max_steps": "4", "scorer": "m:f"},
                              method="latent")
    assert typed == {"max_steps": 4, "scorer": "m:f"}
    with pytest.raises(ConfigError, match="lr must be > 0"):
        make_config(LatentTTSConfig, {"lr": 0.0}, method="latent")
    with pytest.raises(ConfigError, match="fraction"):
        make_config(LatentTTSConfig, {"fraction": 2.0}, method="latent")


def test_a_black_box_backend_is_refused_with_the_way_out(tmp_path: Path) -> None:
    from whetstone.engine.backends.scripted import ScriptedBackend

    with pytest.raises(ConfigError, match="hidden states") as err:
        engine_run(ScriptedBackend(["4"]), tmp_path, ["latent"])
    assert "@transformers" in err.value.hint
    script = tmp_path / "replies.json"
    script.write_text(json.dumps({"replies": ["4"]}))
    from whetstone.cli import cli

    for command in (["run", "2+2"], ["eval", "--tasks", "gsm8k@dev:0:1"]):
        res = CliRunner().invoke(cli, [*command, "--model", f"scripted:{script}",
                                       "--methods", "latent"])
        assert res.exit_code != 0 and "@transformers" in res.output, res.output


# --- the agent's answer, refined ------------------------------------------------------------

def test_the_agents_answer_is_refined_and_recorded(tiny: Callable[[], HFBackend],
                                                   tmp_path: Path) -> None:
    plain = engine_run(tiny(), tmp_path / "a", [])
    trace = engine_run(tiny(), tmp_path / "b", [("latent", {
        "max_steps": 2, "threshold": 1.0, "lr": 0.3, "min_verdict_mass": 0.0})])
    meta = trace.meta["latent"]
    assert meta["refined"] == 1 and meta["errors"] == 0 and len(meta["answers"]) == 1
    answer = meta["answers"][0]
    assert answer["initial_text"] == plain.answer  # refinement starts from the plain answer
    assert answer["steps"] == meta["steps"] == 2 and len(answer["rewards"]) == 3
    # one teacher-forced forward, then one per reward evaluation; a backward per update
    assert answer["forward"] == 1 + 3 and answer["backward"] == 2
    assert all(len(u["reasoning"]) >= 1 for u in answer["positions_updated"])
    assert answer["stopped"] == "max_steps" and meta["verdicts"] == {}
    think = [s for s in trace.steps if s.kind == "think"][answer["step"] - 1]
    assert think.output["completion"]["prompt_tokens"] >= answer["forward_tokens"]
    assert trace.total_tokens > plain.total_tokens  # refinement's passes are counted
    assert trace.meta["methods"][-1]["name"] == "latent"
    assert trace.meta["methods"][-1]["rewards"] == ["self"]
    if answer["replaced"]:
        assert trace.answer != plain.answer


def test_a_verdict_without_yes_or_no_is_dropped_not_fatal(tiny: Callable[[], HFBackend],
                                                          tmp_path: Path) -> None:
    """The random model's verdict holds ~2/128 of its mass on yes/no: under the default
    floor, so the verdict is dropped, counted, and the plain answer stands."""
    plain = engine_run(tiny(), tmp_path / "a", [])
    trace = engine_run(tiny(), tmp_path / "b", ["latent"])
    meta = trace.meta["latent"]
    assert trace.outcome == "answered" and trace.answer == plain.answer
    assert meta["verdicts"] == {"dropped": 1} and meta["replaced"] == 0
    assert meta["answers"][0]["stopped"] == "verdict_dropped" and meta["backward"] == 0


def test_a_scorer_named_by_path_replaces_the_self_reward(tiny: Callable[[], HFBackend],
                                                         tmp_path: Path) -> None:
    trace = engine_run(tiny(), tmp_path, [("latent", {
        "scorer": "test_latent_method:prefer_w7", "max_steps": 1, "threshold": 1.0})])
    answer = trace.meta["latent"]["answers"][0]
    assert trace.meta["methods"][-1]["rewards"] == ["test_latent_method:prefer_w7"]
    assert answer["rewards"][0] == pytest.approx(prefer_w7(answer["initial_text"]) - 1.0)
    assert answer["forward"] == 1 and answer["backward"] == 1  # scorers need no forward
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_scorer("test_latent_method:nothing_here")
    with pytest.raises(ConfigError, match="module:function"):
        load_scorer("no_colon")


def test_calls_pass_through_and_failures_keep_the_answer(tiny: Callable[[], HFBackend],
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    backend = tiny()
    plugin = LatentTTS(LatentTTSConfig(max_steps=1), rewards=[self_reward(backend.tokenizer)])
    call = ToolCall(id="c1", name="calculator", arguments='{"expression": "2*3"}')
    replies = iter([Completion(text="", tool_calls=(call,), finish_reason="tool_calls"),
                    Completion(text="```python\nprint(2*3)\n```", finish_reason="stop"),
                    Completion(text="w5 w6", finish_reason="stop")])
    wrapped = plugin.wrap("model_call", lambda request: next(replies), backend)
    request = Request(messages=(Message("user", TASK),), max_tokens=8,
                      stop=(CODE_OUTPUT_STOP,))
    first, second = wrapped(request), wrapped(request)
    assert first.tool_calls == (call,) and second.text.startswith("```python")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(LatentRefiner, "refine", broken)
    kept = wrapped(request)
    assert kept.text == "w5 w6"
    state = {"steps": [{"kind": "think", "input": {"messages": [m.to_dict() for m in
                                                                request.messages]},
                        "output": {"completion": kept.to_dict()}}]}
    meta = plugin.finish_meta(state)  # type: ignore[arg-type]
    assert meta["errors"] == 1 and meta["refined"] == 0
    assert "out of memory" in meta["answers"][0]["error"]


def test_what_counts_as_an_answer() -> None:
    ask = Request(messages=(Message("user", "q"),), stop=(CODE_OUTPUT_STOP,))
    assert is_answer(ask, Completion(text="The answer is 6."))
    assert is_answer(ask, Completion(text="6", finish_reason="length"))
    assert not is_answer(ask, Completion(text="6", finish_reason="timeout"))
    assert not is_answer(ask, Completion(
        text='<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}'
             '</tool_call>'))
    assert not is_answer(ask, Completion(text="```python\nprint(2*3)\n```"))


# --- the self-reward's verdict --------------------------------------------------------------

@pytest.fixture(scope="module")
def yes_no_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "Yes", "No", "yes", "no", "maybe", "Check"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>")


def verdict(reward: SelfReward, probs: dict[int, float]) -> tuple[Any, list[str]]:
    """The reward for next-token probabilities ``probs`` (the rest spread evenly over the
    tokens that are neither yes nor no)."""
    notes: list[str] = []
    rest = [i for i in (0, 1, 6, 7) if i not in probs]
    p = torch.zeros(8)
    p[rest] = (1 - sum(probs.values())) / len(rest)
    for i, v in probs.items():
        p[i] = v

    def forward(ids: Any, offset: int) -> Any:
        return p.log().unsqueeze(0)

    ctx = RewardContext(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long),
                        "", torch.tensor([0]), forward, notes.append)
    try:
        return reward(ctx), notes
    except RewardDropped:
        return None, notes


def test_the_verdict_pools_yes_and_no_forms_and_drops_an_empty_one(yes_no_tokenizer: Any
                                                                   ) -> None:
    reward = SelfReward(yes_no_tokenizer, differentiable=False)
    assert reward.yes_ids == [2, 4] and reward.no_ids == [3, 5]  # "YES", " Yes": unknown
    value, notes = verdict(reward, {2: 0.6, 3: 0.3})  # exact tokens: nothing to repair
    assert value == pytest.approx(torch.log(torch.tensor(0.6 / 0.9)).item()) and notes == []
    value, notes = verdict(reward, {4: 0.5, 5: 0.1, 2: 0.1})  # lower case: pooled, repaired
    assert value == pytest.approx(torch.log(torch.tensor(0.6 / 0.7)).item())
    assert notes == ["repaired"]
    value, notes = verdict(reward, {6: 0.98, 2: 0.001, 3: 0.001})  # "maybe": no verdict
    assert value is None and notes == ["dropped"]
    with pytest.raises(ConfigError, match="min_mass"):
        SelfReward(yes_no_tokenizer, min_mass=1.0)


# --- the embedded model ---------------------------------------------------------------------

@pytest.mark.slow
def test_the_method_on_the_embedded_model(transformers_backend: Any) -> None:  # noqa: F811
    """One answer of the real model, refined one step from the answer the backend gave."""
    from whetstone.engine.runtime.agent import Agent

    config = RunConfig(max_tokens_per_call=24, max_steps=2)
    task = "What is 12 + 30? Reply with the number only."
    plain = Agent(transformers_backend, tools=[], config=config).run(task)
    method = LatentTTS(LatentTTSConfig(max_steps=1, threshold=1.0))
    trace = Agent(transformers_backend, tools=[], config=config, plugins=[method]).run(task)
    meta = trace.meta["latent"]
    assert meta["refined"] == 1 and meta["steps"] == 1 and meta["backward"] == 1
    answer = meta["answers"][0]
    assert answer["initial_text"] == plain.answer and len(answer["rewards"]) == 2
    assert meta["verdicts"].get("dropped", 0) == 0  # the real model does say yes or no
