"""Building and validating turn graphs: every validation error, named and explained."""

from __future__ import annotations

import pytest

from flowllm.engine import (
    CycleError,
    DuplicateProducerError,
    MissingInputError,
    PipelineError,
    UnknownTargetError,
    build_pipeline,
)
from flowllm.engine.runners import LegacyRunner

T = "tests.engine.nodes_for_tests"
SRC = "conf/pipeline/test.yaml"


def build(nodes: dict, provided=("value",)):
    return build_pipeline(nodes, provided=provided, source=SRC)


def test_edges_follow_inputs_and_outputs() -> None:
    p = build({"add": {"_target_": f"{T}.Add", "amount": 3}, "double": {"_target_": f"{T}.Double"}})
    assert list(p.graph.edges) == [("add", "double")]
    assert [n.name for n in p.topological] == ["add", "double"]
    assert p.node("add").node.amount == 3
    assert p.node("double").ports.is_async


def test_topological_order_breaks_ties_by_yaml_order() -> None:
    nodes = {
        "double": {"_target_": f"{T}.Double"},
        "b": {"_target_": f"{T}.Add", "outputs": {"total": "right"}},
        "a": {"_target_": f"{T}.Add"},
        "join": {"_target_": f"{T}.Join", "inputs": {"left": "doubled"}},
    }
    p = build(nodes)
    # 'double' depends on 'a' (total); 'b' is independent and listed before 'a'.
    assert [n.name for n in p.topological] == ["b", "a", "double", "join"]
    assert [n.index for n in p.nodes] == [1, 2, 3, 4]


def test_renamed_ports_wire_the_graph() -> None:
    nodes = {
        "first": {"_target_": f"{T}.Add", "outputs": {"total": "left"}},
        "second": {"_target_": f"{T}.Add", "outputs": {"total": "right"}},
        "join": {"_target_": f"{T}.Join"},
    }
    p = build(nodes)
    assert set(p.graph.edges) == {("first", "join"), ("second", "join")}


def test_unknown_target_names_node_file_and_target() -> None:
    with pytest.raises(UnknownTargetError) as err:
        build({"add": {"_target_": f"{T}.Missing"}})
    message = str(err.value)
    assert SRC in message and "node 'add'" in message and f"{T}.Missing" in message


def test_unknown_module_is_reported_the_same_way() -> None:
    with pytest.raises(UnknownTargetError, match="no_such_module"):
        build({"add": {"_target_": "no_such_module.Node"}})


def test_missing_target() -> None:
    with pytest.raises(PipelineError, match="has no _target_"):
        build({"add": {"amount": 1}})


def test_missing_input_lists_what_is_available() -> None:
    with pytest.raises(MissingInputError) as err:
        build({"double": {"_target_": f"{T}.Double"}})
    message = str(err.value)
    assert "node 'double'" in message and "'total'" in message and "available: doubled, value" in message


def test_optional_input_may_be_absent() -> None:
    nodes = {
        "first": {"_target_": f"{T}.Add", "outputs": {"total": "left"}},
        "second": {"_target_": f"{T}.Add", "outputs": {"total": "right"}},
        "join": {"_target_": f"{T}.Join"},
    }
    assert build(nodes).node("join").consumes == {"left": True, "right": True, "bonus": False}


def test_duplicate_producer() -> None:
    with pytest.raises(DuplicateProducerError) as err:
        build({"a": {"_target_": f"{T}.Add"}, "b": {"_target_": f"{T}.Add"}})
    assert "node 'b'" in str(err.value) and "node 'a' already produces" in str(err.value)


def test_producing_a_turn_input_is_a_duplicate() -> None:
    with pytest.raises(DuplicateProducerError, match="the agent loop already produces"):
        build({"a": {"_target_": f"{T}.Add", "outputs": {"total": "value"}}})


def test_cycle_is_reported_with_its_path() -> None:
    nodes = {
        "a": {"_target_": f"{T}.Add", "inputs": {"value": "doubled"}},
        "b": {"_target_": f"{T}.Double"},
    }
    with pytest.raises(CycleError) as err:
        build(nodes, provided=())
    message = str(err.value)
    assert "cycle" in message
    assert "a -> b -> a" in message or "b -> a -> b" in message


def test_renaming_an_unknown_port() -> None:
    with pytest.raises(PipelineError, match="renames input 'nope'"):
        build({"a": {"_target_": f"{T}.Add", "inputs": {"nope": "value"}}})


def test_bad_constructor_argument() -> None:
    with pytest.raises(PipelineError, match="could not build") as err:
        build({"a": {"_target_": f"{T}.Add", "amuont": 1}})
    assert "node 'a'" in str(err.value)


def test_run_without_ctx_is_refused() -> None:
    with pytest.raises(PipelineError, match="'ctx' as its first parameter"):
        build({"a": {"_target_": f"{T}.NoCtx"}})


def test_legacy_refuses_a_yaml_order_that_is_not_runnable() -> None:
    p = build({"double": {"_target_": f"{T}.Double"}, "add": {"_target_": f"{T}.Add"}})
    with pytest.raises(PipelineError, match="legacy runner follows the YAML order"):
        LegacyRunner().validate(p)
