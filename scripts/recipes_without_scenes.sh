#!/usr/bin/env bash
# Reward-model recipes without scene graphs, measured on the offline world (docs/reward_model_recipes.md,
# "Recipes without scene graphs"). Needs a finished demo (bash scripts/demo.sh): its world, its XE start
# and (c), its scene-graph world CLIP, SPECS and SCST run. Trains
#   (a) a world CLIP, plain contrastive;  (b) the same with `negatives: text` (nothing from the scenes);
# SPECS from each (b: text negatives and text-edited d-), the foil tables of all three in three wordings,
# SCST at the demo's mix with each as the CLIP-S reward, and CLIP-S at alpha 1 with no XE anchor: for (c)
# alone, with the grammar reward and with the KL anchor; for (b) with the grammar reward (a grammar head
# on (b)'s and on (c)'s CLIP). About an hour and a
# half on 2 CPU cores (three lanes of one thread each); every step skips or resumes what is finished, so
# a second run goes on where the first stopped. Prints the tables at the end.
#   bash scripts/recipes_without_scenes.sh [OUT]        (default: runs/recipes_without_scenes)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
DEMO=runs/demo; W=$DEMO/world; O=${1:-runs/recipes_without_scenes}
mkdir -p "$O/embeds" "$O/meta" "$O/runs" "$O/logs"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1  # two lanes, one core each
for f in "$W/dataset.json" "$DEMO/reward_models/world_clip.safetensors" "$DEMO/reward_models/world_specs.pt" \
         "$DEMO/runs/demo_xe/checkpoints/best" "$DEMO/runs/demo_scst/metrics.jsonl"; do
  [ -e "$f" ] || { echo "error: $f not found: run bash scripts/demo.sh first" >&2; exit 2; }
done
ARCH=world-clip-rn16-e256-h4
log() { echo "[$(date +%T)] $*"; }
step() { local name=$1; shift; log "$name"; "$@" > "$O/logs/$name.log" 2>&1 || { echo "error: $name failed: $O/logs/$name.log" >&2; return 1; }; }

clip() {  # (a) and (b): 40 contrastive epochs, about the demo recipe's CPU time for (b); no scenes
  local v=$1; shift
  step "clip_$v" python -m rewards.train_clip --arch $ARCH --dataset $W/dataset.json --images-root $W --epochs 40 \
    --set batch_size=64 --set workers=0 --set lr=1e-3 --set eval_every=10 --set pool_position_std=1.0 \
    --set captions=both --out "$O/clip_$v.safetensors" "$@"
}
specs() {  # the demo's SPECS recipe on each, with nothing from the scenes
  local v=$1; shift
  step "specs_$v" python -m rewards.train_specs --config configs/reward_models/world_specs.yaml \
    --set init="$O/clip_$v.safetensors" --set out="$O/specs_$v.pt" --set start_out=null --set scenes=null "$@"
}
embeds() {
  local v=$1
  step "embeds_clip_$v" python -m features.extract --backbone open_clip:$ARCH --pretrained "$O/clip_$v.safetensors" \
    --dataset $W/dataset.json --images-root $W --embeds-out "$O/embeds/clip_$v.h5" --workers 0
  step "embeds_specs_$v" python -m features.extract --backbone longclip --pretrained "$O/specs_$v.pt" \
    --dataset $W/dataset.json --images-root $W --embeds-out "$O/embeds/specs_$v.h5" --workers 0
}
grammar() {
  local v=$1
  step "grammar_$v" python -m rewards.train_grammar --arch $ARCH --weights "$(clip_of "$v")" \
    --dataset $W/dataset.json --out "$O/grammar_$v.safetensors"
}
clip_of() { [ "$1" = scene ] && echo $DEMO/reward_models/world_clip.safetensors || echo "$O/clip_$1.safetensors"; }
embeds_of() { [ "$1" = scene ] && echo $DEMO/embeds/clip.h5 || echo "$O/embeds/clip_$1.h5"; }
scst() {  # scst NAME RECIPE [--set ...]: 2 epochs from the demo's XE start, the recipe's CLIP as clip_s
  local name=$1 v=$2; shift 2
  step "scst_$name" python -m captioner.train --config configs/demo_scst.yaml --no-progress --resume auto \
    --set run.name="$name" --set run.out_dir="$O/runs" --set reward_models.clip.weights="$(clip_of "$v")" \
    --set reward_models.clip.embeds="$(embeds_of "$v")" "$@"
}
alone() {  # alpha 1, no XE anchor; the recipe's grammar head scores every epoch
  local name=$1 v=$2 mix=$3; shift 3
  scst "$name" "$v" --set "scst.rewards=$mix" --set scst.xe_weight=0 \
    --set reward_models.clip.grammar="$O/grammar_$v.safetensors" \
    --set "eval.metrics=[bleu_4, cider, cider_d, clip_s, specs, grammar, mean_length, repeat_2, bad_ending, object_recall, hallucination_mention, hallucination_caption]" "$@"
}
foils() {
  for src in rendered references reworded; do
    [ -f "$O/meta/foils_$src.json" ] || step "foil_data_$src" python -m rewards.meta_eval world-foils \
      --scenes $W/scenes.json --dataset $W/dataset.json --split test --source $src --out "$O/meta/foils_$src.json"
    for v in plain text scene; do
      step "foils_${src}_$v" python -m rewards.meta_eval foil --data "$O/meta/foils_$src.json" \
        --config "$O/scoring_$v.yaml" --metrics clip_s,specs --out "$O/meta/result_${src}_$v.json" \
        --markdown "$O/meta/table_${src}_$v.md"
    done
  done
}
scoring() {
  local v=$1 specs_w specs_e
  if [ "$v" = scene ]; then specs_w=$DEMO/reward_models/world_specs.pt; specs_e=$DEMO/embeds/specs.h5
  else specs_w=$O/specs_$v.pt; specs_e=$O/embeds/specs_$v.h5; fi
  printf 'reward_models:\n  clip: {kind: open_clip, arch: %s, weights: %s, embeds: %s}\n  specs: {kind: longclip, weights: %s, embeds: %s}\n' \
    $ARCH "$(clip_of "$v")" "$(embeds_of "$v")" "$specs_w" "$specs_e" > "$O/scoring_$v.yaml"
}

