#!/usr/bin/env python3
# <xbar.title>gpuhost</xbar.title>
# <xbar.desc>The GPU at a glance: decision, VRAM, queue and what runs, from a gpuhost server.</xbar.desc>
# <xbar.dependencies>python3</xbar.dependencies>
# <xbar.var>string(GPUHOST_URL="http://127.0.0.1:9090"): gpuhost server</xbar.var>
# <swiftbar.hideRunInTerminal>true</swiftbar.hideRunInTerminal>
"""SwiftBar / xbar plugin: polls a gpuhost server's /status every 5 s (the file name says how often).

Token: GPUHOST_TOKEN, else the macOS keychain item "gpuhost" (add it once with
`security add-generic-password -s gpuhost -a "$USER" -w TOKEN`). Server: GPUHOST_URL.
Standard library only.
"""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

COLOURS = {"idle": "#3fb950", "loading": "#d29922", "busy": "#f85149", "unknown": "#8b95a3"}


def token():
    if os.environ.get("GPUHOST_TOKEN"):
        return os.environ["GPUHOST_TOKEN"].strip()
    try:
        out = subprocess.run(
            ["security", "find-generic-password", "-s", "gpuhost", "-w"],
            capture_output=True,
            text=True,
            timeout=3,
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def fetch(base, path, tok):
    request = urllib.request.Request(base.rstrip("/") + path)
    if tok:
        request.add_header("Authorization", "Bearer " + tok)
    with urllib.request.urlopen(request, timeout=4) as response:
        return json.load(response)


def clean(text):
    """Menu lines must not carry the `|` that starts xbar parameters, nor newlines."""
    return str(text).replace("|", "¦").replace("\n", " ")


def render(status, base):
    decision = status.get("decision", "unknown")
    gpu = status.get("gpu") or {}
    used, total = gpu.get("memory_used_mib", 0), gpu.get("memory_total_mib", 0)
    queue = status.get("queue", {})
    colour = COLOURS.get(decision, COLOURS["unknown"])
    gib = "%.1f/%.0f GiB" % (used / 1024, total / 1024) if total else "no GPU"
    lines = ["GPU %s %s | color=%s" % (decision.upper(), gib, colour), "---"]
    lines.append(clean(status.get("reason", "")))
    if total:
        lines.append(
            "%s: %d/%d MiB (%d%%), %s%% util"
            % (
                clean(gpu.get("name", "GPU")),
                used,
                total,
                100 * used // total,
                gpu.get("utilization", 0),
            )
        )
    lines.append(
        "queue: %s running, %s waiting" % (queue.get("running", 0), queue.get("waiting", 0))
    )
    for holder in status.get("holders", []):
        lines.append(
            "holds: %s (%.0f s)" % (clean(holder.get("label", "")), holder.get("held_s", 0))
        )
    for p in status.get("processes", []):
        who = p.get("worker") or p.get("watch") or p.get("name", "")
        lines.append(
            "%s MiB  %s (pid %s) | font=Menlo size=11"
            % (p.get("used_memory_mib", 0), clean(who), p.get("pid"))
        )
    for s in status.get("services", []):
        lines.append("service %s: %s" % (clean(s.get("name", "")), s.get("state", "")))
    lines.append("---")
    lines.append("Open dashboard | href=%s/" % base.rstrip("/"))
    lines.append("Refresh | refresh=true")
    return "\n".join(lines)


def main():
    base = os.environ.get("GPUHOST_URL", "http://127.0.0.1:9090")
    try:
        print(render(fetch(base, "/status", token()), base))
    except urllib.error.HTTPError as e:
        hint = " (set GPUHOST_TOKEN or the keychain item)" if e.code == 401 else ""
        print("GPU ? | color=%s\n---\n%s answered %d%s" % (COLOURS["unknown"], base, e.code, hint))
    except (OSError, ValueError) as e:
        print("GPU off | color=%s\n---\ncannot reach %s: %s" % (COLOURS["unknown"], base, clean(e)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
