"""Bandwidth ceilings of the links collectives run over: the denominator of collective efficiency.

A ceiling is the bandwidth one GPU can send over its link in **one direction**, in GB/s (10^9
bytes/s), the unit nccl-tests prints busbw in, so that busbw / ceiling is the share of the link a
collective achieved. Vendors quote NVLink as the *bidirectional* total (H100: "900 GB/s") and
networks in *gigabits* per second per port (NDR: "400 Gb/s"); the table holds both converted:
NVLink per direction = bidirectional / 2; a network port = Gb/s / 8; PCIe x16 per direction =
transfer rate (GT/s) x 16 lanes x 128/130 (line code) / 8.

Data, in one place (:data:`LINKS`, :data:`DEVICE_LINKS`; README "Collective bandwidth" lists
them): extend it here. A device's intra-node link comes from its name (as Kineto writes
``deviceProperties[].name``; first matching rule wins, specific variants first). Its inter-node
link is the network of the vendor's reference system for that GPU (one NIC per GPU: DGX A100 HDR,
DGX H100/H200/B200 NDR, DGX B300 XDR), an assumption the ceiling's text states; devices whose
reference network is not one NIC per GPU have none (give ``network`` or ``link_gbps``).

Sources: NVIDIA P100/V100/A100/A800/H100/H800/H200/B200/GB200 datasheets (NVLink bidirectional
bandwidth), PCI-SIG base specifications 3.0-5.0 (8, 16, 32 GT/s, 128b/130b), InfiniBand Trade
Association roadmap (EDR 100, HDR 200, NDR 400, XDR 800 Gb/s per 4x port), AMD Instinct MI300X
datasheet (7 Infinity Fabric links x 128 GB/s bidirectional to the other GPUs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Link", "DeviceLinks", "LINKS", "DEVICE_LINKS", "Ceiling", "device_links", "choose_ceiling"]


@dataclass(frozen=True)
class Link:
    """One kind of link: ``name`` (as the report says it), ``gbps`` (GB/s per direction per GPU)
    and ``how`` (where the figure comes from)."""

    name: str
    gbps: float
    how: str


def _pcie(gts: float) -> float:
    return round(gts * 16 * 128 / 130 / 8, 3)


#: Links by key. GB/s per direction per GPU.
LINKS: dict[str, Link] = {
    "nvlink1": Link("NVLink 1", 80.0, "P100 SXM2: 160 GB/s bidirectional (4 links x 40)"),
    "nvlink2": Link("NVLink 2", 150.0, "V100 SXM2/SXM3: 300 GB/s bidirectional (6 links x 50)"),
    "nvlink3": Link("NVLink 3", 300.0, "A100 SXM4: 600 GB/s bidirectional (12 links x 50)"),
    "nvlink3_a800": Link("NVLink 3 (A800)", 200.0, "A800 SXM4: 400 GB/s bidirectional (8 links x 50)"),
    "nvlink4": Link("NVLink 4", 450.0, "H100/H200 SXM, GH200: 900 GB/s bidirectional (18 links x 50)"),
    "nvlink4_h800": Link("NVLink 4 (H800)", 200.0, "H800 SXM5: 400 GB/s bidirectional (8 links x 50)"),
    "nvlink4_nvl": Link(
        "NVLink 4 bridge (H100 NVL)", 300.0, "H100 NVL: 600 GB/s bidirectional NVLink bridge"
    ),
    "nvlink5": Link("NVLink 5", 900.0, "B200, GB200, B300: 1.8 TB/s bidirectional (18 links x 100)"),
    "xgmi_mi300": Link("Infinity Fabric (MI300X)", 448.0, "MI300X/MI325X: 7 links x 128 GB/s bidirectional"),
    "pcie3": Link("PCIe 3.0 x16", _pcie(8), "8 GT/s x 16 lanes, 128b/130b"),
    "pcie4": Link("PCIe 4.0 x16", _pcie(16), "16 GT/s x 16 lanes, 128b/130b"),
    "pcie5": Link("PCIe 5.0 x16", _pcie(32), "32 GT/s x 16 lanes, 128b/130b"),
    "edr": Link("InfiniBand EDR", 12.5, "100 Gb/s per port"),
    "hdr": Link("InfiniBand HDR", 25.0, "200 Gb/s per port"),
    "ndr": Link("InfiniBand NDR", 50.0, "400 Gb/s per port"),
    "xdr": Link("InfiniBand XDR", 100.0, "800 Gb/s per port"),
    "roce100": Link("RoCE 100 GbE", 12.5, "100 Gb/s per port"),
    "roce200": Link("RoCE 200 GbE", 25.0, "200 Gb/s per port"),
    "roce400": Link("RoCE 400 GbE", 50.0, "400 Gb/s per port"),
    "roce800": Link("RoCE 800 GbE", 100.0, "800 Gb/s per port"),
}

#: Keys of :data:`LINKS` that are networks (between nodes); the others join GPUs within a node.
NETWORKS = ("edr", "hdr", "ndr", "xdr", "roce100", "roce200", "roce400", "roce800")


@dataclass(frozen=True)
class DeviceLinks:
    """A device model: ``label``, the name ``pattern`` (case-insensitive regex) that selects it,
    its link to the GPUs of its node (``intra``, a :data:`LINKS` key), the network of its
    reference system (``inter``, a key or ``""`` when none is assumed) and the most GPUs one
    such link domain joins (``domain``: 8 on HGX boards, 72 in an NVL72 rack)."""

    label: str
    pattern: str
    intra: str
    inter: str = ""
    domain: int = 8


#: Matched in order against the device name; PCIe cards come before the SXM name they share.
DEVICE_LINKS: tuple[DeviceLinks, ...] = (
    DeviceLinks("H100 NVL", r"H100.*NVL", "nvlink4_nvl", domain=2),
    DeviceLinks("H100 PCIe", r"H[18]00.*PCIE", "pcie5"),
    DeviceLinks("H200 NVL", r"H200.*NVL", "nvlink4", domain=4),
    DeviceLinks("GH200", r"GH200", "nvlink4"),
    DeviceLinks("H800 SXM", r"H800", "nvlink4_h800"),
    DeviceLinks("H200 SXM", r"H200", "nvlink4", "ndr"),
    DeviceLinks("H100 SXM", r"H100", "nvlink4", "ndr"),
    DeviceLinks("GB300", r"GB300", "nvlink5", "xdr", domain=72),
    DeviceLinks("GB200", r"GB200", "nvlink5", "ndr", domain=72),
    DeviceLinks("B300", r"(?<![A-Z])B300", "nvlink5", "xdr"),
    DeviceLinks("B200", r"(?<![A-Z])B200", "nvlink5", "ndr"),
    DeviceLinks("A100 PCIe", r"A[18]00.*PCIE", "pcie4"),
    DeviceLinks("A800 SXM", r"A800", "nvlink3_a800"),
    DeviceLinks("A100 SXM", r"A100", "nvlink3", "hdr"),
    DeviceLinks("V100 PCIe", r"V100S|V100.*PCIE", "pcie3"),
    DeviceLinks("V100 SXM", r"V100", "nvlink2"),
    DeviceLinks("P100 PCIe", r"P100.*PCIE", "pcie3"),
    DeviceLinks("P100 SXM2", r"P100", "nvlink1"),
    DeviceLinks(
        "L40S / L40 / L4 / A40 / A30 / A10",
        r"L40S|L40|(?<![A-Z0-9])L4(?![0-9])|A40|A30|A10(?![0-9])",
        "pcie4",
    ),
    DeviceLinks("T4", r"(?<![A-Z0-9])T4(?![0-9])", "pcie3"),
    DeviceLinks("MI300X", r"MI300X|MI325X", "xgmi_mi300"),
)


def device_links(name: str | None) -> DeviceLinks | None:
    """The :data:`DEVICE_LINKS` entry of a device name, or None (unknown device, ``cpu``, no name)."""
    if not name or name.lower() == "cpu":
        return None
    return next((d for d in DEVICE_LINKS if re.search(d.pattern, name, re.IGNORECASE)), None)


@dataclass(frozen=True)
class Ceiling:
    """The ceiling of one process group's collectives: ``gbps`` (GB/s per direction per GPU, None
    when there is none) and ``text``, which link and why (``"NVLink 4, H100 SXM: 450 GB/s per
    direction"``, or why there is no ceiling)."""

    gbps: float | None
    text: str


def choose_ceiling(
    device: str | None,
    spans_hosts: bool | None,
    group_size: int | None,
    link_gbps: float | None = None,
    network: str = "",
) -> Ceiling:
    """The ceiling of a process group's collectives.

    Rule, first match wins: ``link_gbps`` (given by the user); an unknown device (no name,
    ``cpu``, not in :data:`DEVICE_LINKS`): none; a group that spans hosts (``spans_hosts``, or
    when unknown, more ranks than one link domain of the device holds): the network (``network``,
    a :data:`NETWORKS` key, else the device's reference network, else none); otherwise the
    device's intra-node link (hosts unknown and the group fits one node: assumed one node, said so).

    Args:
        device: Device name of the group's ranks (e.g. ``NVIDIA H100 80GB HBM3``), None if unknown.
        spans_hosts: Whether the group's ranks run on more than one host; None when hosts are unknown.
        group_size: Ranks in the group, None if unknown.
        link_gbps: User-given ceiling, GB/s per direction per GPU.
        network: User-given network (:data:`NETWORKS` key) for groups that span hosts.
    """
    if link_gbps is not None:
        return Ceiling(link_gbps, f"{link_gbps:g} GB/s per direction, given (link_gbps)")
    dev = device_links(device)
    if dev is None:
        what = (
            "CPU devices"
            if (device or "").lower() == "cpu"
            else (f"device {device!r} not in the link table" if device else "device unknown")
        )
        return Ceiling(None, f"no ceiling: {what}; give -p link_gbps= (GB/s per direction per GPU)")
    inferred = ""
    if spans_hosts is None and group_size is not None and group_size > dev.domain:
        spans_hosts, inferred = True, f", hosts unknown: {group_size} ranks exceed one {dev.domain}-GPU node"
    if spans_hosts:
        key = network or dev.inter
        if not key:
            return Ceiling(
                None,
                f"no ceiling: the group spans hosts and the {dev.label}'s network is unknown; "
                "give -p network= (ndr, hdr, ...) or -p link_gbps=",
            )
        link = LINKS[key]
        why = (
            "given (network)"
            if network
            else f"assumed: one NIC per GPU as in the {dev.label} reference system"
        )
        return Ceiling(
            link.gbps,
            f"{link.name}, {link.gbps:g} GB/s per direction per GPU (the group spans hosts{inferred}; {why})",
        )
    link = LINKS[dev.intra]
    where = "" if spans_hosts is False else "; hosts unknown, assumed one node"
    return Ceiling(link.gbps, f"{link.name}, {dev.label}: {link.gbps:g} GB/s per direction{where}")
