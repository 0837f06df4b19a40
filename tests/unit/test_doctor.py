"""resctl doctor probes against fake nodes (tests/fixtures/nodes) and fake NVML adapters: exact verdicts."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import pytest

from resctl.doctor import make_context, run, select
from resctl.doctor.context import Context
from resctl.doctor.expectations import resolve as expectations
from resctl.doctor.nvml import DriverInfo, Gpu, NvLink, NvmlUnavailable, SnapshotNvml
from resctl.doctor.result import Report, Status
from resctl.doctor.storage import Cancelled, find_mount, measure
from resctl.errors import UsageError
from resctl.profile.load import resolve

REPO = Path(__file__).resolve().parents[2]
NODES = REPO / "tests" / "fixtures" / "nodes"
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "PATH": "/usr/bin"}
BASE_SETS = ("checkpoint.dir=/fsx/checkpoints", "doctor.checkpoint_size_gb=100", "doctor.storage_test_mb=4")
# dns and clock read the live host whatever the root; they have their own tests below
NODE_PROBES = ("gpu", "nvlink", "efa", "storage", "shm", "memlock", "env", "memory")

HEALTHY = {
    "gpu.count": "PASS", "gpu.model": "PASS", "gpu.driver": "PASS", "gpu.memory": "PASS", "gpu.ecc": "PASS",
    "gpu.remap": "PASS", "gpu.thermal": "PASS", "gpu.persistence": "PASS", "gpu.pcie": "PASS",
    "nvlink.links": "PASS", "nvlink.errors": "PASS",
    "efa.devices": "PASS", "efa.ports": "PASS", "efa.uverbs": "PASS", "efa.fi_info": "SKIP", "efa.env": "PASS",
    "storage.mount": "PASS", "storage.space": "PASS", "storage.write": "PASS", "storage.read": "PASS",
    "storage.lustre": "PASS",
    "shm.size": "PASS", "shm.free": "PASS",
    "memlock.limit": "PASS",
    "env.nvls": "PASS", "env.async-errors": "PASS", "env.transports": "PASS",
    "memory.available": "PASS",
}


def node(name: str, tmp_path: Path) -> Path:
    """A copy of p5-healthy with the variant's files laid over it (the storage test writes into it)."""
    root = tmp_path / name
    shutil.copytree(NODES / "p5-healthy", root)
    if name != "p5-healthy":
        shutil.copytree(NODES / name, root, dirs_exist_ok=True)
    return root


def context(root: Path, tmp_path: Path, *sets: str, env: dict[str, str] | None = None,
            nvml: Any = None) -> Context:
    profile = resolve(None, env={}, sets=[*BASE_SETS, *sets], cwd=tmp_path).profile
    explicit = frozenset(s.split("=", 1)[0] for s in (*BASE_SETS, *sets))
    ctx = make_context(profile, root=root, env=EFA_ENV if env is None else env,
                       nvml_factory=(lambda: nvml) if nvml is not None else None, explicit=explicit)
    ctx.cuda_runtime = (12, 4)  # independent of the torch installed here
    return ctx


def doctor(root: Path, tmp_path: Path, *sets: str, only: Sequence[str] = NODE_PROBES, **kw: Any) -> Report:
    return run(context(root, tmp_path, *sets, **kw), select(only))


def verdicts(report: Report) -> dict[str, str]:
    out = {f"{p.probe}.{c.name}": c.status.value for p in report.probes for c in p.checks}
    # O_DIRECT works where the test's temp dir is on a disk, not on tmpfs: either is right
    assert out.pop("storage.direct", "PASS") in ("PASS", "SKIP")
    return out


def check(report: Report, key: str) -> Any:
    probe, name = key.split(".")
    return next(c for p in report.probes if p.probe == probe for c in p.checks if c.name == name)


# --- the fixture nodes -----------------------------------------------------------------------------


