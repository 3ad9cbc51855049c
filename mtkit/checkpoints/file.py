"""A checkpoint file read without torch and without running its code, in work and memory bounded by its size.

``torch.save`` writes a zip archive whose entries are all stored, none compressed: ``ARCHIVE/data.pkl``,
the pickle of the payload, and one entry ``ARCHIVE/data/KEY`` per tensor storage, which the pickle names.
:func:`read_payload` checks that layout and reads the pickle with a pure-Python unpickler that builds
containers, numbers, strings and bytes, and tensors as :class:`Tensor` (a shape over a storage, no data).
Nothing of any module is called: a global outside the few that ``torch.save`` writes for an mtkit
checkpoint is refused, as are opcodes that would instantiate classes (NEWOBJ, INST, OBJ) or build sets.

Whatever passes is what ``torch.load(weights_only=True)`` is then given (mtkit.checkpoints.io), so
each bound here is a bound on that load as well:

- the archive: a regular file (a FIFO would hang, ``/dev/zero`` never end); every entry stored, within
  the file and overlapping no other, so that nothing inflates and no byte is read twice;
- the pickle: at most :data:`MAX_PICKLE_BYTES` and :data:`MAX_PICKLE_OPS` operations (each builds at
  most one object); mapping keys short strings or small numbers (hashing a long tuple or a huge integer
  again and again is work without bound);
- what it builds, walked without recursion: at most :data:`MAX_DEPTH` levels deep and
  :data:`MAX_VISITS` elements, a container shared through the pickle's memo counted each time it is
  reached (a memoized list of 10⁶ integers named 2,000 times is 2·10⁹ elements, not 10⁶); integers of
  at most :data:`MAX_INT_BITS` bits;
- tensors: a size and stride of at most :data:`MAX_DIMS` small non-negative integers, inside a storage
  whose entry holds exactly its bytes, and the distinct tensors no more bytes than their storages, so
  that views which repeat their data (a zero stride) cannot describe more weights than the file holds.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtkit.errors import MtkitError, shown
from mtkit.io import open_regular

# A pickle holds the payload's plain data, tensor headers and the SentencePiece models (a few MB;
# an imported model's piece tables, some MB more): 64 MiB is far beyond any mtkit checkpoint's.
MAX_PICKLE_BYTES = 64 << 20
# Opcodes a pickle may run: a trained checkpoint takes ~15 per tensor, an imported vocabulary ~2 per
# piece (two 256k-piece tables: ~1M). Each builds at most one object of ~100 bytes, so this also
# bounds the unpickler's memory (a few hundred MB at worst).
MAX_PICKLE_OPS = 4_000_000
# Elements reached walking what the pickle built, shared containers counted each time: a little more
# than the objects a real checkpoint holds, so that no reader after this one can be made to work longer.
MAX_VISITS = 4_000_000
# Levels of nesting: a checkpoint's deepest value (an optimizer's state of a parameter's moment) is ~6.
MAX_DEPTH = 32
MAX_INT_BITS = 64  # every integer of a checkpoint fits an int64 (steps, sizes, ids)
MAX_KEY_CHARS = 1024  # a mapping key: a tensor or config name
MAX_DIMS = 8  # a weight has at most 2 dimensions; an optimizer's or RNG's state at most a few
MAX_DIM = 1 << 48  # elements along one dimension, offsets and strides: beyond any memory
MAX_ENTRIES = 100_000  # zip entries: one per storage (a model, its optimizer's two moments, a few more)

# torch.save's storage types (``torch.FloatStorage``, …) by their pickled name, with their element size.
ITEMSIZE = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
            "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
            "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8}


class Unreadable(Exception):
    """Why a file is not a readable checkpoint (the text in parentheses of the error line)."""


@dataclass(frozen=True)
class StorageType:
    name: str
    itemsize: int


@dataclass(frozen=True)
class Storage:
    """A storage as the pickle names it: entry ``data/KEY`` of ``numel`` elements of ``type``."""

    key: str
    type: StorageType
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.type.itemsize


class Tensor:
    """A tensor of a checkpoint read without torch: its shape and where its elements lie, no data."""

    __slots__ = ("shape", "stride", "offset", "storage")

    def __init__(self, shape: tuple[int, ...], stride: tuple[int, ...], offset: int, storage: Storage) -> None:
        self.shape, self.stride, self.offset, self.storage = shape, stride, offset, storage

    def __iter__(self):
        return iter(self.shape)

    def __repr__(self) -> str:
        return f"<tensor {' × '.join(map(str, self.shape)) or 'scalar'}>"

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def extent(self) -> int:
        """The elements of its storage from its offset to its last element (0 when empty)."""
        if self.numel == 0:
            return 0
        return 1 + sum((size - 1) * step for size, step in zip(self.shape, self.stride))

    @property
    def view(self) -> tuple:
        return self.storage.key, self.offset, self.shape, self.stride


def refuse(reason: str):
    raise Unreadable(reason)


def _small_int(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_DIM


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if type(value) is not tuple or len(value) > MAX_DIMS or not all(_small_int(n) for n in value):
        refuse(f"a tensor's {what} is {shown(value)}, not a tuple of at most {MAX_DIMS} small non-negative integers")
    return value


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None) -> Tensor:
    """``torch._utils._rebuild_tensor_v2``'s arguments, checked; a :class:`Tensor` for the tensor."""
    if not isinstance(storage, Storage):
        refuse(f"a tensor's storage is {shown(storage)}")
    if not _small_int(offset):
        refuse(f"a tensor's storage offset is {shown(offset)}")
    shape, strides = _dims(size, "size"), _dims(stride, "stride")
    if len(shape) != len(strides):
        refuse(f"a tensor's size {shown(shape)} and stride {shown(strides)} differ in length")
    if type(requires_grad) is not bool or not (hooks is None or (type(hooks) is collections.OrderedDict
                                                                   and not hooks)) or metadata:
        refuse("a tensor with hooks or attributes")  # torch.save writes neither for a state's tensors
    return Tensor(shape, strides, offset, storage)


