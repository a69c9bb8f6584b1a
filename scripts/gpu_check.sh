#!/usr/bin/env bash
# The GPU check: the COCO configs' real sizes on whatever GPU is lent, in one table. It runs well
# under 8 minutes on one H100 or H200.
# It builds the COCO rehearsal's inputs: real COCO captions, generated images, and ViT-B-32, LongCLIP-B
# and the L-CLIP student at their real sizes with random weights. It computes the reward models'
# embeddings, then times:
#   - one XE step (10 images x 5 captions);
#   - one SCST step (50 images x 5 samples) on cider_d alone, and on the cider_d + clip_s + specs mix;
#   - decoding.
# Usage: bash scripts/gpu_check.sh [OUT]    (OUT defaults to runs/gpu_check; the device's own python3)
# The reward share of the mix's SCST step should be at most 10% of the step.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-runs/gpu_check}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log() { echo "[gpu_check] $*"; }

"$PY" - <<'PY'
import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible: the CPU"
print(f"[gpu_check] device: {name}; torch {torch.__version__}")
PY
log "rehearsal inputs and the reward models' embeddings -> $OUT"
"$PY" -m captioner.coco rehearse --out "$OUT" --no-progress --only prepro,embeds_clip,embeds_specs,embeds_lclip \
  > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
scoring=(--scoring "$OUT/scoring.yaml" --references "$OUT/data/refs.json" --vocab "$OUT/data/vocab.json")
"$PY" -m captioner.bench xe --repeats 5 | tee "$OUT/xe.txt"
"$PY" -m captioner.bench scst "${scoring[@]}" --rewards cider_d --repeats 3 | tee "$OUT/scst_cider.txt"
"$PY" -m captioner.bench scst "${scoring[@]}" --rewards cider_d,clip_s,specs --repeats 3 | tee "$OUT/scst_mix.txt"
"$PY" -m captioner.bench decode --repeats 3 | tee "$OUT/decode.txt"

"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
last = {name: json.loads(Path(out, f"{name}.txt").read_text().strip().splitlines()[-1])
        for name in ("xe", "scst_cider", "scst_mix", "decode")}
rows = [("XE step, reference model (10 x 5)", f"{last['xe']['step_s']:.3f} s", f"{last['xe']['peak_mb']} MB", "")]
for name, label in (("scst_cider", "SCST step, cider_d"), ("scst_mix", "SCST step, cider_d + clip_s + specs")):
    ref = last[name]["reference"]
    rows.append((f"{label} (50 x 5)", f"{ref['step_s']:.3f} s", f"{ref['peak_mb']} MB",
                 f"reward share {ref['reward_share']:.1%}"))
rows.append(("greedy decode, 50 images, cached", f"{50 / last['decode']['greedy']['cached_captions_per_s']:.3f} s",
             "", f"cache speedup x{last['decode']['cache_speedup']}"))
print("\n| bench | time | peak memory | note |\n|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(row) + " |")
mix = last["scst_mix"]["reference"]["reward_share"]
print(f"\n[gpu_check] the mix's reward share {mix:.1%}: {'within' if mix <= 0.10 else 'OVER'} the 10% target")
PY
