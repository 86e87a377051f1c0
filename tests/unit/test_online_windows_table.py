"""``FeatureStore.online(..., windows="request_time")`` puts each aggregation where the
caller named it among the features (``features.sdk.hot.with_windows``), as the
table built anew did: in place with ``add_column``, and by name where the columns
repeat or the entity column is named otherwise."""

from __future__ import annotations

import pyarrow as pa

from features.sdk.hot import with_windows


def _read(names: list[str]) -> pa.Table:
    cols = {n: pa.array([f"{n}-0", f"{n}-1"]) for n in names}
    return pa.table({**cols, "_found": pa.array([True, False]), "_from": pa.array(["redis", None])})


def test_aggregations_take_their_requested_places() -> None:
    values = {"a1": pa.array([1, 2]), "a2": pa.array([0.5, None]), "unasked": pa.array([9, 9])}
    hot = {"a1", "a2", "unasked"}
    got = with_windows(_read(["card", "f1", "f2"]), "card", ["a1", "f1", "a2", "f2"], hot, values)
    assert got.column_names == ["card", "a1", "f1", "a2", "f2", "_found", "_from"]
    assert got.column("a2").to_pylist() == [0.5, None] and got.column("f2").to_pylist() == ["f2-0", "f2-1"]
    only = with_windows(_read(["card"]), "card", ["a2", "a1"], {"a1", "a2"}, values)
    assert only.column_names == ["card", "a2", "a1", "_found", "_from"]


def test_repeated_names_and_another_entity_name_build_the_table_by_name() -> None:
    values = {"a1": pa.array([1, 2])}
    got = with_windows(_read(["card", "f1"]), "card", ["a1", "f1", "a1"], {"a1"}, values)
    assert got.column_names == ["card", "a1", "f1", "_found", "_from"]
    other = with_windows(_read(["id", "f1"]), "card", ["f1", "a1"], {"a1"}, values)
    assert other.column_names == ["card", "f1", "a1", "_found", "_from"]
    assert other.column("card").to_pylist() == ["id-0", "id-1"]
