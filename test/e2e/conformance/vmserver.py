#!/usr/bin/env python3
"""The conformance check's server inside a KubeVirt VM.

It listens with MPTCP, takes each connection's stream to its end, and
writes one JSON line per connection (the fields of hack/traffic's server
report that the check compares: bytes, SHA-256, whether MPTCP held) to
the serial console, which KubeVirt's logSerialConsole turns into the
virt-launcher pod's guest-console-log container log. Standard library
only: the VM is a stock cloud image, and nothing of the operator runs in
it.
"""

import argparse
import errno
import hashlib
import json
import socket
import threading

IPPROTO_MPTCP = 262
SOL_MPTCP = 284
MPTCP_INFO = 1


def still_mptcp(conn):
    """False when the connection fell back to TCP: the kernel then refuses
    MPTCP_INFO with EOPNOTSUPP."""
    try:
        conn.getsockopt(SOL_MPTCP, MPTCP_INFO, 256)
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            return False
        raise
    return True


def serve(conn, peer, out, lock):
    digest, received = hashlib.sha256(), 0
    error = ""
    try:
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            received += len(chunk)
        mptcp = still_mptcp(conn)
    except OSError as e:
        mptcp, error = False, str(e)
    local = conn.getsockname()
    conn.close()
    line = json.dumps({
        "local": "%s:%d" % local[:2],
        "remote": "%s:%d" % peer[:2],
        "mptcp": mptcp,
        "bytes": received,
        "sha256": digest.hexdigest(),
        "error": error,
    })
    with lock:
        out.write(line + "\n")
        out.flush()


def main():
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--port", type=int, required=True)
    args.add_argument("--out", default="/dev/ttyS0")
    args.add_argument("--host", default="0.0.0.0")
    opts = args.parse_args()

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((opts.host, opts.port))
    listener.listen(16)
    lock = threading.Lock()
    with open(opts.out, "w") as out:
        with lock:
            out.write("mptcp-conformance-server listening on port %d\n" % listener.getsockname()[1])
            out.flush()
        while True:
            conn, peer = listener.accept()
            threading.Thread(target=serve, args=(conn, peer, out, lock), daemon=True).start()


if __name__ == "__main__":
    main()