def _rebuild_parameter(data, requires_grad=False, hooks=None) -> Tensor:
    if not isinstance(data, Tensor):
        refuse(f"a parameter of {shown(data)}")
    return data


def _ordered_dict() -> collections.OrderedDict:
    return collections.OrderedDict()  # torch.save pickles an OrderedDict empty, then sets its items


def _latin1(text, encoding) -> bytes:
    """Protocol 2 pickles ``bytes`` as ``_codecs.encode(text, 'latin1')``."""
    if type(text) is not str or encoding != "latin1":
        refuse(f"_codecs.encode of {shown(text)}, {shown(encoding)}")
    return text.encode("latin1")


GLOBALS = {("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
           ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
           ("collections", "OrderedDict"): _ordered_dict,
           ("_codecs", "encode"): _latin1}
CALLABLE = frozenset(GLOBALS.values())
# The opcodes torch.save's pickles use (protocol 2), and protocol 4's framing and short forms.
OPCODES = ("PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE BININT BININT1 BININT2 LONG1 LONG4 "
           "BINFLOAT BINUNICODE SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_TUPLE TUPLE "
           "TUPLE1 TUPLE2 TUPLE3 EMPTY_LIST APPEND APPENDS EMPTY_DICT SETITEM SETITEMS GLOBAL STACK_GLOBAL REDUCE "
           "BUILD BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT MEMOIZE").split()


def _check_key(key: Any) -> None:
    if isinstance(key, str):
        if len(key) > MAX_KEY_CHARS:
            refuse(f"a mapping key of {len(key)} characters")
    elif not (key is None or isinstance(key, (bool, float)) or (type(key) is int and key.bit_length() <= MAX_INT_BITS)):
        refuse(f"a mapping key {shown(key)}")  # hashing it (again for each use of it) is unbounded work


class _Unpickler(pickle._Unpickler):  # the pure-Python unpickler: each opcode goes through `dispatch`
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.ops = 0
        self.storages: dict[str, Storage] = {}
        self.states: list = []  # what BUILD sets on an OrderedDict (a state_dict's _metadata), walked too

    def find_class(self, module: str, name: str):
        if module == "torch" and name in ITEMSIZE:
            return StorageType(name, ITEMSIZE[name])
        if (module, name) not in GLOBALS:
            refuse(f"its pickle names {shown(module)}.{shown(name)}, which no mtkit checkpoint holds")
        return GLOBALS[(module, name)]

    def persistent_load(self, pid) -> Storage:
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], StorageType)
                and type(pid[2]) is str and len(pid[2]) <= 64 and type(pid[3]) is str and len(pid[3]) <= 64
                and _small_int(pid[4])):
            refuse(f"a storage of {shown(pid)}")
        storage = Storage(pid[2], pid[1], pid[4])
        if self.storages.setdefault(storage.key, storage) != storage:
            refuse(f"storage {shown(storage.key)} is named with two types or sizes")
        return self.storages[storage.key]

    # Opcodes with checks before pickle's own code runs.

    def load_reduce(self) -> None:
        func, args = self.stack[-2], self.stack[-1]
        if not any(func is f for f in CALLABLE) or type(args) is not tuple or len(args) > 8:
            refuse(f"its pickle calls {shown(func)}")
        super().load_reduce()

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        if type(inst) is not collections.OrderedDict or type(state) is not dict:
            refuse(f"its pickle sets the state of {shown(inst)}")
        for key in state:
            _check_key(key)
        self.states.append(self.stack.pop())  # kept aside, not set: nothing here reads it

    def load_setitem(self) -> None:
        if type(self.stack[-3]) not in (dict, collections.OrderedDict):
            refuse(f"its pickle sets an item of {shown(self.stack[-3])}")
        _check_key(self.stack[-2])
        super().load_setitem()

    def load_setitems(self) -> None:
        items, target = self.stack, self.metastack[-1][-1] if self.metastack and self.metastack[-1] else None
        if type(target) not in (dict, collections.OrderedDict):
            refuse(f"its pickle sets items of {shown(target)}")
        for key in items[::2]:
            _check_key(key)
        super().load_setitems()

    def load_append(self) -> None:
        if type(self.stack[-2]) is not list:
            refuse(f"its pickle appends to {shown(self.stack[-2])}")
        super().load_append()

    def load_appends(self) -> None:
        target = self.metastack[-1][-1] if self.metastack and self.metastack[-1] else None
        if type(target) is not list:
            refuse(f"its pickle appends to {shown(target)}")
        super().load_appends()