def test_healthy_p5_passes_everything(tmp_path: Path) -> None:
    report = doctor(node("p5-healthy", tmp_path), tmp_path)
    assert verdicts(report) == HEALTHY
    assert report.exit_code() == 0 and report.exit_code(strict=True) == 0
    assert check(report, "gpu.count").measured == 8 and check(report, "gpu.count").expected == 8
    assert check(report, "nvlink.links").measured == 18 and check(report, "efa.devices").measured == 32
    assert check(report, "storage.mount").measured == "lustre"
    assert check(report, "storage.space").expected == 300  # 100 GB x (keep_last 2 + 1)
    assert report.expectations["instance_type"] == "p5.48xlarge"
    assert report.expectations["sources"]["nvlinks_per_gpu"] == "p5.48xlarge defaults"
    assert not list((tmp_path / "p5-healthy" / "fsx" / "checkpoints").glob(".resctl-doctor-*")), "test files left"


@pytest.mark.parametrize("name, changed", [
    ("p5-efa-port-down", {"efa.ports": "FAIL"}),
    ("p5-missing-gpu", {"gpu.count": "FAIL"}),
    ("p5-nvlink-degraded", {"nvlink.links": "FAIL", "nvlink.errors": "WARN"}),
    ("p5-disk-full", {"storage.space": "FAIL", "storage.write": "SKIP", "storage.read": None}),
    ("p5-tiny-shm", {"shm.size": "FAIL", "shm.free": None}),
])
def test_broken_nodes(tmp_path: Path, name: str, changed: dict[str, str | None]) -> None:
    report = doctor(node(name, tmp_path), tmp_path)
    want = {**HEALTHY, **changed}
    assert verdicts(report) == {k: v for k, v in want.items() if v is not None}
    assert report.exit_code() == 1


def test_broken_node_messages_name_the_culprit(tmp_path: Path) -> None:
    efa = doctor(node("p5-efa-port-down", tmp_path), tmp_path, only=["efa"])
    assert "rdmap19s0/1 (DOWN)" in check(efa, "efa.ports").message and check(efa, "efa.ports").measured == 31
    nv = doctor(node("p5-nvlink-degraded", tmp_path), tmp_path, only=["nvlink"])
    links = check(nv, "nvlink.links")
    assert links.measured == 16 and links.expected == 18 and "GPU 5: 16/18" in links.message and "5.16" in links.message
    assert "GPU 5 link 3: replay 1250, recovery 3" in check(nv, "nvlink.errors").message
    gpu = doctor(node("p5-missing-gpu", tmp_path), tmp_path, only=["gpu"])
    assert check(gpu, "gpu.count").message == "7 of 8 GPUs visible" and check(gpu, "gpu.count").fix
    disk = doctor(node("p5-disk-full", tmp_path), tmp_path, only=["storage"])
    assert check(disk, "storage.space").measured == 0.5 and check(disk, "storage.space").expected == 300
    shm = doctor(node("p5-tiny-shm", tmp_path), tmp_path, only=["shm"])
    assert check(shm, "shm.size").measured == 0.07 and "emptyDir" in check(shm, "shm.size").fix


# --- probe logic with hand-made inputs -------------------------------------------------------------


class FakeNvml:
    def __init__(self, gpus: list[Gpu], version: str = "550.127.05", cuda: int = 12040, delay: float = 0) -> None:
        self._gpus, self._driver, self.delay = gpus, DriverInfo(version, cuda), delay

    def driver(self) -> DriverInfo:
        time.sleep(self.delay)
        return self._driver

    def gpus(self) -> list[Gpu]:
        time.sleep(self.delay)
        return self._gpus


def p5_gpus(tmp_path: Path) -> list[Gpu]:
    return SnapshotNvml(NODES / "p5-healthy" / "nvml.json").gpus()


