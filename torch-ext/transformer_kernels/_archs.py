"""Whether this build has machine code for the GPUs present: a build lists its archs in metadata.json
(``backend.archs``, e.g. ``["10.0", "12.0+PTX", "7.5", "8.0", "8.6", "9.0"]``). A GPU runs the SASS of
its own major version and a lower or equal minor (an 8.6 cubin runs on an 8.9 GPU), and the PTX of
any capability up to its own (compiled at load). Elsewhere every kernel launch would fail with CUDA's
"no kernel image is available"; the package warns once at import instead, naming what the build has."""

import json
import warnings
from pathlib import Path
from typing import Optional, Sequence, Tuple

import torch


def _capability(arch: str) -> Tuple[int, int]:
    major, minor = arch.split("+")[0].split(".")
    return int(major), int(minor)


def runs_on(archs: Sequence[str], capability: Tuple[int, int]) -> bool:
    """Whether a build of `archs` has code a GPU of `capability` (major, minor) runs."""
    for arch in archs:
        major, minor = _capability(arch)
        if arch.endswith("+PTX") and (major, minor) <= capability:
            return True
        if major == capability[0] and minor <= capability[1]:
            return True
    return False


def unsupported_device_message(archs: Sequence[str], name: str, capability: Tuple[int, int]) -> Optional[str]:
    if runs_on(archs, capability):
        return None
    return (f"transformer-kernels: this build has no code for the GPU {name} (compute capability "
            f"{capability[0]}.{capability[1]}): it was built for {', '.join(sorted(archs, key=_capability))}, "
            "so its kernels will fail to launch there (\"no kernel image is available\"). Use a build that "
            "includes this GPU's arch (tools/build_kernel.py --archs native builds for the GPU present)")


def warn_for_unsupported_devices() -> None:
    """One warning per visible GPU this build cannot run on (nothing without CUDA or metadata.json)."""
    metadata = Path(__file__).resolve().parent / "metadata.json"
    if not metadata.is_file() or not torch.cuda.is_available():
        return
    archs = json.loads(metadata.read_text()).get("backend", {}).get("archs") or []
    for index in range(torch.cuda.device_count()):
        message = unsupported_device_message(archs, torch.cuda.get_device_name(index),
                                             torch.cuda.get_device_capability(index))
        if message:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
