"""Request field types the API checks at the edge, before anything reaches a store.

Postgres refuses NUL in text and JSONB, and a lone surrogate (a JSON `\\u` escape can carry
one) has no UTF-8 encoding: a string with either is a 422 naming its field, and the OpenAPI
schema says so with a pattern. pydantic's `Literal` matches by equality, so `true` would pass
as `1` and `5.0` as `5`: an integer field takes JSON integers only.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from orchestrator.text import unstorable


class Storable:
    """`Annotated` marker for a `str`: refuse what Postgres cannot store. Placed after any
    length constraints, so those keep their own errors."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_storable, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        # Lone surrogates need no pattern: they are not Unicode text, so no JSON string is one.
        json_schema["pattern"] = "^[^\\u0000]*$"
        return json_schema


def _storable(text: str) -> str:
    if reason := unstorable(text):
        raise PydanticCustomError("unstorable_text", reason)
    return text


def _integer(value: object) -> object:
    if isinstance(value, bool | float):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def whole(value: object) -> object:
    """A `BeforeValidator` for an integer field with bounds of its own (`Field(ge=, le=)`):
    JSON Schema's integer is a number without a fraction, so 60.0 is one; "60" and true are
    not."""
    if isinstance(value, bool | str) or (isinstance(value, float) and not value.is_integer()):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return int(value) if isinstance(value, float) else value


StorableStr = Annotated[str, Storable()]


PriorityIn = Annotated[Literal[1, 2, 3, 5, 7], BeforeValidator(_integer)]
