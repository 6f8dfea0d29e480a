#!/usr/bin/env python3
"""Write the hwloc XML topologies of GPU servers that tests/test_topo.c loads.

The files are committed, so the tests need no Python; run this again only to
change them:  python3 tests/topologies/make-gpu-servers.py tests/topologies

  2s-8gpu.xml    two sockets, one NUMA node each, 16 cores x 2 hardware threads
                 per socket, Linux-style PU numbering (a core's sibling thread
                 is PU n+32).  GPUs 0-3 sit behind socket 0's host bridges,
                 4-7 behind socket 1's, each GPU with a NIC beside it, as on
                 HGX boards; four NVSwitches (NVIDIA, but not GPUs) and an NVMe
                 drive are there to be ignored.
  2s4n-8gpu.xml  the same sockets split in two NUMA nodes each (sub-NUMA
                 clustering, 8 cores per node), two GPUs per NUMA node.

In both the GPUs are listed out of PCI bus order in the file, so a reader
must sort them.
"""
import os
import sys

CORES_PER_SOCKET = 16
SOCKETS = 2
THREADS = 2
PUS = SOCKETS * CORES_PER_SOCKET * THREADS


def mask(bits):
    """hwloc's bitmap syntax: 32-bit hex words, most significant first."""
    value = 0
    for b in bits:
        value |= 1 << b
    words = []
    while True:
        words.append("0x%08x" % (value & 0xFFFFFFFF))
        value >>= 32
        if not value:
            break
    return ",".join(reversed(words))


def pus_of_core(socket, core):
    first = socket * CORES_PER_SOCKET + core
    return [first + t * SOCKETS * CORES_PER_SOCKET for t in range(THREADS)]


class Writer:
    def __init__(self):
        self.lines = []
        self.gp = 0

    def gp_index(self):
        self.gp += 1
        return self.gp

    def emit(self, depth, text):
        self.lines.append("  " * depth + text)

    def normal(self, depth, kind, cpus, nodes, extra="", os_index=None, close=False):
        attrs = 'type="%s"' % kind
        if os_index is not None:
            attrs += ' os_index="%d"' % os_index
        attrs += ' cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s"' % (
            mask(cpus), mask(cpus), mask(nodes), mask(nodes))
        attrs += ' gp_index="%d"%s' % (self.gp_index(), extra)
        self.emit(depth, "<object %s%s>" % (attrs, "/" if close else ""))


# (bus, description) of the devices behind each NUMA node's host bridge:
# kind "gpu" (3D controller, 10de:2330, an H100 SXM5), "nic" (InfiniBand,
# ConnectX-7), "nvswitch" (NVIDIA bridge, not a GPU), "nvme" (storage).
def devices(numa_nodes):
    per_node = 8 // numa_nodes
    buses = {}
    gpu = 0
    base = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb]
    for node in range(numa_nodes):
        items = []
        for _ in range(per_node):
            bus = base[gpu]
            items.append(("gpu", bus + 1, gpu))
            items.append(("nic", bus + 3, gpu))
            gpu += 1
        buses[node] = items
    buses[0].append(("nvme", 0x05, 0))
    buses[numa_nodes - 1] += [("nvswitch", 0xe1 + 2 * i, i) for i in range(4)]
    # listed in the file with the higher bus first
    for node in buses:
        buses[node].sort(key=lambda d: -d[1])
    return buses


PCI = {
    "gpu": ("0302 [10de:2330] [10de:16c1] a1", "NVIDIA Corporation", "GH100 [H100 SXM5 80GB]"),
    "nic": ("0207 [15b3:1021] [15b3:0041] 00", "Mellanox Technologies", "MT2910 Family [ConnectX-7]"),
    "nvswitch": ("0680 [10de:22a3] [10de:1796] a1", "NVIDIA Corporation", "GH100 [H100 NVSwitch]"),
    "nvme": ("0108 [144d:a80a] [144d:a801] 00", "Samsung Electronics Co Ltd", "NVMe SSD Controller PM9A1"),
}


