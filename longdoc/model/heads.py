"""Reusable output heads over the encoder's hidden states, their losses, and span decoding.

The heads are those of ETC's task constructions (Ainslie et al., 2020, arXiv:2004.08483, section 4;
google-research/google-research, etcmodel/models/hotpotqa and wikihop): a start/end softmax over
long tokens, a classifier read from one chosen global token (HotpotQA's answer type from global
token 0), and one logit per chosen global token (supporting-fact sentences, WikiHop candidates).
A task model picks and wires them; none of them knows a dataset.

Positions a head must not choose (padding, the question, other structure) get `MASKED_LOGIT`
rather than -inf: a row whose positions are all masked still gives finite losses, and the value
fits in float16.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Large enough that exp() underflows to 0 next to any real logit, small enough for float16 (max 65504).
MASKED_LOGIT = -10000.0
# Labels that mark "no target here" for the cross-entropy and sigmoid losses below.
IGNORE_INDEX = -1


def mask_logits(logits: Tensor, allowed: Tensor | None) -> Tensor:
    """`logits` with positions where `allowed` is False set to MASKED_LOGIT (same shape)."""
    if allowed is None:
        return logits
    return logits.masked_fill(~allowed.bool(), MASKED_LOGIT)


class SpanHead(nn.Module):
    """Start and end logits over long tokens: a linear map of each long hidden state to two scores."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.projection = nn.Linear(hidden_size, 2)

    def forward(self, long_hidden: Tensor, allowed: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """long_hidden [B, L, H]; allowed [B, L] bool (positions an answer may start or end at).
        Returns start_logits, end_logits, each [B, L], masked."""
        start, end = self.projection(long_hidden).unbind(dim=-1)
        return mask_logits(start, allowed), mask_logits(end, allowed)


class GlobalTokenClassifier(nn.Module):
    """Class logits read from one global token per row (ETC: answer type from global token 0), with
    `pool_selected` also from the mean of chosen global tokens (e.g. the question's): the linear map
    then reads [chosen token; mean of the selected]."""

    def __init__(self, hidden_size: int, num_classes: int, pool_selected: bool = False):
        super().__init__()
        self.pool_selected = pool_selected
        self.projection = nn.Linear(hidden_size * (2 if pool_selected else 1), num_classes)

    def forward(self, global_hidden: Tensor, index: int | Tensor = 0, selected: Tensor | None = None) -> Tensor:
        """global_hidden [B, G, H]; index: one global position for all rows, or [B] positions;
        selected [B, G] (with `pool_selected`): the global tokens to average. Returns [B, num_classes]."""
        if isinstance(index, int):
            chosen = global_hidden[:, index]
        else:
            chosen = global_hidden[torch.arange(global_hidden.shape[0], device=global_hidden.device), index]
        if self.pool_selected:
            if selected is None:
                raise ValueError("this classifier also averages selected global tokens: pass `selected` [B, G] "
                                 "(for HotpotQA, the `question_mask` the task's collate gives)")
            weights = selected.to(global_hidden.dtype).unsqueeze(-1)  # [B, G, 1]
            pooled = (global_hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
            chosen = torch.cat([chosen, pooled], dim=-1)
        return self.projection(chosen)


class GlobalTokenScorer(nn.Module):
    """One logit per global token; tokens not selected get MASKED_LOGIT (sentences, candidates)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.projection = nn.Linear(hidden_size, 1)

    def forward(self, global_hidden: Tensor, selected: Tensor | None = None) -> Tensor:
        """global_hidden [B, G, H]; selected [B, G] bool. Returns [B, G]."""
        return mask_logits(self.projection(global_hidden).squeeze(-1), selected)


def pool_linked(long_hidden: Tensor, links: Tensor, count: int) -> Tensor:
    """[B, count, H]: for each of `count` targets, the mean hidden state of the long tokens linked to
    it (links [B, L]: a target index per long token, -1 for none); zeros where none is linked. Gives a
    global token the content of its own text (WikiHop: a candidate's name and mentions, `mention_ids`)
    beside its own state, or a word the mean of its wordpieces (OpenKP: `word_ids`)."""
    batch, _, hidden = long_hidden.shape
    # One extra slot collects the tokens linked to nothing; it is dropped before the mean. A sum and a
    # count (scatter_reduce's "mean" without self is exported to ONNX wrongly: the graph's means
    # differed from these by up to 0.08 with torch 2.13 and onnxscript 0.7).
    index = torch.where(links >= 0, links, count)
    sums = long_hidden.new_zeros(batch, count + 1, hidden).scatter_add(
        1, index.unsqueeze(-1).expand(-1, -1, hidden), long_hidden)
    counts = long_hidden.new_zeros(batch, count + 1).scatter_add(1, index, torch.ones_like(long_hidden[..., 0]))
    return sums[:, :count] / counts[:, :count].clamp(min=1).unsqueeze(-1)


def span_loss(
    start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor
) -> Tensor | None:
    """Mean of the start and end cross-entropies over rows with a target (positions [B], IGNORE_INDEX
    for none); None when no row has one, so a batch of answerless windows adds no span term."""
    has_target = start_positions != IGNORE_INDEX
    if not bool(has_target.any()):
        return None
    start = F.cross_entropy(start_logits[has_target].float(), start_positions[has_target])
    end = F.cross_entropy(end_logits[has_target].float(), end_positions[has_target])
    return (start + end) / 2


def classification_loss(logits: Tensor, labels: Tensor) -> Tensor | None:
    """Cross-entropy over rows whose label is not IGNORE_INDEX; None when there are none."""
    keep = labels != IGNORE_INDEX
    if not bool(keep.any()):
        return None
    return F.cross_entropy(logits[keep].float(), labels[keep])


def binary_loss(logits: Tensor, labels: Tensor) -> Tensor | None:
    """Sigmoid cross-entropy averaged over the entries labelled 0 or 1 (IGNORE_INDEX elsewhere);
    None when no entry is labelled."""
    keep = labels != IGNORE_INDEX
    if not bool(keep.any()):
        return None
    return F.binary_cross_entropy_with_logits(logits[keep].float(), labels[keep].float())


def mean_loss(*losses: Tensor | None) -> Tensor | None:
    """The mean of the terms that are present (ETC's HotpotQA loss is the mean of its heads' losses)."""
    present = [loss for loss in losses if loss is not None]
    return torch.stack(present).mean() if present else None


def top_spans(
    start_logits: Tensor, end_logits: Tensor, groups: Tensor, max_length: int, k: int = 1
) -> list[tuple[float, int, int]]:
    """The k best (score, first, last) long-token spans of one row, best first.

    start_logits, end_logits [L]; groups [L] int: a span's first and last token must lie in the same
    group, which must be >= 0 (so spans never cross a paragraph and never touch positions marked
    -1, such as the question); a span is at most `max_length` tokens. Score = start + end logit.
    Returns fewer than k spans when fewer are allowed; equal scores come in no set order.
    """
    length = start_logits.shape[0]
    if length == 0 or max_length < 1:
        return []
    width = min(max_length, length)
    # scores[i, w] = start[i] + end[i + w]: every span starting at i of width w + 1 (pad past the end).
    pad = width - 1
    end_padded = F.pad(end_logits.float(), (0, pad), value=float("-inf"))
    group_padded = F.pad(groups, (0, pad), value=-1)
    scores = start_logits.float().unsqueeze(1) + end_padded.unfold(0, width, 1)
    same_group = (group_padded.unfold(0, width, 1) == groups.unsqueeze(1)) & (groups >= 0).unsqueeze(1)
    scores = scores.masked_fill(~same_group, float("-inf"))
    flat = scores.flatten()
    count = min(k, int(torch.isfinite(flat).sum()))
    if count == 0:
        return []
    values, indices = flat.topk(count)
    return [(float(v), int(i) // width, int(i) // width + int(i) % width) for v, i in zip(values, indices)]


class NgramScorer(nn.Module):
    """A logit per (n, start word) for n = 1..max_n (ETC's OpenKP head: for each n a width-n
    convolution over the word vectors, then a linear map to one score)."""

    def __init__(self, hidden_size: int, max_n: int = 5):
        super().__init__()
        self.max_n = max_n
        self.convolutions = nn.ModuleList(nn.Conv1d(hidden_size, hidden_size, n) for n in range(1, max_n + 1))
        self.projections = nn.ModuleList(nn.Linear(hidden_size, 1) for _ in range(max_n))

    def forward(self, words: Tensor, word_mask: Tensor) -> Tensor:
        """words [B, W, H]; word_mask [B, W] (1 on real words, which come first). Returns [B, max_n, W]:
        entry (n - 1, i) scores words i .. i + n - 1, MASKED_LOGIT where those run past the real words."""
        width = words.shape[1]
        # Zeros past the end, so every n has an output at every start (masked below where invalid).
        padded = F.pad(words.transpose(1, 2), (0, self.max_n - 1))
        mask = F.pad(word_mask.bool(), (0, self.max_n - 1))
        scores = []
        for n, (convolution, projection) in enumerate(zip(self.convolutions, self.projections), start=1):
            hidden = F.gelu(convolution(padded)[:, :, :width]).transpose(1, 2)
            # The n-gram starting at i is real when its last word, i + n - 1, is.
            scores.append(mask_logits(projection(hidden).squeeze(-1), mask[:, n - 1:n - 1 + width]))
        return torch.stack(scores, dim=1)
