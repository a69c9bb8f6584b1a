"""Detail-unit segmentation (SPECS, papers/specs_paper.txt §4.2 and Appendix A).

A caption is POS-tagged (spaCy, PTB tags) and chunked by the paper's grammar, applied as cascaded
stages over the top-level sequence, each stage grouping what the earlier ones built:

    NP:     <DT>? <JJ.*>* <NN.*>+
    VP:     <VB.*> <NP|PP|CLAUSE>+
    PP:     <IN> <NP>
    CLAUSE: <NP> <VP>
    CONJ:   <CC> <NP|VP|PP|CLAUSE>

A segment closes after each NP, VP, PP or CLAUSE; loose tokens join the segment they precede.
Then the paper's three rules against over-segmentation, per sentence:
  1. a sentence-initial noun phrase starting with "The" (three words at most) is not split off;
  2. a segment starting with a preposition stays with the segment before it;
  3. a sentence-initial segment starting with a preposition joins what follows, unless it holds a verb.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rewards.clip.nouns import load_spacy

PREPOSITIONS = frozenset(["behind", "in", "under", "on", "to", "above", "left", "right", "next", "up", "down", "out",
                          "of", "'s", "is"])
SEGMENT_LABELS = frozenset({"NP", "VP", "PP", "CLAUSE"})
GRAMMAR: list[tuple[str, str]] = [
    ("NP", r"(DT )?(JJ\S* )*(NN\S* )+"),
    ("VP", r"VB\S* ((NP|PP|CLAUSE) )+"),
    ("PP", r"IN NP "),
    ("CLAUSE", r"NP VP "),
    ("CONJ", r"CC (NP|VP|PP|CLAUSE) "),
]


@dataclass
class Node:
    label: str  # a PTB tag for a token, a chunk label for a chunk
    tokens: list  # spaCy tokens covered


def chunk(tokens: Sequence) -> list[Node]:
    nodes = [Node(t.tag_, [t]) for t in tokens]
    for label, pattern in GRAMMAR:
        nodes = _apply(nodes, label, re.compile(pattern))
    return nodes


def _apply(nodes: list[Node], label: str, pattern: re.Pattern) -> list[Node]:
    """Group every leftmost, non-overlapping run of node labels that matches `pattern`."""
    text = "".join(f"{n.label} " for n in nodes)
    starts = [0]
    for node in nodes:
        starts.append(starts[-1] + len(node.label) + 1)
    index_at = {pos: k for k, pos in enumerate(starts)}
    out, k = [], 0
    for match in pattern.finditer(text):
        first, last = index_at.get(match.start()), index_at.get(match.end())
        if first is None or last is None or first < k:
            continue  # a match that does not start and end on node boundaries
        out.extend(nodes[k:first])
        out.append(Node(label, [t for n in nodes[first:last] for t in n.tokens]))
        k = last
    out.extend(nodes[k:])
    return out


def _raw_segments(nodes: list[Node]) -> list[list]:
    segments, current = [], []
    for node in nodes:
        current.extend(node.tokens)
        if node.label in SEGMENT_LABELS:
            segments.append(current)
            current = []
    if current:
        if segments and all(t.is_punct for t in current):
            segments[-1].extend(current)  # a sentence's final "." stays with its last segment
        else:
            segments.append(current)
    return segments


def _has_verb(segment: list) -> bool:
    return any(t.tag_.startswith("VB") or t.pos_ in ("VERB", "AUX") for t in segment)


def _first_word(segment: list) -> str:
    return segment[0].text.lower() if segment else ""


def apply_rules(segments: list[list]) -> list[list]:
    """The three rules of SPECS §4.2 on one sentence's segments."""
    merged: list[list] = []
    for segment in segments:
        if merged and _first_word(segment) in PREPOSITIONS:  # rule 2
            merged[-1] = merged[-1] + segment
        else:
            merged.append(segment)
    out: list[list] = []
    carry: list = []
    for k, segment in enumerate(merged):
        segment = carry + segment
        carry = []
        sentence_start = k == 0
        is_the_np = sentence_start and segment[0].text == "The" and len(segment) <= 3  # rule 1
        leading_pp = sentence_start and _first_word(segment) in PREPOSITIONS and not _has_verb(segment)  # rule 3
        if (is_the_np or leading_pp) and k + 1 < len(merged):
            carry = segment
            continue
        out.append(segment)
    return out


def _text(tokens: list) -> str:
    return "".join(t.text_with_ws for t in tokens).strip()


class DetailSegmenter:
    def __init__(self, nlp=None):
        self.nlp = nlp or load_spacy(with_sentences=True)

    def __call__(self, captions: Sequence[str]) -> list[list[str]]:
        out = []
        for doc in self.nlp.pipe(captions, batch_size=128):
            units: list[str] = []
            for sentence in doc.sents:
                words = [t for t in sentence if not t.is_space]
                if words:
                    units += [_text(s) for s in apply_rules(_raw_segments(chunk(words)))]
            out.append([u for u in units if u])
        return out


def split_points(units: Sequence[str]) -> set[int]:
    """Character offsets where one unit ends and the next begins, in the units joined by spaces."""
    points, offset = set(), 0
    for unit in units[:-1]:
        offset += len(unit) + 1
        points.add(offset)
    return points


def split_scores(predicted: Sequence[Sequence[str]], truth: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision and recall of split points against ground-truth units."""
    hits = n_pred = n_true = 0
    for pred, gold in zip(predicted, truth, strict=True):
        p, g = split_points(pred), split_points(gold)
        hits += len(p & g)
        n_pred += len(p)
        n_true += len(g)
    precision = hits / n_pred if n_pred else 0.0
    recall = hits / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "captions": len(truth)}