def _counted(handler):
    def run(self: _Unpickler) -> None:
        self.ops += 1
        if self.ops > MAX_PICKLE_OPS:
            refuse(f"its pickle runs more than {MAX_PICKLE_OPS:,} operations")
        handler(self)

    return run


_OVERRIDES = {"REDUCE": _Unpickler.load_reduce, "BUILD": _Unpickler.load_build, "SETITEM": _Unpickler.load_setitem,
              "SETITEMS": _Unpickler.load_setitems, "APPEND": _Unpickler.load_append,
              "APPENDS": _Unpickler.load_appends}
_Unpickler.dispatch = {getattr(pickle, name)[0]: _counted(_OVERRIDES.get(name, pickle._Unpickler.dispatch[
    getattr(pickle, name)[0]])) for name in OPCODES}


def unpickle(data: bytes) -> tuple[Any, dict[str, Storage], list]:
    """The object ``data`` pickles, the storages it names and the states its BUILDs set (a pickle that
    does more than an mtkit checkpoint's raises :class:`Unreadable`)."""
    reader = _Unpickler(data)
    try:
        payload = reader.load()
    except Unreadable:
        raise
    except KeyError as e:  # an opcode outside OPCODES, or a memo entry never put
        raise Unreadable(f"its pickle has an opcode or memo entry mtkit does not read ({shown(e.args[0])})") from None
    except (Exception, RecursionError) as e:  # noqa: BLE001 - a broken or foreign pickle, whatever broke
        raise Unreadable(f"its pickle: {type(e).__name__}") from None
    return payload, reader.storages, reader.states


def walk(roots: list) -> list[Tensor]:
    """Check the depth, size and integers of what the pickle built, without recursion; its tensors."""
    tensors: list[Tensor] = []
    visits = 0
    todo: list[tuple[Any, int]] = [(roots, 0)]
    while todo:
        obj, depth = todo.pop()
        if depth > MAX_DEPTH:
            refuse(f"values nested more than {MAX_DEPTH} deep")
        visits += len(obj)
        if visits > MAX_VISITS:
            refuse(f"more than {MAX_VISITS:,} values (containers counted each time they are named)")
        for child in (obj.values() if isinstance(obj, dict) else obj):
            if isinstance(child, (dict, list, tuple)):
                todo.append((child, depth + 1))
            elif isinstance(child, Tensor):
                tensors.append(child)
            elif isinstance(child, int) and child.bit_length() > MAX_INT_BITS:
                refuse(f"an integer of {child.bit_length()} bits")
    return tensors


