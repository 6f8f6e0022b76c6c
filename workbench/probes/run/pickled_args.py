"""A run's `training_args.bin` read without unpickling it: the class and the plain fields (numbers, strings,
booleans, None) of the TrainingArguments it stores, taken from the pickle's opcodes.

`torch.save(args)` (the Trainer's `_save`) writes a zip whose `*/data.pkl` builds the arguments object from a class
reference and a state dict. `pickletools.genops` lists the opcodes without running them; a small stack machine
keeps primitives, tuples, lists and dicts as values and every class reference, call and persistent id as an inert
placeholder. Nothing is imported, no constructor or `__setstate__` runs: a malicious pickle yields placeholders, not
code execution. Enum fields (`IntervalStrategy("steps")`) come back as their value.
"""

from __future__ import annotations

import dataclasses
import pickletools
import re
import zipfile
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Global:
    """A class or function the pickle names (never imported)."""

    name: str


@dataclasses.dataclass
class Built:
    """What the pickle would build by calling `ref` with `args`, then setting `state`: not built."""

    ref: Any
    args: tuple
    state: Any = None


_MARK = object()
# fields never kept: credentials (TrainingArguments.hub_token) stay out of every finding and report
_SECRET = re.compile(r"(token|secret|password|api_key|credential)s?$", re.I)


@dataclasses.dataclass(frozen=True)
class PickledArgs:
    cls: str  # 'module.Class'
    fields: dict[str, Any]  # the plain fields only


MAX_BYTES = 1 << 20  # a TrainingArguments pickle is ~8 KB; the opcode walk costs ~1 s per MB: larger is refused