lane_scene() {  # (c) is the demo's: grammar head, then alpha 1 alone, with grammar, with the KL anchor
  grammar scene
  alone a1_scene scene "{clip_s: 1.0}"
  alone a1_grammar_scene scene "{clip_s: 0.7, grammar: 0.3}"
  alone a1_kl_scene scene "{clip_s: 1.0}" --set scst.kl_coef=10
}
lane_plain() {
  clip plain
  specs plain --set negatives=none --set edited_negatives=0
  embeds plain
  scst mix_plain plain
}
lane_text() {
  clip text --set negatives=text --set hard_negatives=3
  specs text --set negatives=text --set edited_negatives=1.0
  embeds text
  scst mix_text text
  grammar text
  alone a1_grammar_text text "{clip_s: 0.7, grammar: 0.3}"
}
# Three lanes, one thread each: on 2 cores they share the machine; with more, each has its own.
lane_text & pids=($!)
lane_plain & pids+=($!)
lane_scene & pids+=($!)
status=0; for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ $status = 0 ] || { echo "error: a step failed; see $O/logs" >&2; exit 1; }
for v in plain text scene; do scoring $v; done
foils
python - "$O/meta" <<'PY'
import json, sys
from pathlib import Path
meta = Path(sys.argv[1])
for src in ("rendered", "references", "reworded"):
    rows, kinds = [], []
    for recipe, v in (("(a) plain", "plain"), ("(b) text negatives", "text"), ("(c) scene graphs", "scene")):
        results = json.loads((meta / f"result_{src}_{v}.json").read_text())["results"]
        for caption_set, by_metric in results.items():
            for metric, accuracy in by_metric.items():
                kinds = kinds or [k for k in accuracy if k not in ("all", "mean")] + ["mean"]
                rows.append(f"| {recipe} | {metric} | {caption_set} | "
                            + " | ".join(f"{accuracy.get(k, float('nan')):.3f}" for k in kinds) + " |")
    print(f"\n== foils, {src} wording (test split)\n\n| recipe | metric | captions | " + " | ".join(kinds) + " |")
    print("|" + "---|" * (3 + len(kinds)) + "\n" + "\n".join(rows))
PY
R=$O/runs; M=cider,object_recall,hallucination_mention,clip_s,specs,repeat_2,bad_ending,mean_length
echo "== SCST at the demo's mix (0.7 cider_d + 0.3 clip_s, XE anchor), each recipe's CLIP as clip_s"
python -m captioner.compare --runs $R/mix_plain,$R/mix_text,$DEMO/runs/demo_scst --metrics $M --markdown
echo "== CLIP-S at alpha 1, no XE anchor"
python -m captioner.compare --runs $R/a1_scene,$R/a1_grammar_scene,$R/a1_kl_scene,$R/a1_grammar_text \
  --metrics $M,grammar --markdown
