"""The NVML edge of discovery: a narrow protocol, the real pynvml backend, and record/replay.

Purpose: discovery asks NVML a fixed set of questions through `NvmlApi`, with GPUs named by index and answers in
plain Python values, so the same code runs on a real machine (`PynvmlBackend`), records what a real machine said
(`RecordingNvml`) and replays a recording in tests (`ReplayNvml`). NVML failures arrive as `NvmlCallError`
carrying NVML's own message ("Not Supported") so discovery can record them as unknowns.
Non-goals: deciding anything about the topology; the full NVML API.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from topo_tune.errors import NvmlCallError
from topo_tune.security.safe_write import write_file

T = TypeVar("T")

# Remote NVLink device types (nvmlIntNvLinkDeviceType_t).
NVLINK_DEVICE_GPU = 0
NVLINK_DEVICE_IBMNPU = 1
NVLINK_DEVICE_SWITCH = 2
NVLINK_DEVICE_UNKNOWN = 255
NVLINK_CAP_P2P_SUPPORTED = 0
P2P_CAPS_INDEX_READ = 0
P2P_CAPS_INDEX_WRITE = 1
P2P_STATUS_OK = 0
P2P_STATUS_UNKNOWN = 5
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3


class NvmlApi(Protocol):
    """The questions discovery asks NVML. GPUs are NVML indices; bus ids are as NVML prints them."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...
    def device_count(self) -> int: ...
    def uuid(self, gpu: int) -> str: ...
    def name(self, gpu: int) -> str: ...
    def pci_bus_id(self, gpu: int) -> str: ...
    def compute_capability(self, gpu: int) -> tuple[int, int]: ...
    def memory_total(self, gpu: int) -> int: ...
    def pcie_gen_current(self, gpu: int) -> int: ...
    def pcie_gen_max(self, gpu: int) -> int: ...
    def pcie_width_current(self, gpu: int) -> int: ...
    def pcie_width_max(self, gpu: int) -> int: ...
    def numa_node(self, gpu: int) -> int: ...
    def cpu_affinity(self, gpu: int, words: int) -> list[int]: ...
    def nvlink_state(self, gpu: int, link: int) -> int: ...
    def nvlink_p2p_supported(self, gpu: int, link: int) -> int: ...
    def nvlink_remote_bus_id(self, gpu: int, link: int) -> str: ...
    def nvlink_remote_device_type(self, gpu: int, link: int) -> int: ...
    def common_ancestor(self, gpu_a: int, gpu_b: int) -> int: ...
    def p2p_status(self, gpu_a: int, gpu_b: int, caps_index: int) -> int: ...


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlBackend:
    """The real NVML, through NVIDIA's `nvidia-ml-py` bindings (module `pynvml`)."""

    def __init__(self) -> None:
        import pynvml  # noqa: PLC0415 - only machines that run discovery need the library loaded

        self._nvml: Any = pynvml
        self._handles: dict[int, Any] = {}

    def _call(self, call: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._nvml.NVMLError as exc:
            raise NvmlCallError(call, int(exc.value), str(exc)) from exc

    def _handle(self, gpu: int) -> Any:
        if gpu not in self._handles:
            self._handles[gpu] = self._call(
                "nvmlDeviceGetHandleByIndex", lambda: self._nvml.nvmlDeviceGetHandleByIndex(gpu)
            )
        return self._handles[gpu]

    def init(self) -> None:
        self._call("nvmlInit", self._nvml.nvmlInit)

    def shutdown(self) -> None:
        self._call("nvmlShutdown", self._nvml.nvmlShutdown)
        self._handles.clear()

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion", self._nvml.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion", self._nvml.nvmlSystemGetCudaDriverVersion))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", self._nvml.nvmlDeviceGetCount))

    def uuid(self, gpu: int) -> str:
        h = self._handle(gpu)
        return _text(self._call("nvmlDeviceGetUUID", lambda: self._nvml.nvmlDeviceGetUUID(h)))

    def name(self, gpu: int) -> str:
        h = self._handle(gpu)
        return _text(self._call("nvmlDeviceGetName", lambda: self._nvml.nvmlDeviceGetName(h)))

    def pci_bus_id(self, gpu: int) -> str:
        h = self._handle(gpu)
        info = self._call("nvmlDeviceGetPciInfo_v3", lambda: self._nvml.nvmlDeviceGetPciInfo_v3(h))
        return _text(info.busId)

    def compute_capability(self, gpu: int) -> tuple[int, int]:
        h = self._handle(gpu)
        major, minor = self._call(
            "nvmlDeviceGetCudaComputeCapability", lambda: self._nvml.nvmlDeviceGetCudaComputeCapability(h)
        )
        return int(major), int(minor)

    def memory_total(self, gpu: int) -> int:
        h = self._handle(gpu)
        return int(self._call("nvmlDeviceGetMemoryInfo", lambda: self._nvml.nvmlDeviceGetMemoryInfo(h)).total)

    def pcie_gen_current(self, gpu: int) -> int:
        h = self._handle(gpu)
        return int(
            self._call(
                "nvmlDeviceGetCurrPcieLinkGeneration",
                lambda: self._nvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
            )
        )

    def pcie_gen_max(self, gpu: int) -> int:
        h = self._handle(gpu)
        return int(
            self._call("nvmlDeviceGetMaxPcieLinkGeneration", lambda: self._nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
        )

    def pcie_width_current(self, gpu: int) -> int:
        h = self._handle(gpu)
        return int(self._call("nvmlDeviceGetCurrPcieLinkWidth", lambda: self._nvml.nvmlDeviceGetCurrPcieLinkWidth(h)))

    def pcie_width_max(self, gpu: int) -> int:
        h = self._handle(gpu)
        return int(self._call("nvmlDeviceGetMaxPcieLinkWidth", lambda: self._nvml.nvmlDeviceGetMaxPcieLinkWidth(h)))

    def numa_node(self, gpu: int) -> int:
        h = self._handle(gpu)
        return int(self._call("nvmlDeviceGetNumaNodeId", lambda: self._nvml.nvmlDeviceGetNumaNodeId(h)))

    def cpu_affinity(self, gpu: int, words: int) -> list[int]:
        h = self._handle(gpu)
        mask = self._call("nvmlDeviceGetCpuAffinity", lambda: self._nvml.nvmlDeviceGetCpuAffinity(h, words))
        return [int(w) for w in mask]

    def nvlink_state(self, gpu: int, link: int) -> int:
        h = self._handle(gpu)
        return int(self._call("nvmlDeviceGetNvLinkState", lambda: self._nvml.nvmlDeviceGetNvLinkState(h, link)))

    def nvlink_p2p_supported(self, gpu: int, link: int) -> int:
        h = self._handle(gpu)
        return int(
            self._call(
                "nvmlDeviceGetNvLinkCapability",
                lambda: self._nvml.nvmlDeviceGetNvLinkCapability(h, link, NVLINK_CAP_P2P_SUPPORTED),
            )
        )

    def nvlink_remote_bus_id(self, gpu: int, link: int) -> str:
        h = self._handle(gpu)
        info = self._call(
            "nvmlDeviceGetNvLinkRemotePciInfo_v2",
            lambda: self._nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link),
        )
        return _text(info.busId)

    def nvlink_remote_device_type(self, gpu: int, link: int) -> int:
        h = self._handle(gpu)
        return int(
            self._call(
                "nvmlDeviceGetNvLinkRemoteDeviceType",
                lambda: self._nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link),
            )
        )

    def common_ancestor(self, gpu_a: int, gpu_b: int) -> int:
        ha, hb = self._handle(gpu_a), self._handle(gpu_b)
        return int(
            self._call(
                "nvmlDeviceGetTopologyCommonAncestor",
                lambda: self._nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb),
            )
        )

    def p2p_status(self, gpu_a: int, gpu_b: int, caps_index: int) -> int:
        ha, hb = self._handle(gpu_a), self._handle(gpu_b)
        return int(self._call("nvmlDeviceGetP2PStatus", lambda: self._nvml.nvmlDeviceGetP2PStatus(ha, hb, caps_index)))