def _entries(archive: zipfile.ZipFile, size: int) -> dict[str, zipfile.ZipInfo]:
    """The archive's entries, each stored uncompressed within the file and overlapping no other."""
    infos = archive.infolist()
    if len(infos) > MAX_ENTRIES:
        refuse(f"{len(infos):,} zip entries, more than the {MAX_ENTRIES:,} of any checkpoint")
    end = 0
    for info in sorted(infos, key=lambda i: i.header_offset):
        if info.compress_type != zipfile.ZIP_STORED:
            # torch.save stores every entry; a compressed one could inflate far beyond the file (a zip bomb).
            refuse(f"entry {shown(info.filename)} is compressed; torch.save stores every entry as it is")
        if info.compress_size != info.file_size:
            refuse(f"entry {shown(info.filename)} declares {info.file_size:,} bytes stored in {info.compress_size:,}")
        start = info.header_offset
        if start < end or start + 30 + len(info.filename.encode()) + info.file_size > size:
            refuse(f"entry {shown(info.filename)} overlaps another or ends beyond the file")
        end = start + 30 + len(info.filename.encode()) + info.file_size
    return {info.filename: info for info in infos}


def read_payload(path: str | Path, what: str = "mtkit checkpoint") -> Any:
    """The checkpoint's payload with each tensor as a :class:`Tensor`, read without torch.

    Raises MtkitError: ``PATH: no such checkpoint``, ``PATH: not a regular file``, or
    ``PATH: not a readable WHAT (REASON)`` for anything that is not laid out as torch.save
    lays out an mtkit checkpoint or exceeds a bound of this module. ``what``: the kind of file the
    message names (a COMET model's Lightning checkpoint is written by torch.save as well, and holds
    no global an mtkit checkpoint does not).
    """
    path = Path(path)
    with open_regular(path, "no such checkpoint") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            try:
                archive = zipfile.ZipFile(f)
            except (zipfile.BadZipFile, OSError, ValueError, EOFError):
                refuse("not a zip archive, as torch.save writes")
            with archive:
                entries = _entries(archive, size)
                pickles = [n for n in entries if n.endswith("/data.pkl") and n.count("/") == 1]
                if len(pickles) != 1:
                    refuse("no ARCHIVE/data.pkl entry, as torch.save writes" if not pickles else "two data.pkl")
                prefix = pickles[0].removesuffix("data.pkl")
                if not all(n.startswith(prefix) for n in entries):
                    refuse("entries outside its archive's folder")
                if entries[pickles[0]].file_size > MAX_PICKLE_BYTES:
                    refuse(f"a pickle of {entries[pickles[0]].file_size:,} bytes, more than the "
                           f"{MAX_PICKLE_BYTES >> 20} MiB of any mtkit checkpoint")
                try:
                    with archive.open(pickles[0]) as member:
                        data = member.read(MAX_PICKLE_BYTES + 1)  # bounded, whatever the entry declares
                except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as e:
                    refuse(f"its data.pkl: {type(e).__name__}")
            if len(data) > MAX_PICKLE_BYTES:
                refuse(f"a pickle of more than {MAX_PICKLE_BYTES >> 20} MiB")
            payload, storages, states = unpickle(data)
            tensors = walk([payload, *states])
            check_storages(tensors, storages, entries, prefix)
        except Unreadable as e:
            raise MtkitError(f"{path}: not a readable {what} ({e})") from None
    return payload


def check_storages(tensors: list[Tensor], storages: dict[str, Storage], entries: dict, prefix: str) -> None:
    """Each storage an entry of exactly its bytes; each tensor inside its storage; the distinct tensors no
    more bytes than the storages (views that repeat their data, a zero stride, would describe more
    weights than the file holds)."""
    for storage in storages.values():
        info = entries.get(f"{prefix}data/{storage.key}")
        if info is None:
            refuse(f"no entry for storage {shown(storage.key)}")
        if info.file_size != storage.nbytes:
            refuse(f"storage {shown(storage.key)} is {storage.numel:,} × {storage.type.itemsize} bytes but its "
                   f"entry holds {info.file_size:,}")
    views = {t.view: t for t in tensors}
    for t in views.values():
        if t.offset + t.extent > t.storage.numel:
            refuse(f"a {t!r} reaches past the end of its storage {shown(t.storage.key)}")
    described = sum(t.numel * t.storage.type.itemsize for t in views.values())
    held = sum(s.nbytes for s in {t.storage for t in views.values()})
    if described > held:
        refuse(f"its tensors describe {described:,} bytes but their storages hold {held:,}: "
               "views that repeat their data")
