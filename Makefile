# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install sandbox mcp-servers phoenix demo test test-fast test-real bench lint clean

install: $(STAMP) sandbox mcp-servers

# The tool sandbox runs code under bubblewrap. Best effort: installed where we are root and apt
# exists; elsewhere a note says how. Without it tools run in a weaker mode that every tool
# result reports, and the tests that need it are skipped with the reason.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap \
	      >/dev/null) || echo "bubblewrap could not be installed: tool code will run unisolated"; \
	  else \
	    echo "bubblewrap (bwrap) is missing: install it (sudo apt-get install bubblewrap)" \
	      "or tool code runs unisolated"; \
	  fi; }

# Real MCP servers from the package registries, for the MCP client's tests and the MCP stage of
# the scoreboard (pinned in tests/fixtures/mcp_servers/): mcp-server-sqlite from PyPI in a venv
# of its own (it is written for mcp 1.x; Whetstone runs mcp 2.x) and, where npm is installed,
# @modelcontextprotocol/server-filesystem from npm. Best effort: a test whose server is missing
# is skipped with the reason.
MCP_SERVERS := .cache/mcp-servers
MCP_PINS := tests/fixtures/mcp_servers
mcp-servers: $(MCP_SERVERS)/.installed

$(MCP_SERVERS)/.installed: $(MCP_PINS)/requirements.txt $(MCP_PINS)/package.json $(MCP_PINS)/package-lock.json
	@mkdir -p $(MCP_SERVERS)/npm
	@{ python3 -m venv $(MCP_SERVERS)/sqlite-venv && \
	  $(MCP_SERVERS)/sqlite-venv/bin/python -m pip install -q -r $(MCP_PINS)/requirements.txt; } \
	  || echo "mcp-server-sqlite could not be installed: its tests are skipped"
	@if command -v npm >/dev/null 2>&1; then \
	  cp $(MCP_PINS)/package.json $(MCP_PINS)/package-lock.json $(MCP_SERVERS)/npm/ && \
	  npm ci --prefix $(MCP_SERVERS)/npm --no-audit --no-fund --loglevel=error \
	  || echo "the npm MCP server could not be installed: its tests are skipped"; \
	else echo "npm is missing: the tests of npm MCP servers are skipped"; fi
	@touch $@

# torch first and pinned: it takes the CPU build from this machine's disk instead of a CUDA build.
$(STAMP): pyproject.toml requirements-nodeps.txt
	@# A venv whose ensurepip failed (seen once in CI) is rebuilt without it, pip from the index.
	$(PY) -m pip --version >/dev/null 2>&1 || python3 -m venv $(VENV) || { \
	  echo "python3 -m venv failed in ensurepip: creating $(VENV) without pip, then installing pip"; \
	  rm -rf $(VENV) && python3 -m venv --without-pip $(VENV) && \
	  python3 -m pip --python $(PY) install -q pip; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

demo: $(STAMP) sandbox
	$(VENV)/bin/whetstone run "Use the calculator: what is 17 * 23?"

# Every test: the unit tests, the integration ones (processes, servers, crashes, loads, the
# method removal copies) and the slow ones (real weights), on two pytest-xdist workers.
test: $(STAMP) sandbox mcp-servers
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

# The inner loop: no real weights (slow), no processes, servers or tree copies (integration).
test-fast: $(STAMP) sandbox mcp-servers
	$(PY) -m pytest -q -n 2 -m "not slow and not integration" $(PYTEST_ARGS)

# Against real model servers: llama.cpp's when one answers on 127.0.0.1:$$LLAMACPP_PORT (8081;
# `scripts/real_upstreams.sh llamacpp` builds, starts and tests it), vLLM's or another when
# WHETSTONE_TEST_VLLM / WHETSTONE_TEST_OPENAI names it; skipped, with the reason, otherwise.
# Also against a real Arize Phoenix (tests/test_phoenix_real.py, ~14 s), in the virtualenv
# `make phoenix` makes. `make test` and CI never install Phoenix, and skip that file.
test-real: $(STAMP) sandbox phoenix
	WHETSTONE_TEST_PHOENIX=1 $(PY) -m pytest -q -rs -m slow tests/test_real_upstreams.py \
	  tests/test_agent_vs_direct_server.py tests/test_phoenix_real.py $(PYTEST_ARGS)

# arize-phoenix (pinned, ~140 packages) in .cache/phoenix-venv, for test-real only. Best
# effort: where it cannot be installed, its tests are skipped with the reason.
phoenix:
	@scripts/phoenix.sh || echo "Phoenix could not be installed: tests/test_phoenix_real.py is skipped"

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache build *.egg-info
