"""GPU probe: count, model, driver/CUDA consistency, memory, ECC, row remapping, thermals,
persistence and PCIe width, from NVML; with --deep a matmul and host<->device copies per GPU.

Verdicts:
  count         FAIL fewer GPUs than expected; WARN more.
  model         FAIL a GPU whose name lacks doctor.gpu_model; WARN mixed models.
  driver        FAIL kernel module and NVML library disagree (driver upgraded without reboot) or
                the driver's CUDA major is older than torch's runtime; WARN older minor.
  memory        WARN GPUs of unequal size, or memory/processes already held on a GPU (a leftover
                worker from the last run keeps its memory; the restart will OOM).
  ecc           FAIL volatile uncorrectable ECC errors; WARN ECC off.
  remap         FAIL row-remap failure; WARN a pending remap or retired page (needs a GPU reset).
  thermal       WARN hardware slowdown / thermal / power-brake clock events, or temperature
                within 5 C of the slowdown threshold.
  persistence   WARN persistence mode off (every process pays driver initialisation).
  pcie          WARN a link narrower than the slot's maximum width.
  (--deep) matmul, h2d, d2h: FAIL a GPU that errors or computes non-finite values; WARN a GPU
                below 80 % of the node's median, or copies under 10 GB/s.
"""

from __future__ import annotations

import statistics

from resctl.doctor import deep
from resctl.doctor.context import Context
from resctl.doctor.nvml import Gpu, NvmlUnavailable
from resctl.doctor.result import Check, Skip, Status, gb

SERIOUS_CLOCK_EVENTS = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")
MIN_COPY_GBPS = 10.0


def run(ctx: Context) -> list[Check]:
    try:
        nvml = ctx.nvml()
        driver = nvml.driver()
        gpus = nvml.gpus()
    except NvmlUnavailable as err:
        if ctx.expect.gpus:
            return [Check("count", Status.FAIL, f"{ctx.expect.gpus} GPUs expected but NVML is unavailable: {err}",
                          None, ctx.expect.gpus, "GPUs",
                          "check the NVIDIA driver (nvidia-smi) and that the pod requests nvidia.com/gpu")]
        raise Skip(f"no NVIDIA driver: {err}") from err
    checks = [_count(ctx, gpus)]
    if not gpus:
        return checks
    checks += [_model(ctx, gpus), _driver(ctx, driver.version, driver.cuda), _memory(gpus), _ecc(gpus),
               _remap(gpus), _thermal(gpus), _persistence(gpus), _pcie(gpus)]
    if ctx.deep:
        checks += _deep(ctx)
    return checks


def _count(ctx: Context, gpus: list[Gpu]) -> Check:
    n, want = len(gpus), ctx.expect.gpus
    if want is None:
        return Check("count", Status.PASS, f"{n} GPU(s) visible", n, None, "GPUs")
    if n < want:
        return Check("count", Status.FAIL, f"{n} of {want} GPUs visible", n, want, "GPUs",
                     "a GPU fell off the bus or the pod got fewer: check `nvidia-smi`, dmesg for Xid 79, "
                     "the pod's nvidia.com/gpu request; replace the node")
    if n > want:
        return Check("count", Status.WARN, f"{n} GPUs visible, {want} expected", n, want, "GPUs",
                     "set doctor.gpus (or doctor.instance_type) to this node's GPU count")
    return Check("count", Status.PASS, f"{n} GPUs", n, want, "GPUs")


def _model(ctx: Context, gpus: list[Gpu]) -> Check:
    names = sorted({g.name for g in gpus})
    want = ctx.expect.gpu_model
    wrong = [g for g in gpus if want and want.lower() not in g.name.lower()]
    if wrong:
        return Check("model", Status.FAIL, f"GPU {wrong[0].index} is {wrong[0].name}, expected a {want}",
                     ", ".join(names), want, "", "schedule on the right instance type or set doctor.gpu_model")
    if len(names) > 1:
        return Check("model", Status.WARN, f"mixed GPU models: {', '.join(names)}", ", ".join(names), want or None,
                     "", "ranks on slower GPUs set the pace; use identical GPUs")
    return Check("model", Status.PASS, names[0], names[0], want or None)


