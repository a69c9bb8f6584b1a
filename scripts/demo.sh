#!/usr/bin/env bash
# The main job on the embedded offline world. Sets up .venv when needed, then runs every stage
# (world, data, reward models, XE, SCST on a reward mix, test scores, selection by SPECS, report);
# stages whose outputs are already there are skipped (training runs continue from their last
# checkpoint).
# Output folder: runs/demo (the configs in configs/ point there).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
OUT=runs/demo
start=$(date +%s)
ran=()

stage_start=$start
stage() { echo; echo "[demo] stage: $1"; stage_start=$(date +%s); }
finish() { ran+=("$1 $(( $(date +%s) - stage_start ))s"); }

stage "world -> $OUT/world"
python -m features.world --config configs/world.yaml --out "$OUT/world"
finish "world"

stage "prepro -> $OUT/data"
python -m captioner.prepro --config configs/prepro_world.yaml --dataset "$OUT/world/dataset.json" --out "$OUT/data"
finish "prepro"

stage "features (patches) -> $OUT/feats/patches.h5"
python -m features.extract --config configs/features_patches.yaml --dataset "$OUT/world/dataset.json" \
  --images-root "$OUT/world" --out "$OUT/feats/patches.h5"
finish "features"

stage "world CLIP (ResNet tower: 20 epochs on the scene graphs and its feature map's places, 10 contrastive with world hard negatives, present shapes' nouns and size phrases, the background, count and grid-cell labels kept, then the text stage: 2 + 3 + 8 epochs reading relations (a quarter of them stated in other frames), sizes, places and the background) -> $OUT/reward_models/world_clip.safetensors"
python -m rewards.train_clip --config configs/reward_models/world_clip.yaml
finish "world-clip"

stage "reward-model image embeddings -> $OUT/embeds/clip.h5"
python -m features.extract --backbone open_clip:world-clip-rn16-e256-h4 \
  --pretrained "$OUT/reward_models/world_clip.safetensors" --dataset "$OUT/world/dataset.json" \
  --images-root "$OUT/world" --embeds-out "$OUT/embeds/clip.h5"
finish "embeds"

stage "SPECS (world CLIP stretched to 248 positions + specificity fine-tuning of its text tower) -> $OUT/reward_models/world_specs.pt"
python -m rewards.train_specs --config configs/reward_models/world_specs.yaml
python -m features.extract --backbone longclip --pretrained "$OUT/reward_models/world_specs.pt" \
  --dataset "$OUT/world/dataset.json" --images-root "$OUT/world" --embeds-out "$OUT/embeds/specs.h5"
finish "specs"

stage "L-CLIP (distilled from the world CLIP: its text tower a copy of the teacher's, its image tower 18 epochs over each train image and its three mirrored views on the teacher's feature maps and embeddings, raw and whitened, then 1 of stage 2) -> $OUT/reward_models/world_lclip.ckpt"
python -m rewards.distill_lclip --config configs/reward_models/world_lclip.yaml
python -m features.extract --backbone lclip --pretrained "$OUT/reward_models/world_lclip.ckpt" \
  --dataset "$OUT/world/dataset.json" --images-root "$OUT/world" --embeds-out "$OUT/embeds/lclip.h5"
finish "lclip"

stage "XE training (6 epochs, one encoder layer) -> $OUT/runs/demo_xe"
python -m captioner.train --config configs/demo_xe.yaml --resume auto
finish "xe"

stage "SCST with 0.7 cider_d + 0.3 clip_s, batch-normalised, XE anchor (2 epochs; every metric each epoch) -> $OUT/runs/demo_scst"
python -m captioner.train --config configs/demo_scst.yaml --resume auto
finish "scst"

stage "test split with the SCST checkpoint -> $OUT/runs/demo_scst/test_results.json"
best="$OUT/runs/demo_scst/checkpoints/best"
if [ -f "$OUT/runs/demo_scst/test_results.scores.json" ] \
   && [ ! "$best/model.safetensors" -nt "$OUT/runs/demo_scst/test_results.scores.json" ]; then
  echo "test scores of $best are already in $OUT/runs/demo_scst/test_results.scores.json; skipped"
else
  python -m captioner.evaluate --checkpoint "$best" --split test --out "$OUT/runs/demo_scst/test_results.json"
fi
python -m captioner.select --run "$OUT/runs/demo_scst" --by specs
finish "evaluate+select"

stage "report (checkpoint chosen by SPECS) -> $OUT/runs/demo_scst/report.md"
python -m captioner.report --run "$OUT/runs/demo_scst" --by specs
finish "report"

echo
echo "[demo] done in $(( $(date +%s) - start ))s (stages already done are skipped); outputs under $OUT"
printf '[demo] seconds per stage: %s\n' "$(IFS=,; echo "${ran[*]}")"
echo "[demo] report: $OUT/runs/demo_scst/report.md (curves beside it: report_metrics.png, report_rewards.png)"
echo "[demo] next: the α sweep (README, 'α sweeps'): python -m captioner.sweep --config configs/ablate_alpha.yaml"
