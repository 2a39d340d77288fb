"""A team's own Python functions and LangChain tools as agent tools (`whetstone.tools.functions`,
`whetstone.tools.toolset`): the schema of a typed, documented function is the one a learned tool
with the same signature gets, a function without annotations or docstring is refused with what
to add, and `Engine(tools=[fn])` and `whetstone run --tools file.py:fn` run them, the trace
recording each call like any other."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError
from whetstone.tools.base import Toolbox
from whetstone.tools.functions import function_spec, function_tool, import_function
from whetstone.tools.learned import define_tool
from whetstone.tools.toolset import ToolSet

SOURCES = [
    '''
def order_total(prices: list[float], discount: float = 0.0, currency: str = "EUR") -> float:
    """Add up an order's prices, less a discount.

    Args:
        prices: the line prices.
        discount: the share taken off (0 to 1).
        currency: the currency code.
    """
    return round(sum(prices) * (1 - discount), 2)
''',
    '''
def lookup(order_id: int, fields: dict[str, bool], mode: Literal["short", "full"] = "short",
           note: str | None = None) -> dict[str, int]:
    """Look up an order.

    Args:
        order_id: the order number the customer gave.
        fields: which fields to return.
        mode: how much to say.
    """
    return {"order": order_id}
''',
    '''
def answer_for(question: Annotated[str, "task"], *, scale: int = 2) -> Annotated[str, "answer"]:
    """Answer the task from the shop's records."""
    return question
