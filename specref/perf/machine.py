"""What a measurement ran on, in words: the CPU model (or the CUDA device), for benchmark records.

Rule: on CUDA, the device's name; on a CPU, the "Model name" line of `lscpu` (Linux), else
`platform.processor()`, else `platform.machine()` (e.g. "x86_64"). Speed figures are only
comparable on the same machine, so every benchmark result records this string.

`MACHINES` are the machines exercise 1 names, as data sheets give them: dense bf16 peak FLOP/s, memory
bandwidth in bytes/s, and the share of the peak that matrix products sustain (40 % on an H100 is
`specref.perf`'s default assumption).
"""

from __future__ import annotations

import platform
import subprocess

import torch

MACHINES: dict[str, dict[str, float]] = {
    "H100": {"peak_flops": 990e12, "bandwidth": 3.35e12, "efficiency": 0.4},
    "A100": {"peak_flops": 312e12, "bandwidth": 2.0e12, "efficiency": 0.6},
    "laptop CPU": {"peak_flops": 100e9, "bandwidth": 20e9, "efficiency": 0.8},
}


def machine_name(device: torch.device | str = "cpu") -> str:
    """The device's name if it is a CUDA device, else the CPU's model name (see the module docstring)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10).stdout.splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("Model name"))
    except (OSError, subprocess.SubprocessError, StopIteration):
        return platform.processor() or platform.machine() or "unknown"
