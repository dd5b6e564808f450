"""Removes the SCTP servers from network-policy-api's conformance base manifests.

The suite's base StatefulSets run, per pod, `agnhost porter` containers serving SCTP; on a
kernel without SCTP sockets (CONFIG_IP_SCTP off, as on this project's machines) agnhost
exits at once, no base pod becomes ready and the suite cannot run any test. scripts/k8s.sh
builds a second suite binary from a copy whose manifests lack exactly those containers;
scripts/k8s-conformance.sh uses it only on such a kernel and reports the suite's SCTP tests
as skipped, naming this reason. Every other container and manifest is left byte for byte.

Usage: python3 npa_without_sctp.py MANIFEST.yaml   (rewritten in place; prints the count)
"""

import re
import sys


def without_sctp_servers(text):
    lines = text.split("\n")
    out, removed, i = [], 0, 0
    item = re.compile(r"^(\s*)- name: ")
    while i < len(lines):
        m = item.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent = len(m.group(1))
        j = i + 1
        # The list item runs until a line indented no deeper than its dash.
        while j < len(lines) and (
            lines[j].strip() == "" or len(lines[j]) - len(lines[j].lstrip()) > indent
        ):
            j += 1
        block = lines[i:j]
        if any("SERVE_SCTP_PORT_" in b for b in block):
            removed += 1
        else:
            out.extend(block)
        i = j
    return "\n".join(out), removed


def main():
    path = sys.argv[1]
    with open(path) as f:
        text, removed = without_sctp_servers(f.read())
    if removed == 0:
        sys.exit(f"{path}: no SCTP server found; the suite changed, check this script")
    with open(path, "w") as f:
        f.write(text)
    print(removed)


if __name__ == "__main__":
    main()