@dataclass(frozen=True)
class NvmlAnswer:
    """One recorded call: the method, its arguments, and either the result or NVML's error."""

    method: str
    args: tuple[int, ...]
    result: Any = None
    error_code: int | None = None
    error_message: str = ""
    error_call: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "args": list(self.args)}
        if self.error_code is None:
            out["result"] = self.result
        else:
            out["error"] = {"call": self.error_call, "code": self.error_code, "message": self.error_message}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NvmlAnswer:
        error = data.get("error")
        result = data.get("result")
        if isinstance(result, list) and data["method"] == "compute_capability":
            result = tuple(result)
        if error is None:
            return cls(method=data["method"], args=tuple(data["args"]), result=result)
        return cls(
            method=data["method"],
            args=tuple(data["args"]),
            error_code=int(error["code"]),
            error_message=str(error["message"]),
            error_call=str(error.get("call", data["method"])),
        )


_METHODS = tuple(
    name for name in NvmlApi.__dict__ if not name.startswith("_") and callable(getattr(NvmlApi, name, None))
)


class RecordingNvml:
    """Wraps a real `NvmlApi` and keeps every answer, errors included, for a fixture."""

    def __init__(self, inner: NvmlApi) -> None:
        self._inner = inner
        self.answers: list[NvmlAnswer] = []

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method not in _METHODS:
            raise AttributeError(method)
        target = getattr(self._inner, method)

        def call(*args: int) -> Any:
            try:
                result = target(*args)
            except NvmlCallError as exc:
                self.answers.append(
                    NvmlAnswer(
                        method=method,
                        args=tuple(args),
                        error_code=exc.code,
                        error_message=exc.message,
                        error_call=exc.call,
                    )
                )
                raise
            stored = list(result) if isinstance(result, tuple | list) else result
            self.answers.append(NvmlAnswer(method=method, args=tuple(args), result=stored))
            return result

        return call

    def save(self, path: Path) -> None:
        write_file(path, json.dumps([a.to_json() for a in self.answers], indent=1) + "\n")


class ReplayNvml:
    """Answers from a recording. A question that was never recorded is kept in ``missing`` (tests assert it
    stays empty) and answered with an error, so a stale fixture shows up instead of passing silently."""

    def __init__(self, answers: list[NvmlAnswer]) -> None:
        self._answers: dict[tuple[str, tuple[int, ...]], NvmlAnswer] = {}
        for answer in answers:
            self._answers[(answer.method, answer.args)] = answer
        self.missing: list[tuple[str, tuple[int, ...]]] = []

    @classmethod
    def load(cls, path: Path) -> ReplayNvml:
        return cls([NvmlAnswer.from_json(item) for item in json.loads(path.read_text())])

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method not in _METHODS:
            raise AttributeError(method)

        def call(*args: int) -> Any:
            answer = self._answers.get((method, tuple(args)))
            if answer is None:
                self.missing.append((method, tuple(args)))
                raise NvmlCallError(method, -1, "not in the recording")
            if answer.error_code is not None:
                raise NvmlCallError(answer.error_call, answer.error_code, answer.error_message)
            return answer.result

        return call
