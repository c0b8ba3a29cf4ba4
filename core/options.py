"""Typed options for harness and environment adapters, and pydantic errors as ConfigErrors naming the key.

An adapter declares its options as a model (`class Options(AdapterOptions)` inside the adapter class);
`[harness.options]` and `[env.options]` stay free-form tables in the config and are checked against that
model when the adapter is built, so an unknown key, a wrong type or a value out of range is a ConfigError
naming the option as the user wrote it (`harness.options.max_steps: Input should be a valid integer ...`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from core.errors import ConfigError, InvalidConfigError

YES, NO = ("1", "true", "yes"), ("0", "false", "no")


def yes_no(options: Mapping[str, str], key: str, where: str) -> bool | None:
    """A yes/no option of a spec's query string (``1``/``true``/``yes`` or ``0``/``false``/``no``, any case); None when
    it is not given; a ConfigError naming `where` for anything else."""
    raw = options.get(key)
    if raw is None:
        return None
    if raw.lower() in YES or raw.lower() in NO:
        return raw.lower() in YES
    raise ConfigError(f"{key}={raw!r} in {where} must be 1 or 0 (true or false)")


def positive(options: Mapping[str, str], key: str, kind: type[int] | type[float], where: str, unit: str = "") -> int | float | None:
    """A number option of a spec's query string that must be > 0 (`kind` int or float); None when it is not given; a
    ConfigError naming `where` (and the `unit`, "seconds") for anything else."""
    raw = options.get(key)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if not value > 0:
        noun = "whole number" if kind is int else "number"
        raise ConfigError(f"{key}={raw!r} in {where} must be a {noun}{' of ' + unit if unit else ''} > 0")
    return value

M = TypeVar("M", bound=BaseModel)


class AdapterOptions(BaseModel):
    """The options one adapter takes. Numbers given for text become text, as `str(value)` made them before.

    Subclass it inside the adapter as `class Options(AdapterOptions)`, one pydantic field per option with its
    default and a `Field(description=...)`: unknown keys are refused, values are checked when the config is
    loaded, and the descriptions are what the config reference (docs/reference/config.md) shows.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


def validated(model: type[M], data: Mapping[str, Any], where: str = "") -> M:
    """`data` validated as `model`; InvalidConfigError naming each problem's key (`where` prefixes them: "policy.")."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        problems = [(where + ".".join(str(p) for p in err["loc"]), err["msg"]) for err in exc.errors()]
        raise InvalidConfigError("invalid config: " + "; ".join(f"{loc}: {msg}" for loc, msg in problems), problems) from None


def reject_unknown(kind: str, name: str, accepted: Collection[str], given: Collection[str]) -> None:
    """ConfigError naming the options in `given` that the `kind` ("harness", "env") `name` does not take, and those it does."""
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise ConfigError(
            f"{kind} {name!r} has no option {', '.join(map(repr, unknown))}; it accepts: {', '.join(sorted(accepted)) or 'none'} "
            f"(remove the option from [{kind}.options], or set it for the {kind} it was meant for)"
        )


def parse_options(model: type[M], given: Mapping[str, Any], kind: str, name: str) -> M:
    """`given` as the adapter's typed options: unknown keys named with the accepted ones, then each value checked."""
    reject_unknown(kind, name, model.model_fields, given)
    return validated(model, given, f"{kind}.options.")


class DeclaresOptions:
    """What harness and environment adapters share about options: a typed `Options` model, the names it accepts.

    Without `Options` an adapter reads the `self.options` dict itself (unchecked, or only against the names
    it lists in `accepted_options`), as every adapter did before options were typed.
    """

    name: ClassVar[str]
    config_section: ClassVar[str]  # "harness" or "env": where the config holds its options, as errors name them
    Options: ClassVar[type[AdapterOptions] | None] = None
    accepted_options: ClassVar[frozenset[str] | None] = None  # derived from `Options` when it declares one

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.Options is not None:
            cls.accepted_options = frozenset(cls.Options.model_fields)

    @classmethod
    def typed_options(cls, given: Mapping[str, Any]) -> Any:
        """`given` as the adapter's `Options` (None when it declares none); ConfigError naming a bad option."""
        if cls.Options is None:
            return None
        return parse_options(cls.Options, given, cls.config_section, cls.name)

    @classmethod
    def check_options(cls, given: Mapping[str, Any]) -> None:
        """Check `given` as building the adapter would, building nothing: ConfigError naming a bad option."""
        if cls.Options is None and cls.accepted_options is not None:
            reject_unknown(cls.config_section, cls.name, cls.accepted_options, given)
        else:
            cls.typed_options(given)


def _comma_list(value: Any) -> Any:
    """A list given as one comma-separated string: "a, b" → ["a", "b"]."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# an option that takes several names: a TOML array or one comma-separated string
Names = Annotated[list[str], BeforeValidator(_comma_list)]


class NoOptions(AdapterOptions):
    """An adapter that takes no options: any given is an error."""
