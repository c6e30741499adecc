"""On a machine with NVIDIA GPUs: does swarm see them, and does a task see only its own?

1. NVML discovery through swarm.runtime.gpu.discover (count, UUIDs, memory, topology).
2. A real agent (NVML inventory) runs a task with `--gpu 100`; the task asks the CUDA
   driver API (libcuda via ctypes, no framework needed) how many devices it sees and
   their UUIDs: exactly one, the one swarm assigned.
3. With two or more GPUs, two concurrent whole-GPU tasks see two different devices.

Without NVML or a driver it says so, writes the reason to the JSON and exits 0: this
check needs a GPU machine and is not part of `make test`.
Writes bench/results/gpu_check.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.localcluster import LocalAgent
from swarm.runtime.gpu import discover

HERE = Path(__file__).resolve().parent

# Runs inside the task: prints what the CUDA driver shows this process.
CUDA_PROBE = r"""
import ctypes, json, os
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
n = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(n)) == 0
uuids = []
for i in range(n.value):
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    raw = (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGetUuid(ctypes.byref(raw), dev)
    h = bytes(raw).hex()
    uuids.append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
print(json.dumps({"count": n.value, "uuids": uuids,
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""


def main() -> int:
    out = HERE / "results" / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    inv = discover(None, "gpu-check")
    res: dict[str, Any] = {"source": inv.source, "note": inv.note, "devices": []}
    if not inv.devices:
        res["result"] = f"skipped: no GPU machine here ({inv.note or 'no devices'})"
        print(res["result"])
        out.write_text(json.dumps(res, indent=2))
        return 0
    res["devices"] = [
        {"index": d.index, "uuid": d.uuid, "memory": d.memory_bytes, "nvlink": d.nvlink_group}
        for d in inv.devices
    ]
    print(f"NVML: {len(inv.devices)} device(s): " + ", ".join(d.uuid for d in inv.devices))
    with tempfile.TemporaryDirectory(prefix="swg-") as d:
        agent = LocalAgent(
            Path(d), "gpu", ["--insecure", "--no-mdns", "--port", "0", "--profile", "local"]
        ).start()
        try:
            with agent.client() as c:
                n = min(2, len(inv.devices))
                ids = [
                    c.submit(
                        [sys.executable, "-c", CUDA_PROBE],
                        cwd="/",
                        gpu={"core": 100, "memory_ratio": 100},
                    )
                    for _ in range(n)
                ]
                seen = []
                for tid in ids:
                    t = c.wait(tid, timeout=300)
                    text = b"".join(c.logs(tid)).decode().strip()
                    if t["state"] != "succeeded":
                        err = b"".join(c.logs(tid, stderr=True)).decode()
                        raise SystemExit(f"probe task failed: {t['reason']}\n{err}")
                    seen.append(json.loads(text.splitlines()[-1]))
        finally:
            agent.stop()
    res["tasks"] = seen
    ok = all(s["count"] == 1 and s["uuids"] == [s["visible"]] for s in seen)
    distinct = len({s["uuids"][0] for s in seen}) == len(seen)
    res["result"] = "pass" if ok and distinct else "FAIL"
    for s in seen:
        print(f"task saw {s['count']} device(s): {s['uuids']} (assigned {s['visible']})")
    print(f"result: {res['result']}")
    out.write_text(json.dumps(res, indent=2))
    return 0 if res["result"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