def _driver(ctx: Context, version: str, cuda: int | None) -> Check:
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "?"
    measured = f"{version} (CUDA {cuda_text})"
    module = ctx.read("/proc/driver/nvidia/version")
    if module is not None and version not in module:
        loaded = module.split("Kernel Module", 1)[-1].split()[0] if "Kernel Module" in module else module.strip()[:60]
        return Check("driver", Status.FAIL, f"NVML library {version} but kernel module {loaded}", measured, loaded,
                     "", "the driver was upgraded without reloading the module: reboot the node")
    rt = ctx.cuda_runtime
    if rt and cuda:
        have = (cuda // 1000, cuda % 1000 // 10)
        need = f"{rt[0]}.{rt[1]}"
        if have[0] < rt[0]:
            return Check("driver", Status.FAIL, f"driver supports CUDA {cuda_text}, torch needs CUDA {need}",
                         measured, f"CUDA >= {need}", "", "install a newer driver or a torch built for CUDA "
                         f"{have[0]}.x")
        if have < rt:
            return Check("driver", Status.WARN, f"driver supports CUDA {cuda_text}, torch was built for {need} "
                         "(minor-version compatibility; PTX JIT of newer kernels fails)", measured, f"CUDA >= {need}",
                         "", "update the driver to one that supports the runtime's CUDA version")
        return Check("driver", Status.PASS, f"driver {version}, CUDA {cuda_text} >= torch's {need}", measured,
                     f"CUDA >= {need}")
    return Check("driver", Status.PASS, f"driver {version}, CUDA {cuda_text}", measured)


def _memory(gpus: list[Gpu]) -> Check:
    totals = [g.memory_total for g in gpus if g.memory_total]
    if not totals:
        return Check("memory", Status.SKIP, "NVML reports no memory size")
    big = max(totals)
    small = [g for g in gpus if g.memory_total and g.memory_total < 0.97 * big]
    if small:
        return Check("memory", Status.WARN, f"GPU {small[0].index} has {gb(small[0].memory_total or 0)} GB, "
                     f"others {gb(big)} GB", gb(min(totals)), gb(big), "GB",
                     "a GPU in MIG mode or with retired memory: check `nvidia-smi -q -d MEMORY`")
    busy = [g for g in gpus if (g.processes or 0) > 0 or (g.memory_used or 0) > 2e9]
    if busy:
        g = busy[0]
        return Check("memory", Status.WARN, f"GPU {g.index} already has {gb(g.memory_used or 0)} GB in use"
                     f" ({g.processes or 0} process(es)): a stale worker?", gb(g.memory_used or 0), 0, "GB",
                     "kill the leftover processes (`nvidia-smi --query-compute-apps=pid --format=csv`)")
    return Check("memory", Status.PASS, f"{len(totals)} x {gb(big)} GB, none in use", gb(big), None, "GB")


def _ecc(gpus: list[Gpu]) -> Check:
    bad = [g for g in gpus if (g.ecc_uncorrectable_volatile or 0) > 0]
    if bad:
        detail = ", ".join(f"GPU {g.index}: {g.ecc_uncorrectable_volatile}" for g in bad)
        return Check("ecc", Status.FAIL, f"volatile uncorrectable ECC errors ({detail})",
                     sum(g.ecc_uncorrectable_volatile or 0 for g in bad), 0, "errors",
                     "drain the node: reset the GPU (nvidia-smi -r) or replace it")
    off = [g for g in gpus if g.ecc_enabled is False]
    if off:
        return Check("ecc", Status.WARN, f"ECC disabled on GPU {', '.join(str(g.index) for g in off)}",
                     "off", "on", "", "nvidia-smi -e 1 and reboot")
    if all(g.ecc_uncorrectable_volatile is None for g in gpus):
        return Check("ecc", Status.PASS, "ECC counters not reported by this GPU", None, 0, "errors")
    return Check("ecc", Status.PASS, "no uncorrectable ECC errors", 0, 0, "errors")


def _remap(gpus: list[Gpu]) -> Check:
    failed = [g.index for g in gpus if g.remap_failure]
    if failed:
        return Check("remap", Status.FAIL, f"row-remap failure on GPU {', '.join(map(str, failed))}",
                     "failure", "none", "", "the GPU has run out of spare rows: replace it")
    pending = [g.index for g in gpus if g.remap_pending or g.retired_pages_pending]
    if pending:
        return Check("remap", Status.WARN, f"row remap / page retirement pending on GPU {', '.join(map(str, pending))}",
                     "pending", "none", "", "reset the GPU (nvidia-smi -r) or reboot before training")
    return Check("remap", Status.PASS, "no pending row remaps or retired pages", "none", "none")


def _thermal(gpus: list[Gpu]) -> Check:
    for g in gpus:
        serious = [e for e in g.clock_events if e in SERIOUS_CLOCK_EVENTS]
        if serious:
            return Check("thermal", Status.WARN, f"GPU {g.index} clocks held down: {', '.join(serious)}",
                         g.temperature_c, None, "C", "check cooling and power; a slow GPU sets every rank's pace")
    hot = [g for g in gpus if g.temperature_c is not None and g.slowdown_temp_c and
           g.temperature_c >= g.slowdown_temp_c - 5]
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    if hot:
        g = hot[0]
        return Check("thermal", Status.WARN, f"GPU {g.index} at {g.temperature_c} C, slowdown at {g.slowdown_temp_c} C",
                     g.temperature_c, f"< {g.slowdown_temp_c - 5}" if g.slowdown_temp_c else None, "C",
                     "check cooling before a long run")
    if not temps:
        return Check("thermal", Status.PASS, "no temperature reported; no slowdown reasons")
    return Check("thermal", Status.PASS, f"max {max(temps)} C, no slowdown", max(temps), None, "C")


def _persistence(gpus: list[Gpu]) -> Check:
    off = [g.index for g in gpus if g.persistence is False]
    if off:
        return Check("persistence", Status.WARN, f"persistence mode off on GPU {', '.join(map(str, off))}", "off",
                     "on", "", "run nvidia-persistenced (or nvidia-smi -pm 1) so restarts skip driver init")
    return Check("persistence", Status.PASS, "persistence mode on" if any(g.persistence for g in gpus)
                 else "persistence mode not reported", "on" if any(g.persistence for g in gpus) else None)


def _pcie(gpus: list[Gpu]) -> Check:
    # link generation drops at idle to save power, so only the width says the link is degraded
    narrow = [g for g in gpus if g.pcie_width and g.pcie_width_max and g.pcie_width < g.pcie_width_max]
    if narrow:
        g = narrow[0]
        return Check("pcie", Status.WARN, f"GPU {g.index} PCIe link x{g.pcie_width} of x{g.pcie_width_max}",
                     g.pcie_width, g.pcie_width_max, "lanes", "reseat the GPU or replace the node")
    widths = [g.pcie_width for g in gpus if g.pcie_width]
    if not widths:
        return Check("pcie", Status.PASS, "PCIe width not reported")
    return Check("pcie", Status.PASS, f"x{min(widths)} on every GPU", min(widths), None, "lanes")


def _deep(ctx: Context) -> list[Check]:
    try:
        results = deep.per_gpu(ctx.cancel)
    except deep.Unavailable as err:
        return [Check(name, Status.SKIP, str(err)) for name in ("matmul", "h2d", "d2h")]
    checks = []
    for name, attr, unit in (("matmul", "tflops", "TFLOP/s"), ("h2d", "h2d_gbps", "GB/s"), ("d2h", "d2h_gbps", "GB/s")):
        errors = [r for r in results if r.error]
        if errors:
            checks.append(Check(name, Status.FAIL, f"GPU {errors[0].index}: {errors[0].error}", None, None, unit,
                                "drain the node; check dmesg for Xid errors"))
            continue
        values = [getattr(r, attr) for r in results]
        median = statistics.median(values)
        slow = [(r.index, v) for r, v in zip(results, values) if v < 0.8 * median]
        per = ", ".join(f"{r.index}:{v:.1f}" for r, v in zip(results, values))
        if slow:
            checks.append(Check(name, Status.WARN, f"GPU {slow[0][0]} at {slow[0][1]:.1f} {unit}, node median "
                                f"{median:.1f} ({per})", round(min(values), 2), f">= {0.8 * median:.1f}", unit,
                                "a straggler GPU slows every rank: check clocks, PCIe and cooling"))
        elif unit == "GB/s" and min(values) < MIN_COPY_GBPS:
            checks.append(Check(name, Status.WARN, f"{min(values):.1f} GB/s ({per}): PCIe link degraded?",
                                round(min(values), 2), f">= {MIN_COPY_GBPS}", unit,
                                "check the PCIe link (nvidia-smi -q -d PCI) and the NUMA placement"))
        else:
            checks.append(Check(name, Status.PASS, f"per GPU: {per} {unit}", round(min(values), 2), None, unit))
    return checks
