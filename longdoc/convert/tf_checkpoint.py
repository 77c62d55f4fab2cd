"""Reading TensorFlow checkpoints (TF1 `Saver` / TF2 `tf.train.Checkpoint` "tensor bundles") without TensorFlow.

A checkpoint `PREFIX` is `PREFIX.index` and the data shards `PREFIX.data-00000-of-0000N`:
- The index is a LevelDB table (sorted string table): data blocks of key/value entries, keys
  prefix-compressed against the previous key and restarted every few entries; an index block
  pointing at the data blocks; a 48-byte footer pointing at the index block. TF writes it without
  compression (a block that says otherwise is refused).
- The empty key's value is a `BundleHeaderProto` (number of shards, byte order); every other key is
  a tensor name whose value is a `BundleEntryProto`: dtype, shape, shard, offset and size of its
  bytes in that shard, and the masked CRC-32C of those bytes.
- Numeric tensors are stored raw in the header's byte order; a string tensor is the varint lengths
  of its elements, a masked CRC-32C, then the bytes.

The two protobuf messages are decoded here field by field (only varint, fixed32/64 and
length-delimited fields occur), so neither TensorFlow nor protobuf is needed. Each tensor's
checksum is verified as it is read (google-crc32c, hardware CRC-32C: a converted checkpoint is
hundreds of MB). Damage is reported as an `InputError` naming the file and what was expected.

Partitioned variables (saved as slices of one tensor) are refused: no released checkpoint this
package converts has them.
"""

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import google_crc32c
import numpy as np

from longdoc.errors import InputError

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5  # compression type byte + masked CRC-32C of the block and that byte

# tensorflow/core/framework/types.proto -> numpy dtype. DT_STRING (7) is handled apart.
DT_STRING = 7
NUMPY_DTYPES = {
    1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
    10: np.bool_, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64,
}
DT_BFLOAT16 = 14  # read as its upper float32 half: numpy has no bfloat16

_DATA_SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies: dtype code (types.proto), shape, shard number, byte offset and size, masked CRC-32C."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int


def _mask(crc: int) -> int:
    """LevelDB/TF store a CRC rotated and offset (a CRC stored next to the data it covers is masked)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes | memoryview) -> int:
    return _mask(google_crc32c.value(bytes(data)))


def _varint(buffer: bytes | memoryview, position: int, where: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(buffer):
            raise InputError(f"{where}: a varint runs past the end of its record (the file is damaged or not a TF checkpoint index)")
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise InputError(f"{where}: a varint longer than 10 bytes (the file is damaged or not a TF checkpoint index)")


def _proto_fields(message: bytes | memoryview, where: str) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) for each field of a serialized protobuf message: varints as ints,
    fixed32/fixed64 as ints, length-delimited fields as bytes."""
    position = 0
    while position < len(message):
        key, position = _varint(message, position, where)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(message, position, where)
        elif wire_type == 1:
            value, position = int.from_bytes(message[position:position + 8], "little"), position + 8
        elif wire_type == 5:
            value, position = int.from_bytes(message[position:position + 4], "little"), position + 4
        elif wire_type == 2:
            length, position = _varint(message, position, where)
            value, position = bytes(message[position:position + length]), position + length
        else:
            raise InputError(f"{where}: protobuf wire type {wire_type} (expected a BundleEntryProto)")
        if position > len(message):
            raise InputError(f"{where}: a protobuf field runs past the end of its record")
        yield number, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _parse_shape(message: bytes, where: str) -> tuple[int, ...]:
    dims = []
    for number, value in _proto_fields(message, where):
        if number == 2:  # TensorShapeProto.dim
            size = next((v for n, v in _proto_fields(value, where) if n == 1), 0)
            dims.append(_signed64(size))
        elif number == 3 and value:  # unknown_rank
            raise InputError(f"{where}: a tensor of unknown rank")
    return tuple(dims)


def _parse_entry(name: str, message: bytes, where: str) -> TensorEntry:
    fields = {"dtype": 0, "shape": (), "shard": 0, "offset": 0, "size": 0, "crc32c": None}
    for number, value in _proto_fields(message, where):
        if number == 1:
            fields["dtype"] = value
        elif number == 2:
            fields["shape"] = _parse_shape(value, f"{where}: {name}")
        elif number == 3:
            fields["shard"] = value
        elif number == 4:
            fields["offset"] = value
        elif number == 5:
            fields["size"] = value
        elif number == 6:
            fields["crc32c"] = value
        elif number == 7:
            raise InputError(f"{where}: {name} is saved as slices (a partitioned variable); only whole tensors are read")
    if fields["crc32c"] is None:
        raise InputError(f"{where}: the entry for {name} has no checksum (expected a BundleEntryProto)")
    return TensorEntry(name=name, **fields)


