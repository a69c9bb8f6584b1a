"""`python -m rewards.score`: score a COCO results file with the metric suite.

Writes, atomically, {"corpus": {metric: value}, "per_item": {metric: {image_id: value}},
"skipped": {metric: reason}} and prints a table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from captioner.atomic import write_json
from captioner.cli import command
from captioner.errors import DataError
from rewards.references import load_predictions, load_references
from rewards.suite import MetricContext, MetricSuite, SuiteResult, available_metrics


def format_table(result: SuiteResult) -> str:
    width = max([len(n) for n in [*result.corpus, *result.skipped]] + [6])
    lines = [f"{'metric':<{width}}  value"]
    lines += [f"{name:<{width}}  {value:.4f}" for name, value in result.corpus.items()]
    lines += [f"{name:<{width}}  skipped: {reason}" for name, reason in result.skipped.items()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rewards.score", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--predictions", required=True, help="COCO results file [{image_id, caption}]")
    parser.add_argument("--references", required=True,
                        help="Karpathy dataset.json, COCO captions_*.json, or prepro's refs.json")
    parser.add_argument("--split", help="Karpathy files: use only this split's references (train/val/test)")
    parser.add_argument("--metrics", default="all",
                        help=f"'all' or a comma list of: {', '.join(available_metrics())}")
    parser.add_argument("--cider-df", help="cider_df.json.gz from captioner.prepro (enables cider_d)")
    parser.add_argument("--cider-eos", action="store_true", help="cider_d counts EOS as a word")
    parser.add_argument("--scenes", help="the offline world's scenes.json (enables grounding diagnostics)")
    parser.add_argument("--tokenizer", choices=("python", "java"), default="python",
                        help="PTB tokenizer: pure Python (default, same output) or pycocoevalcap's Java one")
    parser.add_argument("--out", help="scores JSON to write")
    return parser


@command
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    context = MetricContext(cider_df=args.cider_df, cider_eos=args.cider_eos, scenes=args.scenes,
                            tokenizer=args.tokenizer)
    predictions = load_predictions(args.predictions)
    references = load_references(args.references, args.split)
    missing = [i for i in predictions if i not in references]
    if missing:
        raise DataError(f"{args.predictions}: {len(missing)} prediction id(s) not in the references "
                        f"{args.references}{' split ' + args.split if args.split else ''}, e.g. {missing[:5]}")
    with MetricSuite(args.metrics, context) as suite:
        result = suite.score(predictions, references)
    print(format_table(result))
    if args.out:
        write_json(args.out, result.to_json())
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