@pytest.mark.parametrize("change, key, status", [
    ({"ecc_uncorrectable_volatile": 2}, "gpu.ecc", "FAIL"),
    ({"ecc_enabled": False}, "gpu.ecc", "WARN"),
    ({"remap_pending": True}, "gpu.remap", "WARN"),
    ({"remap_failure": True}, "gpu.remap", "FAIL"),
    ({"clock_events": ("hw_thermal",)}, "gpu.thermal", "WARN"),
    ({"temperature_c": 84}, "gpu.thermal", "WARN"),
    ({"persistence": False}, "gpu.persistence", "WARN"),
    ({"pcie_width": 8}, "gpu.pcie", "WARN"),
    ({"memory_used": 30_000_000_000, "processes": 1}, "gpu.memory", "WARN"),
    ({"name": "NVIDIA A100-SXM4-80GB"}, "gpu.model", "FAIL"),
])
def test_gpu_faults(tmp_path: Path, change: dict[str, Any], key: str, status: str) -> None:
    gpus = p5_gpus(tmp_path)
    gpus[2] = dataclasses.replace(gpus[2], **change)
    report = doctor(node("p5-healthy", tmp_path), tmp_path, only=["gpu"], nvml=FakeNvml(gpus))
    got = verdicts(report)
    assert got[key] == status and "GPU 2" in check(report, key).message
    assert all(v == "PASS" for k, v in got.items() if k != key)