''',
]


def _compiled(source: str):
    from typing import Annotated, Literal

    scope = {"Annotated": Annotated, "Literal": Literal, "__name__": "team_tools"}
    exec(compile(textwrap.dedent(source), "<test>", "exec"), scope)  # noqa: S102
    return next(v for k, v in scope.items() if callable(v) and k not in ("Annotated", "Literal"))


@pytest.mark.parametrize("source", SOURCES)
def test_a_typed_function_gets_the_schema_a_learned_tool_with_its_signature_gets(
        source: str) -> None:
    fn = _compiled(source)
    definition, problems = define_tool(textwrap.dedent(source), name=fn.__name__, skill="s")
    assert definition is not None, problems
    spec = function_spec(fn)
    assert spec.parameters == definition.spec.parameters
    assert spec.description == definition.spec.description
    assert spec.inject == definition.spec.inject
    assert spec.returns_answer == definition.spec.returns_answer
    assert spec.source == f"python:team_tools:{fn.__name__}"


def test_the_schema_reads_the_docstring_and_defaults() -> None:
    spec = function_spec(_compiled(SOURCES[0]))
    assert spec.description == "Add up an order's prices, less a discount."
    assert spec.parameters == {"type": "object", "required": ["prices"], "properties": {
        "prices": {"type": "array", "items": {"type": "number"},
                   "description": "the line prices."},
        "discount": {"type": "number", "default": 0.0,
                     "description": "the share taken off (0 to 1)."},
        "currency": {"type": "string", "default": "EUR", "description": "the currency code."}}}


def untyped(order_id, verbose=False):
    """Look up an order."""
    return order_id


def no_return(order_id: int):
    """Look up an order."""
    return order_id


def undocumented(order_id: int) -> str:
    return str(order_id)


def star(*ids: int) -> str:
    """Many ids."""
    return ""


class Shop:
    pass


def takes_an_object(shop: Shop) -> str:
    """A shop."""
    return ""


@pytest.mark.parametrize("fn, says", [
    (untyped, ("add a type annotation to parameter 'order_id', parameter 'verbose', the "
               "return value (-> str)")),
    (no_return, "add a type annotation to the return value (-> str)"),
    (undocumented, "add a docstring whose first line says what it does"),
    (star, "take named parameters only"),
    (takes_an_object, "parameter 'shop': 'Shop' is not a JSON type"),
    (lambda x: x, "'<lambda>' is not a tool name"),
])
def test_a_function_the_model_could_not_fill_is_refused_with_what_to_add(fn, says: str
                                                                         ) -> None:
    with pytest.raises(ConfigError) as err:
        function_spec(fn)
    assert says in err.value.message
    assert "def lookup(order_id: int" in (err.value.hint or "")  # an example to copy
    with pytest.raises(ConfigError):
        Engine(ScriptedBackend(), tools=[fn])  # refused before any run


def test_calls_are_checked_coerced_and_failures_are_observations() -> None:
    def stock(item: str, warehouse: int = 1) -> dict[str, int]:
        """Units in stock.

        Args:
            item: the product name.
            warehouse: which warehouse.
        """
        if item == "sofa":
            raise LookupError("no such item: sofa")
        return {item: 7 * warehouse}

    async def ping(host: str) -> str:
        """Ping a host."""
        return f"pong from {host}"

    box = Toolbox.of([function_tool(stock), function_tool(ping)])
    assert box.call("stock", {"item": "lamp", "warehouse": "2"}).output == '{"lamp": 14}'
    assert box.call("stock", "lamp").output == '{"lamp": 7}'  # a plain call fills `item`
    failed = box.call("stock", {"item": "sofa"})
    assert failed.error == "LookupError: no such item: sofa"
    bad = box.call("stock", {"item": "lamp", "colour": "red"})
    assert bad.error and "unknown argument(s) colour" in bad.error
    assert box.call("ping", {"host": "db1"}).output == "pong from db1"  # async works too


def test_langchain_tools_keep_their_name_schema_and_return_direct() -> None:
    from langchain_core.tools import tool

    @tool
    def shipping_days(country: str, express: bool = False) -> int:
        """Days an order takes to arrive in a country."""
        return 2 if express else 5

    @tool(return_direct=True)
    def final_price(sku: str) -> str:
        """The final price of a product."""
        return f"{sku}: 9.99"

    tools = ToolSet([shipping_days, final_price]).tools()
    days, price = tools
    assert days.spec.source == "langchain:StructuredTool"
    assert days.spec.parameters["properties"]["express"]["type"] == "boolean"
    assert days.spec.parameters["required"] == ["country"]
    assert price.spec.returns_answer and not days.spec.returns_answer
    box = Toolbox.of(tools)
    assert box.call("shipping_days", {"country": "FR", "express": True}).output == "2"
    assert box.call("final_price", {"sku": "A1"}).output == "A1: 9.99"


def test_functions_by_import_path(tmp_path: Path) -> None:
    path = tmp_path / "shop_tools.py"
    path.write_text(textwrap.dedent(SOURCES[0]))
    assert import_function(f"{path}:order_total")([1.0, 2.0]) == 3.0
    assert import_function("json:dumps") is json.dumps
    for ref, says in [(f"{path}:missing", "has no function 'missing'"),
                      (f"{tmp_path}/nope.py:f", "does not exist"),
                      ("no_such_module_x:f", "cannot import tool module 'no_such_module_x'"),
                      ("order_total", "unknown tool 'order_total'")]:
        with pytest.raises(ConfigError, match=says):
            ToolSet([ref])


def test_two_tools_of_one_name_are_refused() -> None:
    def calculator(expression: str) -> str:
        """My own calculator."""
        return expression

    with pytest.raises(ConfigError, match=r"two tools are named 'calculator' \(builtin:"
                                          r"calculator and python:"):
        ToolSet(["calculator", calculator]).tools()


def test_an_engine_runs_a_function_tool_and_the_trace_records_the_call(tmp_path: Path) -> None:
    calls: list[str] = []

    def order_status(order_id: int) -> str:
        """The status of an order in the shop's system.

        Args:
            order_id: the order number.
        """
        calls.append(str(order_id))
        return "shipped on 3 March"

    call = '{"name": "order_status", "arguments": {"order_id": "8812"}}'
    model = ScriptedBackend([f"<tool_call>{call}</tool_call>", "It shipped on 3 March."],
                            tool_calls=True)
    engine = Engine(model, library=tmp_path / "lib", create=True, checkpointing=False,
                    tools=["calculator", order_status])
    trace = engine.run("Where is order 8812?")
    assert calls == ["8812"]
    act = next(s for s in trace.steps if s.kind == "act")
    assert act.input == {"tool": "order_status", "arguments": {"order_id": "8812"}}
    assert act.output["observation"] == "shipped on 3 March"
    assert trace.answer == "It shipped on 3 March."
    assert "order_status(order_id): The status of an order" in model.requests[0].messages[0].text
    stored = engine.traces.get(trace.id)
    assert any(s.input.get("tool") == "order_status" for s in stored.steps if s.kind == "act")


def test_run_takes_a_function_from_a_file(tmp_path: Path, whetstone_home: Path) -> None:
    tools = tmp_path / "team_tools.py"
    tools.write_text(textwrap.dedent('''
        def order_status(order_id: int) -> str:
            """The status of an order.

            Args:
                order_id: the order number.
            """
            return f"order {order_id}: shipped"
        '''))
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"replies": [
        'Action: order_status[{"order_id": 7}]', "Final Answer: shipped"]}))
    res = CliRunner().invoke(cli, ["run", "Where is order 7?", "--model", f"scripted:{replies}",
                                   "--tools", f"calculator,{tools}:order_status", "--json"])
    assert res.exit_code == 0, res.output
    trace = json.loads(res.stdout)
    act = next(s for s in trace["steps"] if s["kind"] == "act")
    assert act["output"]["observation"] == "order 7: shipped"
    untyped_file = tmp_path / "loose.py"
    untyped_file.write_text("def f(x):\n    return x\n")
    res = CliRunner().invoke(cli, ["run", "x", "--model", f"scripted:{replies}",
                                   "--tools", f"{untyped_file}:f"])
    assert res.exit_code == 2
    assert "add a type annotation to parameter 'x'" in res.output