def io_tree(w, depth, items):
    for kind, bus, index in items:
        pci_type, vendor, device = PCI[kind]
        busid = "0000:%02x:00.0" % bus
        # a root port per device, as PCIe switches are usually hidden behind one
        w.emit(depth, '<object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" '
                      'bridge_pci="0000:[%02x-%02x]">' % (w.gp_index(), bus - 1, bus))
        w.emit(depth + 1, '<object type="Bridge" gp_index="%d" bridge_type="1-1" depth="1" '
                          'bridge_pci="0000:[%02x-%02x]" pci_busid="0000:%02x:01.0" '
                          'pci_type="0604 [8086:352a] [0000:0000] 04" pci_link_speed="31.507692">'
               % (w.gp_index(), bus, bus, bus - 1))
        w.emit(depth + 2, '<object type="PCIDev" gp_index="%d" pci_busid="%s" pci_type="%s" '
                          'pci_link_speed="31.507692">' % (w.gp_index(), busid, pci_type))
        w.emit(depth + 3, '<info name="PCIVendor" value="%s"/>' % vendor)
        w.emit(depth + 3, '<info name="PCIDevice" value="%s"/>' % device)
        if kind == "gpu":
            w.emit(depth + 3, '<object type="OSDev" gp_index="%d" name="nvml%d" osdev_type="1"/>'
                   % (w.gp_index(), index))
        elif kind == "nic":
            w.emit(depth + 3, '<object type="OSDev" gp_index="%d" name="mlx5_%d" osdev_type="3"/>'
                   % (w.gp_index(), index))
        w.emit(depth + 2, "</object>")
        w.emit(depth + 1, "</object>")
        w.emit(depth, "</object>")


def cores(w, depth, socket, first, count, node):
    for c in range(first, first + count):
        pus = pus_of_core(socket, c)
        w.normal(depth, "Core", pus, [node], os_index=c)
        for pu in pus:
            w.normal(depth + 1, "PU", [pu], [node], os_index=pu, close=True)
        w.emit(depth, "</object>")


def numa(w, depth, cpus, node, memory):
    w.normal(depth, "NUMANode", cpus, [node], os_index=node,
             extra=' local_memory="%d"' % memory, close=True)


def server(numa_per_socket):
    w = Writer()
    nodes = SOCKETS * numa_per_socket
    buses = devices(nodes)
    all_pus = list(range(PUS))
    w.emit(0, '<?xml version="1.0" encoding="UTF-8"?>')
    w.emit(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    w.emit(0, '<topology version="2.0">')
    w.normal(1, "Machine", all_pus, list(range(nodes)), os_index=0,
             extra=' allowed_cpuset="%s" allowed_nodeset="%s"' % (mask(all_pus), mask(range(nodes))))
    w.emit(2, '<info name="Backend" value="Linux"/>')
    w.emit(2, '<info name="DMIProductName" value="two-socket 8-GPU test server"/>')
    per_node = CORES_PER_SOCKET // numa_per_socket
    memory = 512 * 2**30 // numa_per_socket
    for s in range(SOCKETS):
        socket_pus = sorted(p for c in range(CORES_PER_SOCKET) for p in pus_of_core(s, c))
        socket_nodes = [s * numa_per_socket + k for k in range(numa_per_socket)]
        w.normal(2, "Package", socket_pus, socket_nodes, os_index=s)
        w.emit(3, '<info name="CPUModel" value="Test Xeon 16-core"/>')
        if numa_per_socket == 1:
            node = socket_nodes[0]
            numa(w, 3, socket_pus, node, memory)
            cores(w, 3, s, 0, CORES_PER_SOCKET, node)
            io_tree(w, 3, buses[node])
        else:
            for k, node in enumerate(socket_nodes):
                die_pus = sorted(p for c in range(k * per_node, (k + 1) * per_node)
                                 for p in pus_of_core(s, c))
                w.normal(3, "Die", die_pus, [node], os_index=node)
                numa(w, 4, die_pus, node, memory)
                cores(w, 4, s, k * per_node, per_node, node)
                io_tree(w, 4, buses[node])
                w.emit(3, "</object>")
        w.emit(2, "</object>")
    w.emit(1, "</object>")
    w.emit(0, "</topology>")
    return "\n".join(w.lines) + "\n"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, numa_per_socket in (("2s-8gpu.xml", 1), ("2s4n-8gpu.xml", 2)):
        with open(os.path.join(out, name), "w") as f:
            f.write(server(numa_per_socket))


if __name__ == "__main__":
    main()
