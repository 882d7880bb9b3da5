#!/usr/bin/env python3
"""Registry writes per second through a node's authority: concurrent `POST /v1/mailbox` of a
32-byte message (each one registry write: on a cluster with an authority group, one write set
through the group), spread over the node's URLs, each client on one keep-alive connection.

    scripts/authority-load.py --data ./florin-cluster --clients 16 --writes 400
    scripts/authority-load.py --url https://127.0.0.1:7400 --ca ./florin-data/tls/ca.pem

Prints one JSON line: clients, writes, errors (by answer), writes/s, p50 and p99 latency.
Recipients are 64 fresh wallet addresses (made with `florin wallet new` in a temporary
directory), so the per-recipient rate limit is not what is measured.
"""
import argparse
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--florin", default="target/release/florin")
    p.add_argument("--data", help="a cluster's directory (its sentinels' URLs and CA)")
    p.add_argument("--url", action="append", default=[], help="a node URL (repeatable)")
    p.add_argument("--ca", help="the CA certificate for --url")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--writes", type=int, default=400)
    a = p.parse_args()
    if a.data:
        st = json.loads(
            subprocess.check_output([a.florin, "cluster", "status", "--data", a.data, "--json"])
        )
        urls, ca = st["apis"], os.path.join(a.data, "tls", "ca.pem")
    else:
        urls, ca = a.url, a.ca
    if not urls:
        raise SystemExit("give --data or --url")
    with tempfile.TemporaryDirectory() as d:
        addrs = []
        for i in range(64):
            out = subprocess.check_output(
                [a.florin, "wallet", "--wallet", os.path.join(d, f"w{i}"), "--json", "new", "--no-passphrase"]
            )
            addrs.append(json.loads(out)["address"])
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    per = max(1, a.writes // a.clients)
    lat, errors, lock = [], {}, threading.Lock()

    def client(i):
        url = urls[i % len(urls)]
        hostport = url.split("://", 1)[1].rstrip("/")
        host, port = hostport.rsplit(":", 1)
        if url.startswith("https://"):
            c = http.client.HTTPSConnection(host, int(port), context=ctx)
        else:
            c = http.client.HTTPConnection(host, int(port))
        mine = []
        for k in range(per):
            body = json.dumps({"to": addrs[(i * per + k) % len(addrs)], "message": "ab" * 32})
            t = time.perf_counter()
            c.request("POST", "/v1/mailbox", body, {"content-type": "application/json"})
            r = c.getresponse()
            b = r.read()
            mine.append(time.perf_counter() - t)
            if r.status != 200:
                try:
                    code = json.loads(b)["error"]["code"]
                except Exception:
                    code = str(r.status)
                with lock:
                    errors[code] = errors.get(code, 0) + 1
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    lat.sort()
    print(
        json.dumps(
            {
                "clients": a.clients,
                "writes": len(lat),
                "errors": errors,
                "writes_per_s": round(len(lat) / elapsed, 1),
                "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
                "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