class _Table:
    """The key/value records of a LevelDB table held in memory (a checkpoint index is small)."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.path = data, path
        if len(data) < FOOTER_SIZE:
            raise InputError(f"{path}: {len(data)} bytes, too short for a TF checkpoint index (expected a 48-byte footer at least)")
        footer = data[-FOOTER_SIZE:]
        if int.from_bytes(footer[-8:], "little") != TABLE_MAGIC:
            raise InputError(f"{path}: not a TF checkpoint index (the table's magic number is missing from its last 8 bytes)")
        where = f"{path}: footer"
        _, position = _varint(footer, 0, where)  # metaindex block: TF writes it empty
        _, position = _varint(footer, position, where)
        index_offset, position = _varint(footer, position, where)
        index_size, _ = _varint(footer, position, where)
        self.index_handle = (index_offset, index_size)

    def block(self, offset: int, size: int) -> memoryview:
        end = offset + size + BLOCK_TRAILER_SIZE
        if end > len(self.data) - FOOTER_SIZE:
            raise InputError(f"{self.path}: a block at bytes {offset}..{end} runs past the table's end (the index is truncated or damaged)")
        view = memoryview(self.data)
        contents, compression = view[offset:offset + size], self.data[offset + size]
        stored = int.from_bytes(self.data[offset + size + 1:end], "little")
        if masked_crc32c(view[offset:offset + size + 1]) != stored:
            raise InputError(f"{self.path}: checksum mismatch in the block at byte {offset} (the index is damaged)")
        if compression != 0:
            raise InputError(f"{self.path}: block at byte {offset} is compressed (type {compression}); TF writes checkpoint indexes uncompressed")
        return contents

    def records(self, block: memoryview, where: str) -> Iterator[tuple[bytes, memoryview]]:
        if len(block) < 4:
            raise InputError(f"{where}: a block of {len(block)} bytes (expected its restart count at least)")
        restarts = int.from_bytes(block[-4:], "little")
        end = len(block) - 4 * (restarts + 1)
        if end < 0:
            raise InputError(f"{where}: a block claims {restarts} restart points, more than fit in it")
        position, key = 0, b""
        while position < end:
            shared, position = _varint(block, position, where)
            unshared, position = _varint(block, position, where)
            value_length, position = _varint(block, position, where)
            if shared > len(key) or position + unshared + value_length > end:
                raise InputError(f"{where}: a record runs past its block (the index is damaged)")
            key = key[:shared] + bytes(block[position:position + unshared])
            position += unshared
            yield key, block[position:position + value_length]
            position += value_length

    def items(self) -> Iterator[tuple[bytes, memoryview]]:
        index = self.block(*self.index_handle)
        for _, handle in self.records(index, f"{self.path}: index block"):
            offset, position = _varint(handle, 0, f"{self.path}: block handle")
            size, _ = _varint(handle, position, f"{self.path}: block handle")
            yield from self.records(self.block(offset, size), f"{self.path}: data block at byte {offset}")


def find_checkpoint(folder: str | Path) -> Path:
    """The checkpoint prefix in `folder`: the one the `checkpoint` file names, else the only `*.index`.
    `folder` may also be a prefix itself (`DIR/model.ckpt-100000`)."""
    folder = Path(folder)
    if not folder.is_dir() and folder.with_name(folder.name + ".index").is_file():
        return folder
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (expected a TF checkpoint folder with model.ckpt-N.index and .data-* files)")
    state = folder / "checkpoint"
    if state.is_file():
        match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', state.read_text(errors="replace"), re.MULTILINE)
        if match:
            # The state file may hold a path on the machine that trained: the same name in this folder is meant.
            prefix = folder / Path(match.group(1)).name
            if prefix.with_name(prefix.name + ".index").is_file():
                return prefix
    indexes = sorted(folder.glob("*.index"))
    if not indexes:
        raise InputError(f"{folder}: no TF checkpoint here (expected a file PREFIX.index, e.g. model.ckpt-100000.index, with its .data-* shards)")
    if len(indexes) > 1:
        names = ", ".join(path.name for path in indexes)
        raise InputError(f"{folder}: several checkpoints ({names}) and no `checkpoint` file naming one; pass a folder with one")
    return indexes[0].with_suffix("")


class TFCheckpoint:
    """A TF checkpoint's tensors by name, read from its index and data shards.

    `entries` lists every tensor (name -> TensorEntry) once the index is read; `read(name)` reads
    one tensor, checks its size and checksum, and returns a numpy array (strings: a nested list of
    bytes)."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        self.index_path = self.prefix.with_name(self.prefix.name + ".index")
        if not self.index_path.is_file():
            raise InputError(f"{self.index_path}: missing (expected the checkpoint's index next to its .data-* shards)")
        table = _Table(self.index_path.read_bytes(), self.index_path)
        self.entries: dict[str, TensorEntry] = {}
        header = None
        for key, value in table.items():
            if key == b"":
                header = dict(_proto_fields(value, f"{self.index_path}: header"))
                continue
            name = key.decode("utf-8", errors="replace")
            self.entries[name] = _parse_entry(name, value, f"{self.index_path}: entry {name}")
        if header is None:
            raise InputError(f"{self.index_path}: no bundle header (expected an entry with the empty key: not a TF checkpoint index)")
        self.num_shards = header.get(1, 1)
        if header.get(2, 0) != 0:
            raise InputError(f"{self.index_path}: written big-endian; only little-endian checkpoints are read")
        self.shard_paths = [
            self.prefix.with_name(f"{self.prefix.name}.data-{shard:05d}-of-{self.num_shards:05d}")
            for shard in range(self.num_shards)
        ]
        for path in self.shard_paths:
            if not path.is_file():
                raise InputError(f"{path}: missing (the index {self.index_path.name} lists {self.num_shards} data shard(s))")
        shard_sizes = [path.stat().st_size for path in self.shard_paths]
        for entry in self.entries.values():
            if entry.shard >= self.num_shards:
                raise InputError(f"{self.index_path}: {entry.name} is in shard {entry.shard}, but the header says {self.num_shards} shard(s)")
            if entry.offset + entry.size > shard_sizes[entry.shard]:
                raise InputError(
                    f"{self.shard_paths[entry.shard]}: {shard_sizes[entry.shard]} bytes, but {entry.name} needs bytes "
                    f"{entry.offset}..{entry.offset + entry.size} (the shard is truncated)"
                )

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.entries.values())

    def read(self, name: str) -> np.ndarray | list:
        entry = self.entries[name]
        path = self.shard_paths[entry.shard]
        with open(path, "rb") as handle:
            handle.seek(entry.offset)
            data = handle.read(entry.size)
        if len(data) != entry.size:
            raise InputError(f"{path}: ends inside {entry.name} (the shard is truncated)")
        if entry.dtype == DT_STRING:
            strings, checksum = _decode_strings(data, entry, path)
        else:
            strings, checksum = None, masked_crc32c(data)
        if checksum != entry.crc32c:
            raise InputError(f"{path}: checksum mismatch for {entry.name} (bytes {entry.offset}..{entry.offset + entry.size}: the shard is damaged)")
        if strings is not None:
            return strings
        if entry.dtype == DT_BFLOAT16:
            halves = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
            return halves.view(np.float32).reshape(entry.shape)
        if entry.dtype not in NUMPY_DTYPES:
            raise InputError(f"{self.index_path}: {entry.name} has TF dtype code {entry.dtype}, which this reader does not decode")
        dtype = np.dtype(NUMPY_DTYPES[entry.dtype]).newbyteorder("<")
        count = int(np.prod(entry.shape, dtype=np.int64))
        if count * dtype.itemsize != entry.size:
            raise InputError(f"{self.index_path}: {entry.name} has shape {entry.shape} of {dtype} but {entry.size} bytes")
        return np.frombuffer(data, dtype=dtype).reshape(entry.shape).astype(dtype.newbyteorder("="), copy=False)

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def _decode_strings(data: bytes, entry: TensorEntry, path: Path) -> tuple[list | bytes, int]:
    """A string tensor's elements (nested lists of bytes; a scalar: bytes) and its masked checksum,
    which TF computes over the lengths as little-endian integers (4 bytes each, 8 past 2**32; not
    the varints stored), the stored checksum of the lengths, then the bytes."""
    count = int(np.prod(entry.shape, dtype=np.int64))
    where = f"{path}: {entry.name}"
    lengths, position = [], 0
    for _ in range(count):
        length, position = _varint(data, position, where)
        lengths.append(length)
    crc = google_crc32c.value(b"".join(struct.pack("<I" if length <= 0xFFFFFFFF else "<Q", length) for length in lengths))
    crc = google_crc32c.extend(crc, data[position:position + 4])
    position += 4
    items = []
    for length in lengths:
        items.append(data[position:position + length])
        position += length
    if position != len(data):
        raise InputError(f"{where}: string lengths add up to {position} bytes, the entry has {len(data)}")
    crc = google_crc32c.extend(crc, data[position - sum(lengths):position])
    array = np.empty(count, dtype=object)
    array[:] = items
    return (array.reshape(entry.shape).tolist() if entry.shape else items[0]), _mask(crc)
