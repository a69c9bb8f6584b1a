#!/usr/bin/env bash
# The main job on the embedded offline world. Sets up .venv when needed, then runs every
# stage that exists so far; stages whose outputs are already there are skipped.
# Output folder: runs/demo (override with RLCAP_DEMO_DIR).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
OUT="${RLCAP_DEMO_DIR:-runs/demo}"
start=$(date +%s)
ran=()

stage() { echo; echo "[demo] stage: $1"; }

stage "world -> $OUT/world"
python -m captioner.world --config configs/world.yaml --out "$OUT/world"
ran+=("world")

stage "prepro -> $OUT/data"
python -m captioner.prepro --config configs/prepro_world.yaml --dataset "$OUT/world/dataset.json" --out "$OUT/data"
ran+=("prepro")

stage "features (patches) -> $OUT/feats/patches.h5"
python -m features.extract --config configs/features_patches.yaml --dataset "$OUT/world/dataset.json" \
  --images-root "$OUT/world" --out "$OUT/feats/patches.h5"
ran+=("features")

echo
echo "[demo] ran: ${ran[*]} in $(( $(date +%s) - start ))s; outputs under $OUT"
echo "[demo] not run yet (their issues are open): world CLIP, SPECS and L-CLIP models, reward embeddings,"
echo "       XE and SCST training, the metric suite, checkpoint selection and the run report."
