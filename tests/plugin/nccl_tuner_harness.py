"""Drive the built tuner plugin the way NCCL does: dlopen it, look up ``ncclTunerPlugin_vN``, call through it.

The ctypes structs mirror NCCL's ``tuner_v3.h`` ... ``tuner_v6.h``; the cost table is NCCL's
``float[numAlgo][numProto]`` passed as ``float**``, and the logger records what the plugin reports.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
LL, LL128, SIMPLE = range(3)
BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLREDUCE = range(5)
IGNORE = -1.0
LOG_WARN, LOG_INFO, LOG_TRACE = 2, 3, 5

# The plugin always calls the (variadic) logger as log(level, flags, file, line, "%s", message).
Logger = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p
)
_Context = ctypes.POINTER(ctypes.c_void_p)
_InitV3 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, Logger, _Context)
_InitV5 = ctypes.CFUNCTYPE(
    ctypes.c_int,
    _Context,
    ctypes.c_uint64,
    ctypes.c_size_t,
    ctypes.c_size_t,
    Logger,
    ctypes.c_void_p,
    ctypes.c_void_p,
)
# getCollInfo(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, [regBuff,] nChannels)
_COLL_INFO_HEAD = (
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_void_p,
)
_COLL_INFO_COUNTS = (ctypes.c_int, ctypes.c_int)
_CollInfoV3 = ctypes.CFUNCTYPE(*_COLL_INFO_HEAD, *_COLL_INFO_COUNTS, ctypes.POINTER(ctypes.c_int))
_CollInfoV4 = ctypes.CFUNCTYPE(*_COLL_INFO_HEAD, *_COLL_INFO_COUNTS, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
_Finalize = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def _tuner_struct(version: int, init: object, coll_info: object, last: str) -> type[ctypes.Structure]:
    fields = [("name", ctypes.c_char_p), ("init", init), ("getCollInfo", coll_info), (last, _Finalize)]
    if version >= 6:
        fields.append(("getChunkSize", ctypes.c_void_p))
    return type(f"TunerV{version}", (ctypes.Structure,), {"_fields_": fields})


# tuner_v3.h ... tuner_v6.h: v4 adds regBuff, v5 a new init and finalize's name, v6 getChunkSize.
STRUCTS: dict[int, type[ctypes.Structure]] = {
    3: _tuner_struct(3, _InitV3, _CollInfoV3, "destroy"),
    4: _tuner_struct(4, _InitV3, _CollInfoV4, "destroy"),
    5: _tuner_struct(5, _InitV5, _CollInfoV4, "finalize"),
    6: _tuner_struct(6, _InitV5, _CollInfoV4, "finalize"),
}


@dataclass(frozen=True)
class LogRecord:
    level: int
    flags: int
    file: str
    message: str


class CostTable:
    """NCCL's cost table for one call: float[num_algo][num_proto], -1 where NCCL ruled a combination out."""

    def __init__(self, num_algo: int = 7, num_proto: int = 3, ignored: frozenset[tuple[int, int]] = frozenset()):
        self.num_algo = num_algo
        self.num_proto = num_proto
        self.cells = (ctypes.c_float * (num_algo * num_proto))()
        for a in range(num_algo):
            for p in range(num_proto):
                # Distinct positive times in microseconds, like NCCL's model produces.
                self.cells[a * num_proto + p] = IGNORE if (a, p) in ignored else 10.0 + 3.0 * a + p

    def __getitem__(self, key: tuple[int, int]) -> float:
        algo, proto = key
        return float(self.cells[algo * self.num_proto + proto])

    def snapshot(self) -> list[float]:
        return list(self.cells)

    def nccl_choice(self) -> tuple[int, int]:
        """What NCCL's topoGetAlgoInfo picks: the first smallest entry that is >= 0."""
        best = min(
            ((a, p) for a in range(self.num_algo) for p in range(self.num_proto) if self[a, p] >= 0.0),
            key=lambda ap: self[ap],
        )
        return best


def nccl_like_table(num_algo: int = 7) -> CostTable:
    """One node: no CollNet, no NVLS (NCCL_NVLS_ENABLE=0), and NCCL's LL128 gate closed for tree."""
    ignored = {(a, p) for a in (COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE) for p in range(3)} | {(TREE, LL128)}
    return CostTable(num_algo=num_algo, ignored=frozenset(x for x in ignored if x[0] < num_algo))


@dataclass
class Communicator:
    """One tuner context, as NCCL holds one per communicator."""

    version: int
    plugin: ctypes.Structure
    logger: object  # the CFUNCTYPE object must outlive the context
    records: list[LogRecord]
    context: ctypes.c_void_p = field(default_factory=ctypes.c_void_p)
    finalized: bool = False

    def coll_info(
        self,
        coll: int,
        n_bytes: int,
        table: CostTable,
        *,
        num_pipe_ops: int = 1,
        reg_buff: int = 0,
        n_channels: int = 0,
    ) -> int:
        """Call getCollInfo as NCCL does (nChannels starts at 0, "NCCL decides"); return the channel count."""
        channels = ctypes.c_int(n_channels)
        table_ptr = ctypes.cast(table.cells, ctypes.c_void_p)
        args: list[object] = [
            self.context,
            coll,
            n_bytes,
            num_pipe_ops,
            table_ptr,
            table.num_algo,
            table.num_proto,
        ]
        if self.version >= 4:  # v3 has no regBuff
            args.append(reg_buff)
        rc = self.plugin.getCollInfo(*args, ctypes.byref(channels))
        assert rc == 0, f"getCollInfo returned ncclResult {rc}"
        return channels.value

    def messages(self, min_level: int = LOG_INFO) -> list[str]:
        return [r.message for r in self.records if r.level <= min_level]

    def finalize(self) -> None:
        if not self.finalized:
            fin = self.plugin.destroy if self.version in (3, 4) else self.plugin.finalize
            assert fin(self.context) == 0
            self.finalized = True


class TunerLibrary:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self._open: list[Communicator] = []

    def struct(self, version: int) -> ctypes.Structure:
        return STRUCTS[version].in_dll(self.lib, f"ncclTunerPlugin_v{version}")

    def init(self, version: int, *, n_ranks: int, n_nodes: int, comm_id: int = 0xC0FFEE) -> Communicator:
        plugin = self.struct(version)
        records: list[LogRecord] = []

        # The parameter list is NCCL's logger signature, fixed by the C ABI.
        def log(level: int, flags: int, file: bytes, line: int, fmt: bytes, message: bytes) -> None:
            assert fmt == b"%s"
            records.append(LogRecord(level=level, flags=flags, file=file.decode(), message=message.decode()))

        logger = Logger(log)
        comm = Communicator(version=version, plugin=plugin, logger=logger, records=records)
        if version in (3, 4):
            rc = plugin.init(n_ranks, n_nodes, logger, ctypes.byref(comm.context))
        else:
            rc = plugin.init(ctypes.byref(comm.context), comm_id, n_ranks, n_nodes, logger, None, None)
        assert rc == 0, f"init returned ncclResult {rc}"
        self._open.append(comm)
        return comm

    def finalize_all(self) -> None:
        for comm in self._open:
            comm.finalize()
        self._open.clear()
