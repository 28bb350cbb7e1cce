#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build gpuhost, serve with the NVML backend, and compare
# GET /status with nvidia-smi's own answer. Exits non-zero on any mismatch.
#   scripts/gpu-check.sh [--keep]      (needs cargo, curl, python3, nvidia-smi)
set -euo pipefail
cd "$(dirname "$0")/.."
SMI=${NVIDIA_SMI_PATH:-$(command -v nvidia-smi || echo /usr/lib/wsl/lib/nvidia-smi)}
[[ -x $SMI ]] || { echo "nvidia-smi not found (set NVIDIA_SMI_PATH)"; exit 2; }
cargo build --release --quiet
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$dir/gpuhost.toml" <<TOML
listen = "127.0.0.1:$port"
token = "gpu-check"
[pipeline]
stages = []
[workers]
[gpu.status]
backend = "nvml"
interval_s = 0.5
quiet_period_s = 1
TOML
target/release/gpuhost serve --config "$dir/gpuhost.toml" 2> "$dir/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  curl -fsS -H "Authorization: Bearer gpu-check" "http://127.0.0.1:$port/status" > "$dir/status.json" 2>/dev/null \
    && python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["sampled_at"] else 1)' "$dir/status.json" && break
  sleep 0.2
done
"$SMI" --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw --format=csv,noheader,nounits > "$dir/gpus.csv"
"$SMI" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$dir/apps.csv" || true
echo "--- startup log"; grep -i "backend" "$dir/log" || true
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
s = json.load(open(f"{d}/status.json"))
print("--- /status:", json.dumps({k: s[k] for k in ("gpu", "decision", "reason", "is_idle", "backend")}, indent=1))
bad = []
if s["backend"]["active"] != "nvml":
    bad.append(f"backend is {s['backend']['active']}, not nvml: {s['backend']}")
rows = [[f.strip() for f in l.split(",")] for l in open(f"{d}/gpus.csv") if l.strip()]
if len(rows) != len(s["gpus"]):
    bad.append(f"nvidia-smi lists {len(rows)} GPUs, /status {len(s['gpus'])}")
for row, g in zip(rows, s["gpus"]):
    idx, uuid, name, total, used, util, temp, power = row
    print(f"GPU {idx}: smi {name} {used}/{total} MiB {util}% {temp}C {power}W | gpuhost {g['name']} {g['memory_used_mib']}/{g['memory_total_mib']} MiB {g['utilization']}% {g['temperature']}C {g['power_draw']}W")
    if g["uuid"] != uuid or g["name"] != name: bad.append(f"GPU {idx}: identity differs")
    if abs(g["memory_total_mib"] - int(total)) > 2: bad.append(f"GPU {idx}: total memory differs")
    if abs(g["memory_used_mib"] - int(used)) > max(64, int(used) * 0.05): bad.append(f"GPU {idx}: used memory differs")
    if abs(g["temperature"] - int(temp)) > 5: bad.append(f"GPU {idx}: temperature differs")
smi_pids = sorted(int(l.split(",")[0]) for l in open(f"{d}/apps.csv") if l.strip() and l.split(",")[0].strip().isdigit())
ours = sorted(p["pid"] for p in s["processes"])
print(f"processes: smi {smi_pids} | gpuhost {ours}")
if smi_pids != ours: bad.append("process lists differ (may be a process starting or ending between the two samples)")
print("--- result:", "OK" if not bad else "MISMATCH"); [print(" -", b) for b in bad]
sys.exit(1 if bad else 0)
PY
