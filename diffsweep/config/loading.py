"""Loading: defaults -> size preset -> YAML -> ``--set a.b=c`` -> strict decode -> validate -> resolve.

Strict decoding (``diffsweep.config.decode``) turns a plain nested dict into the typed dataclasses
of ``schema``; an unknown key, a wrong type or an enum value outside its members is a
``ConfigError`` naming the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from diffsweep.config.decode import decode
from diffsweep.config.errors import ConfigError
from diffsweep.config.kinds import kind_spec
from diffsweep.config.schema import Config, ResolvedConfig
from diffsweep.config.sizes import SIZES
from diffsweep.config.validate import resolve


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ResolvedConfig:
    """Load, validate and resolve a run config.

    ``path`` is a YAML file (or None for the defaults); ``overrides`` are ``a.b=c`` strings whose
    values are parsed as YAML scalars. Raises ``ConfigError`` for anything the user can fix.
    """
    return resolve(load_declared(path, overrides))


def config_from_dict(raw: dict[str, Any]) -> ResolvedConfig:
    """Decode a nested dict (YAML shape) strictly, apply the size preset under it, validate."""
    return resolve(declared_config(raw))


def declared_config(raw: dict[str, Any]) -> Config:
    """The config as declared (preset, file, overrides), before derived fields are filled in.

    Derived fields (head counts, per-head norm, FFN size) stay ``None`` here. Use this to write a
    config back out for reuse: pinning derived values would carry one kind's head count into
    another kind's run. It is not validated: pass it through ``resolve`` (or use ``load_config``).
    """
    if not isinstance(raw, dict):
        raise ConfigError("", f"expected a mapping at the top level, got {type(raw).__name__}")
    config = decode(Config, apply_size_preset(raw))
    kind_spec(config.model.attention.kind)  # a name the kinds' registry knows (the error lists them)
    return config


def load_declared(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Like ``load_config`` but returns the declared (unresolved, not yet validated) config."""
    raw = read_yaml(path) if path is not None else {}
    sweep_keys = [k for k in ("name", "base", "grid", "runs", "extends") if k in raw]
    if path is not None and sweep_keys and not {"model", "train", "data"} & raw.keys():
        raise ConfigError(str(path), f"is a sweep file ({', '.join(sweep_keys)}); expected a run config (model, "
                          "train, data): run a sweep with `diffsweep launch`, one run with its base config")
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return declared_config(raw)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing or malformed file is a ConfigError naming the file.

    Aliases are allowed within a bound (``MAX_ALIAS_NODES``); a recursive one is refused.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(str(p), "config file not found")
    if not p.is_file():
        raise ConfigError(str(p), "expected a YAML file, got a directory or special file")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), f"cannot read the file: {exc}") from None
    except RecursionError:  # the composer recurses once per level of nesting
        raise ConfigError(str(p), "not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(str(p), f"not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(p), f"expected a YAML mapping at the top level, got {type(data).__name__}")
    return copy_tree(data)  # aliased values become copies: callers change the mappings they read


# Nodes that aliases (``*name``) may add to one document once expanded. Far above what a config,
# sweep or profile uses them for (sharing a few values or rows), far below a "billion laughs"
# document, whose few lines expand to 10^9 values that every later step would walk.
MAX_ALIAS_NODES = 10_000


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (the last would silently win;
    keys merged in with ``<<`` may be overridden), an alias inside the node it names (a recursive document) and aliases that expand to more
    than ``MAX_ALIAS_NODES`` nodes.

    Aliases are counted while the document is composed, before any value is built: each node's
    expanded size is known once its children are, so counting costs one addition per alias.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded: dict[int, int] = {}  # id(node) -> nodes in its expansion (nodes outlive composing)
        self._alias_nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is reported by the base class
                size = self._expanded.get(id(target))
                if size is None:  # anchors are registered before their children are composed
                    raise yaml.composer.ComposerError(
                        None, None, f"alias *{event.anchor} is inside the node it names (a recursive alias)",
                        event.start_mark)
                self._alias_nodes += size
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise yaml.composer.ComposerError(
                        None, None, f"aliases expand to more than {MAX_ALIAS_NODES:,} values", event.start_mark)
            return super().compose_node(parent, index)
        node = super().compose_node(parent, index)
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        self._expanded[id(node)] = 1 + sum(self._expanded[id(child)] for child in children)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *defaults``: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key; the base class reports it
                duplicate = False
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            if not isinstance(key, (list, dict)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_override(item: str) -> tuple[str, Any]:
    """Parse ``a.b=c``; the value is a YAML scalar (``true``, ``3``, ``1.5e-4``, ``[0.9, 0.95]``)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError("set", f"expected KEY=VALUE with a dotted KEY (e.g. model.d_model=512), got {item!r}")
    return key, parse_scalar(text)


def parse_scalar(text: str) -> Any:
    """A command-line value as YAML reads it (``true``, ``3``, ``1e-3``); unparsable text as is."""
    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set ``raw[a][b] = value`` for key ``a.b``, creating intermediate mappings."""
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), f"is a value, not a section; cannot set {key}")
        node = child
    node[parts[-1]] = value


def apply_size_preset(raw: dict[str, Any]) -> dict[str, Any]:
    """Layer the preset named by ``model.size`` under the user's explicit values."""
    model = raw.get("model")
    size = model.get("size") if isinstance(model, dict) else None
    if size is None:
        return raw
    if not isinstance(size, str) or size not in SIZES:
        raise ConfigError("model.size", f"expected one of [{', '.join(SIZES)}], got {size!r}")
    return _merged(SIZES[size], raw)


def copy_tree(data: Any) -> Any:
    """A copy of nested mappings and lists (leaves are immutable scalars): cheaper than deepcopy."""
    if isinstance(data, dict):
        return {k: copy_tree(v) for k, v in data.items()}
    if isinstance(data, list):
        return [copy_tree(v) for v in data]
    return data


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` layered over ``base`` as a new mapping (neither is changed; untouched sections of
    ``base`` are shared, so treat the result as read-only)."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = _merged(below, value) if isinstance(value, dict) and isinstance(below, dict) else value
    return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def to_dict(obj: Any) -> Any:
    """The plain-data (YAML-ready) form of a config: enums as strings, tuples as lists."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None and dataclasses.is_dataclass(obj):
        names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    if names is not None:
        return {name: to_dict(getattr(obj, name)) for name in names}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    return obj


_DERIVED = "__derived__"


def dump_yaml(config: Config, resolved: Config | None = None) -> str:
    """Serialize a config to YAML that ``load_config`` reads back to an equal config.

    With ``resolved`` (the resolved form of a declared ``config``), fields ``config`` leaves to be
    derived are written as ``null`` with a ``# derived: <value>`` comment.
    """
    data = to_dict(config)
    if resolved is not None:
        _mark_derived(data, to_dict(resolved))
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return "\n".join(_render_derived(line) for line in text.split("\n"))


def _mark_derived(declared: dict[str, Any], resolved: dict[str, Any]) -> None:
    for key, value in declared.items():
        if isinstance(value, dict):
            _mark_derived(value, resolved[key])
        elif value is None and resolved[key] is not None:
            declared[key] = f"{_DERIVED}{resolved[key]}"  # derived values are ints and enum names


def _render_derived(line: str) -> str:
    key, sep, value = line.partition(": ")
    value = value.strip("'")
    if sep and value.startswith(_DERIVED):
        return f"{key}: null  # derived: {value.removeprefix(_DERIVED)}"
    return line
