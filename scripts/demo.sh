#!/usr/bin/env bash
# The main job on the embedded offline world. Sets up .venv when needed, then runs every
# stage that exists so far; stages whose outputs are already there are skipped (training runs
# continue from their last checkpoint).
# Output folder: runs/demo (the configs in configs/ point there).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
OUT=runs/demo
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

stage "world CLIP (contrastive, 10 epochs) -> $OUT/reward_models/world_clip.safetensors"
python -m rewards.train_clip --config configs/reward_models/world_clip.yaml
ran+=("world-clip")

stage "reward-model image embeddings -> $OUT/embeds/clip.h5"
python -m features.extract --backbone open_clip:world-clip-tiny \
  --pretrained "$OUT/reward_models/world_clip.safetensors" --dataset "$OUT/world/dataset.json" \
  --images-root "$OUT/world" --embeds-out "$OUT/embeds/clip.h5"
ran+=("embeds")

stage "SPECS (world CLIP stretched to 248 positions + specificity fine-tuning) -> $OUT/reward_models/world_specs.pt"
python -m rewards.train_specs --config configs/reward_models/world_specs.yaml
python -m features.extract --backbone longclip --pretrained "$OUT/reward_models/world_specs.pt" \
  --dataset "$OUT/world/dataset.json" --images-root "$OUT/world" --embeds-out "$OUT/embeds/specs.h5"
ran+=("specs")

stage "L-CLIP (distilled from the world CLIP; demo length: 6 + 1 epochs) -> $OUT/reward_models/world_lclip.ckpt"
python -m rewards.distill_lclip --config configs/reward_models/world_lclip.yaml \
  --set stage1_epochs=6 --set stage2_epochs=1
python -m features.extract --backbone lclip --pretrained "$OUT/reward_models/world_lclip.ckpt" \
  --dataset "$OUT/world/dataset.json" --images-root "$OUT/world" --embeds-out "$OUT/embeds/lclip.h5"
ran+=("lclip")

stage "XE training (4 epochs) -> $OUT/runs/demo_xe"
python -m captioner.train --config configs/demo_xe.yaml --resume auto
ran+=("xe")

stage "SCST with 0.5 cider_d + 0.5 l_clip_s (1 epoch; every metric each epoch) -> $OUT/runs/demo_scst"
python -m captioner.train --config configs/demo_scst.yaml --resume auto
ran+=("scst")

stage "test split with the SCST checkpoint -> $OUT/runs/demo_scst/test_results.json"
python -m captioner.evaluate --checkpoint "$OUT/runs/demo_scst/checkpoints/best" --split test \
  --out "$OUT/runs/demo_scst/test_results.json"
python -m captioner.select --run "$OUT/runs/demo_scst" --by specs
ran+=("evaluate" "select")

echo
echo "[demo] ran: ${ran[*]} in $(( $(date +%s) - start ))s; outputs under $OUT"
echo "[demo] not run yet (issue 8 is open): α sweeps and the run report (runs/<name>/report.md)."