def pickle_bytes(path: Path) -> bytes:
    """The pickle stream of a plain pickle file or of torch.save's zip (its `*/data.pkl`), at most MAX_BYTES
    (a larger stream, or a zip entry that says it expands past it, is refused: ValueError)."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head == b"PK\x03\x04":
        with zipfile.ZipFile(path) as archive:
            info = next((i for i in archive.infolist() if i.filename.endswith("data.pkl")), None)
            if info is None:
                raise ValueError(f"{path}: a zip without data.pkl")
            if info.file_size > MAX_BYTES:
                raise ValueError(f"{path}: data.pkl of {info.file_size} bytes")
            with archive.open(info) as entry:
                data = entry.read(MAX_BYTES + 1)
    else:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path}: over {MAX_BYTES} bytes")
    return data


ENUM_MODULES = ("transformers.", "trl.", "peft.", "accelerate.")  # whose enums (IntervalStrategy, ...) are values


def _plain(value: Any) -> Any:
    """An enum member's value (a class of the training stack called with one plain argument, as
    `IntervalStrategy("steps")` is pickled), else the value itself. Any other call stays a placeholder."""
    if (isinstance(value, Built) and value.state is None and len(value.args) == 1 and _is_plain(value.args[0])
            and isinstance(value.ref, Global) and value.ref.name.startswith(ENUM_MODULES)):
        return value.args[0]
    return value


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _pop_mark(stack: list) -> list:
    items = []
    while stack:
        item = stack.pop()
        if item is _MARK:
            return items[::-1]
        items.append(item)
    raise ValueError("MARK missing")


def read_structure(data: bytes) -> Any:
    """The object a pickle describes, with placeholders for everything that would run code."""
    stack: list = []
    memo: dict[int, Any] = {}
    strings: list[str] = []
    for opcode, arg, _ in pickletools.genops(data):
        name = opcode.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            break
        if name == "MARK":
            stack.append(_MARK)
        elif name in ("NONE",):
            stack.append(None)
        elif name in ("NEWTRUE", "NEWFALSE"):
            stack.append(name == "NEWTRUE")
        elif name in ("BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "BINFLOAT", "FLOAT"):
            stack.append(arg)
        elif name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING",
                      "STRING", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BYTEARRAY8"):
            stack.append(arg)
            if isinstance(arg, str):
                strings.append(arg)
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name == "TUPLE":
            stack.append(tuple(_pop_mark(stack)))
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "LIST":
            stack.append(_pop_mark(stack))
        elif name == "APPEND":
            value = stack.pop()
            if isinstance(stack[-1], list):
                stack[-1].append(value)
        elif name == "APPENDS":
            items = _pop_mark(stack)
            if isinstance(stack[-1], list):
                stack[-1].extend(items)
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "DICT":
            items = _pop_mark(stack)
            stack.append({items[i]: items[i + 1] for i in range(0, len(items) - 1, 2) if _hashable(items[i])})
        elif name == "SETITEM":
            value, key = stack.pop(), stack.pop()
            if isinstance(stack[-1], dict) and _hashable(key):
                stack[-1][key] = value
        elif name == "SETITEMS":
            items = _pop_mark(stack)
            if isinstance(stack[-1], dict):
                stack[-1].update({items[i]: items[i + 1] for i in range(0, len(items) - 1, 2) if _hashable(items[i])})
        elif name in ("EMPTY_SET", "FROZENSET"):
            stack.append(set() if name == "EMPTY_SET" else frozenset(x for x in _pop_mark(stack) if _hashable(x)))
        elif name == "ADDITEMS":
            items = _pop_mark(stack)
            if isinstance(stack[-1], set):
                stack[-1].update(x for x in items if _hashable(x))
        elif name == "GLOBAL":
            stack.append(Global(str(arg).replace(" ", ".")))
        elif name == "STACK_GLOBAL":
            attr, module = stack.pop(), stack.pop()
            named = isinstance(module, str) and isinstance(attr, str)
            stack.append(Global(f"{module}.{attr}" if named else "?"))
        elif name in ("REDUCE", "NEWOBJ"):
            args, ref = stack.pop(), stack.pop()
            stack.append(Built(ref, tuple(args) if isinstance(args, tuple) else (args,)))
        elif name == "NEWOBJ_EX":
            _kwargs, args, ref = stack.pop(), stack.pop(), stack.pop()
            stack.append(Built(ref, tuple(args) if isinstance(args, tuple) else (args,)))
        elif name == "OBJ":
            items = _pop_mark(stack)
            stack.append(Built(items[0] if items else None, tuple(items[1:])))
        elif name == "INST":
            stack.append(Built(Global(str(arg).replace(" ", ".")), tuple(_pop_mark(stack))))
        elif name == "BUILD":
            state = stack.pop()
            if isinstance(stack[-1], Built):
                stack[-1].state = state
        elif name in ("PERSID", "BINPERSID"):
            if name == "BINPERSID":
                stack.pop()
            stack.append(Built(Global("persistent_id"), ()))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo.get(int(arg)))
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            _pop_mark(stack)
        elif name == "DUP":
            stack.append(stack[-1])
        else:  # an opcode this reader does not model (extensions, NEXT_BUFFER): stop here
            raise ValueError(f"opcode {name} not read")
    return stack[-1] if stack else None


def _hashable(value: Any) -> bool:
    """A key kept in a dict or set: a plain scalar or a class reference only. Nothing else is hashed (hashing a
    million-deep tuple recurses in C and kills the process)."""
    return value is None or isinstance(value, (str, int, float, bool, bytes, Global))


def read_pickled_args(path: Path) -> PickledArgs | None:
    """The class and plain fields of the arguments object in `training_args.bin`; None when unreadable."""
    try:
        built = read_structure(pickle_bytes(path))
    except Exception:  # noqa: BLE001 - a hostile or damaged file (encrypted or bombed zip, bad deflate, deep nesting):
        return None     # no class, no fields, and the log is judged without them
    if not isinstance(built, Built):
        return None
    ref = built.ref
    if isinstance(ref, Global) and ref.name.endswith("__newobj__") and built.args:  # copyreg.__newobj__(cls, ...)
        ref = built.args[0]
    cls = ref.name if isinstance(ref, Global) else ""
    state = built.state[1] if isinstance(built.state, tuple) and len(built.state) == 2 else built.state
    return PickledArgs(cls, plain_fields(state) if isinstance(state, dict) else {})


def plain_fields(state: dict) -> dict[str, Any]:
    """The fields whose values are plain (numbers, strings, booleans, None, lists of them; an enum as its value),
    credentials left out."""
    fields = {}
    for key, value in state.items():
        value = _plain(getattr(value, "value", value) if not isinstance(value, Built) else value)
        if isinstance(value, (list, tuple)) and all(_is_plain(v) for v in value):
            value = list(value)  # DPOConfig's loss_type: ["sigmoid"]
        if isinstance(key, str) and not _SECRET.search(key) and (_is_plain(value) or isinstance(value, list)):
            fields[key] = value
    return fields