def test_driver_consistency(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    gpus = p5_gpus(tmp_path)
    stale = doctor(root, tmp_path, only=["gpu"], nvml=FakeNvml(gpus, version="560.35.03"))
    assert check(stale, "gpu.driver").status == Status.FAIL and "kernel module 550.127.05" in check(stale, "gpu.driver").message
    (root / "proc/driver/nvidia/version").unlink()
    old = doctor(root, tmp_path, only=["gpu"], nvml=FakeNvml(gpus, cuda=11080))
    assert check(old, "gpu.driver").status == Status.FAIL and "torch needs CUDA 12.4" in check(old, "gpu.driver").message
    minor = doctor(root, tmp_path, only=["gpu"], nvml=FakeNvml(gpus, cuda=12020))
    assert check(minor, "gpu.driver").status == Status.WARN


def test_nvml_unavailable_fails_only_when_gpus_expected(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    (root / "nvml.json").unlink()
    report = doctor(root, tmp_path, only=["gpu", "nvlink"])
    assert verdicts(report) == {"gpu.count": "FAIL", "nvlink.-": "SKIP"}
    assert "no NVML snapshot" in check(report, "gpu.count").message
    (root / "sys/devices/virtual/dmi/id/product_name").write_text("m7i.large\n")
    report = doctor(root, tmp_path, only=["gpu", "nvlink", "efa"])
    assert {p.probe: p.status.value for p in report.probes} == {"gpu": "SKIP", "nvlink": "SKIP", "efa": "PASS"}


def test_single_gpu_without_nvlink_skips(tmp_path: Path) -> None:
    gpu = dataclasses.replace(p5_gpus(tmp_path)[0], name="NVIDIA H200", nvlinks=())
    root = node("p5-healthy", tmp_path)
    report = doctor(root, tmp_path, "doctor.instance_type=none", only=["nvlink"], nvml=FakeNvml([gpu]))
    assert verdicts(report) == {"nvlink.-": "SKIP"} and "no NVLink on NVIDIA H200" in report.probes[0].checks[0].message


def test_real_h200_snapshot(tmp_path: Path) -> None:
    """The NVML view recorded on the GPU machine (one H200, no NVLink) through the same probes."""
    root = tmp_path / "h200"
    root.mkdir()
    shutil.copy(NODES / "h200-single" / "nvml.json", root / "nvml.json")
    report = doctor(root, tmp_path, only=["gpu", "nvlink"])
    assert verdicts(report) == {**{k: "PASS" for k in HEALTHY if k.startswith("gpu.")}, "nvlink.-": "SKIP"}
    assert check(report, "gpu.model").measured == "NVIDIA H200" and check(report, "gpu.memory").measured == 150.75
    assert check(report, "gpu.driver").measured == "580.159.04 (CUDA 13.0)"
    p5e = doctor(root, tmp_path, "doctor.instance_type=p5e.48xlarge", only=["gpu", "nvlink"])
    assert check(p5e, "gpu.count").message == "1 of 8 GPUs visible" and check(p5e, "gpu.model").status == Status.PASS
    assert check(p5e, "nvlink.links").status == Status.FAIL  # 0 of 18 expected links


def test_hung_driver_call_times_out(tmp_path: Path) -> None:
    t0 = time.monotonic()
    report = doctor(node("p5-healthy", tmp_path), tmp_path, "doctor.timeout=0.3", only=["gpu", "shm"],
                    nvml=FakeNvml(p5_gpus(tmp_path), delay=30))
    assert time.monotonic() - t0 < 15, "the doctor waited for the hung call (30 s) instead of its deadline"
    gpu = report.probes[0]
    assert gpu.timed_out and gpu.status == Status.FAIL and "did not finish within 0.3s" in gpu.checks[0].message
    assert report.probes[1].status == Status.PASS


def test_probe_crash_is_a_fail_not_a_traceback(tmp_path: Path) -> None:
    class Broken(FakeNvml):
        def gpus(self) -> list[Gpu]:
            raise RuntimeError("boom")

    report = doctor(node("p5-healthy", tmp_path), tmp_path, only=["gpu"], nvml=Broken([]))
    assert verdicts(report) == {"gpu.-": "FAIL"} and "RuntimeError: boom" in report.probes[0].checks[0].message


def test_efa_env_and_memlock(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    assert check(doctor(root, tmp_path, only=["efa"], env={}), "efa.env").status == Status.WARN
    assert check(doctor(root, tmp_path, only=["efa"], env={"FI_PROVIDER": "tcp"}), "efa.env").status == Status.FAIL
    (root / "proc/self/limits").write_text("Max locked memory         65536                unlimited            bytes\n")
    limit = check(doctor(root, tmp_path, only=["memlock"]), "memlock.limit")
    assert limit.status == Status.FAIL and limit.measured == "0.0625 MiB" and "suffices" in limit.fix
    shutil.rmtree(root / "sys/class/infiniband")
    report = doctor(root, tmp_path, "doctor.instance_type=none", only=["memlock"])
    assert check(report, "memlock.limit").status == Status.PASS


def test_nccl_env_with_inprocess_restart(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    on = "inprocess.enabled=true"
    # unset: the plan sets NCCL_NVLS_ENABLE=0 for the workers, and doctor judges their environment
    planned = check(doctor(root, tmp_path, on, only=["env"]), "env.nvls")
    assert planned.status == Status.PASS and "set by resctl" in planned.message
    forced = check(doctor(root, tmp_path, on, only=["env"], env={**EFA_ENV, "NCCL_NVLS_ENABLE": "1"}), "env.nvls")
    assert forced.status == Status.FAIL and "NCCL_NVLS_ENABLE=1" in forced.message  # the plan keeps a user's value
    in_profile = doctor(root, tmp_path, on, 'launch.env={NCCL_NVLS_ENABLE="1"}', only=["env"])
    assert check(in_profile, "env.nvls").status == Status.FAIL  # the profile's launch.env counts
    ok = doctor(root, tmp_path, on, 'launch.env={NCCL_NVLS_ENABLE="0"}', only=["env"])
    assert check(ok, "env.nvls").status == Status.PASS
    bad = doctor(root, tmp_path, only=["env"], env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_P2P_DISABLE": "1",
                                                   "CUDA_VISIBLE_DEVICES": "0,1"})
    assert {k: v for k, v in verdicts(bad).items()} == {"env.nvls": "PASS", "env.async-errors": "WARN",
                                                         "env.transports": "WARN", "env.visible": "WARN"}


def test_storage_needs(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    slow = doctor(root, tmp_path, "doctor.min_storage_gbps=1000", only=["storage"])
    assert check(slow, "storage.write").status == Status.FAIL and check(slow, "storage.write").expected == 1000
    cadence = doctor(root, tmp_path, "doctor.checkpoint_size_gb=1000", "doctor.checkpoint_every=1s",
                     only=["storage"])
    assert check(cadence, "storage.write").status == Status.FAIL
    assert "1000 GB every 1 s" in check(cadence, "storage.write").message
    off = doctor(root, tmp_path, "doctor.storage_test_mb=0", only=["storage"])
    assert check(off, "storage.write").status == Status.SKIP
    missing = doctor(root, tmp_path, "checkpoint.dir=/fsx/checkpoints/run7/new", only=["storage"])
    assert "does not exist yet; tested /fsx/checkpoints" in check(missing, "storage.mount").message
    (root / "sys/fs/lustre/health_check").write_text("NOT HEALTHY\n")
    assert check(doctor(root, tmp_path, only=["storage"]), "storage.lustre").status == Status.FAIL
    local = doctor(root, tmp_path, "checkpoint.dir=/", "launch.nnodes=4", only=["storage"])
    assert check(local, "storage.mount").status == Status.WARN  # overlay root for a 4-node job


def test_memory_vs_checkpoint_size(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    assert check(doctor(root, tmp_path, "doctor.checkpoint_size_gb=5000", only=["memory"]),
                 "memory.available").status == Status.FAIL
    assert check(doctor(root, tmp_path, "doctor.checkpoint_size_gb=1500", only=["memory"]),
                 "memory.available").status == Status.WARN


def test_dns_and_clock_on_this_host(tmp_path: Path) -> None:
    report = doctor(node("p5-healthy", tmp_path), tmp_path, only=["dns", "clock"])
    got = verdicts(report)
    assert got["dns.rendezvous"] == "PASS" and got["clock.wall"] == "PASS" and got["clock.sync"] == "SKIP"
    bad = doctor(node("p5-healthy", tmp_path / "b"), tmp_path, "launch.rdzv_endpoint=no-such-host.invalid:29500",
                 only=["dns"])
    assert check(bad, "dns.rendezvous").status == Status.FAIL and "no-such-host.invalid" in check(bad, "dns.rendezvous").message


# --- expectations, selection, helpers --------------------------------------------------------------


def test_expectations_layering(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    p = resolve(None, env={}, sets=["doctor.nvlinks_per_gpu=12"], cwd=tmp_path).profile
    e = expectations(p, root)
    assert (e.gpus, e.gpu_model, e.nvlinks_per_gpu, e.efa_devices) == (8, "H100", 12, 32)
    assert e.sources == {"gpus": "p5.48xlarge defaults", "gpu_model": "p5.48xlarge defaults",
                         "nvlinks_per_gpu": "profile", "efa_devices": "p5.48xlarge defaults"}
    p = resolve(None, env={}, sets=["doctor.instance_type=p5en.48xlarge", "doctor.gpu_model="], cwd=tmp_path).profile
    e = expectations(p, root, frozenset({"doctor.gpu_model"}))
    assert (e.efa_devices, e.gpu_model, e.instance_source) == (16, "", "profile")
    p = resolve(None, env={}, sets=["doctor.checkpoint_size_gb=50", "doctor.checkpoint_every=100s",
                                    "doctor.min_storage_gbps=0.2"], cwd=tmp_path).profile
    assert expectations(p, tmp_path).needed_storage_gbps == 0.5
    assert expectations(p, tmp_path).instance_source == "none"


def test_select() -> None:
    assert select() == ["gpu", "nvlink", "efa", "storage", "shm", "memlock", "env", "dns", "clock", "memory", "grace"]
    assert select(["shm", "gpu"], ["gpu"]) == ["shm"]
    with pytest.raises(UsageError, match="did you mean storage"):
        select(["storge"])
    with pytest.raises(UsageError, match="no probe"):
        select(["gpu"], ["gpu"])


def test_find_mount_longest_prefix() -> None:
    text = "overlay / overlay rw 0 0\nfs:/x /fsx lustre rw 0 0\nfs:/y /fsx/sub\\040dir nfs4 rw 0 0\n"
    assert find_mount(text, "/fsx/ckpt").fstype == "lustre"  # type: ignore[union-attr]
    assert find_mount(text, "/fsx/sub dir/a").fstype == "nfs4"  # type: ignore[union-attr]
    assert find_mount(text, "/fsxother").fstype == "overlay"  # type: ignore[union-attr]


def test_measure_writes_reads_and_cleans_up(tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    result = measure(tmp_path, 3_000_000, 3, lambda *a: seen.append(a))
    assert result.bytes == 3 * 1003520 and result.writers == 3  # whole 4 KiB blocks per writer
    assert result.write_gbps > 0 and result.read_gbps > 0
    assert ("read", result.bytes, result.bytes) in seen and ("write", result.bytes, result.bytes) in seen
    if result.direct_gbps is not None:
        assert seen[-1] == ("write O_DIRECT", result.bytes, result.bytes)
    assert list(tmp_path.iterdir()) == []
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        measure(tmp_path, 3_000_000, 3, cancel=cancel)
    assert list(tmp_path.iterdir()) == []


def test_snapshot_round_trip(tmp_path: Path) -> None:
    from resctl.doctor.nvml import snapshot

    nv = SnapshotNvml(NODES / "p5-healthy" / "nvml.json")
    (tmp_path / "n.json").write_text(json.dumps(snapshot(nv)))
    again = SnapshotNvml(tmp_path / "n.json")
    assert again.gpus() == nv.gpus() and again.driver() == nv.driver()
    assert again.gpus()[0].nvlinks[0] == NvLink(0, True, 0, 0, 0)
    with pytest.raises(NvmlUnavailable):
        SnapshotNvml(tmp_path / "missing.json")


def test_shm_against_the_memory_tier(tmp_path: Path) -> None:
    root = node("p5-healthy", tmp_path)
    plain = doctor(root, tmp_path, only=["shm"])
    assert "shm.memory_tier" not in verdicts(plain)  # memory_every = 0: nothing to check
    unknown = doctor(root, tmp_path, "checkpoint.memory_every=1", "doctor.checkpoint_size_gb=0", only=["shm"])
    assert check(unknown, "shm.memory_tier").status == Status.WARN
    assert "doctor.checkpoint_size_gb" in check(unknown, "shm.memory_tier").fix
    size_gb = check(plain, "shm.size").measured
    fits = doctor(root, tmp_path, "checkpoint.memory_every=1", f"doctor.checkpoint_size_gb={size_gb / 4}", only=["shm"])
    assert check(fits, "shm.memory_tier").status == Status.PASS
    big = doctor(root, tmp_path, "checkpoint.memory_every=1", f"doctor.checkpoint_size_gb={size_gb / 2}", only=["shm"])
    bad = check(big, "shm.memory_tier")
    assert bad.status == Status.FAIL and "memory_every" in bad.fix
    # Two nodes: this node also keeps the buddy copies of the other node's ranks (2x more).
    two = doctor(root, tmp_path, "checkpoint.memory_every=1", f"doctor.checkpoint_size_gb={size_gb / 4}",
                 "launch.nnodes=2", only=["shm"])
    assert check(two, "shm.memory_tier").status == Status.FAIL and "buddy" in check(two, "shm.memory_tier").fix
    alone = doctor(root, tmp_path, "checkpoint.memory_every=1", f"doctor.checkpoint_size_gb={size_gb / 4}",
                   "launch.nnodes=2", "checkpoint.memory_replicate=false", only=["shm"])
    assert check(alone, "shm.memory_tier").status == Status.PASS
