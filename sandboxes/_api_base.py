"""What every model of the service's wire (`sandboxes.api`, `sandboxes.api_resources`) is made
of: requests that refuse what their schema does not state (`_Request`), answers that ignore
fields a newer service adds (`_Answer`), and the integer types JSON's numbers are read as."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__ = ["VOLUME_NAME", "Integer", "PositiveInteger"]

VOLUME_NAME = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
"""A volume's name: what `CreateVolume` and a `sandboxes.api.VolumeMount` name."""


class _Model(BaseModel):
    """Its validator and serializer are built at its first use, not at import (``defer_build``):
    a client imports every model of the API and uses a few."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


class _Answer(BaseModel):
    """A response body: fields a newer service adds are ignored by an older client."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


class _Request(_Model):
    """A request body: JSON types taken as the schema states them (no ``true`` for a number,
    no ``"5"`` for an integer, no number for a string), so what the OpenAPI document refuses,
    the service refuses."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _integral(value: Any) -> Any:
    """A JSON number with a zero fraction (``2.0``) as the integer JSON Schema says it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_integral)]
"""An integer field of a request: any JSON integer, ``2.0`` included; never a boolean."""

PositiveInteger = Annotated[int, Field(gt=0), BeforeValidator(_integral)]
