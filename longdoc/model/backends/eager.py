"""The eager backend: each softmax in plain PyTorch ops, blocked. The specification of the others.

The long softmax has no loop over blocks: the window keys are one overlapping view of the keys
(unfold) copied once with the global keys beside them, [B, h, nb, 3b + G, d], so each piece is one
batched matmul: scores [B, h, nb, b, 3b + G], memory linear in the length. It serves every device
and dtype (float16 on CPU, CUDA without the GPU kernel, MPS), runs under torch.compile and export,
and is what `auto` picks where no kernel serves.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from longdoc.model.backends.base import (
    AttentionBackend, SoftmaxOperands, SoftmaxResult, merge_heads, relative_terms,
)
from longdoc.model.backends.relative import relative_gradient
from longdoc.model.dropout import dropout
from longdoc.model.side_inputs import RelativeIdLayout


class Workspace:
    """Big buffers handed from layer to layer within one forward pass, when nothing needs them kept.

    A fresh tensor of 40-100 MB costs more in page faults than the arithmetic done in it (at 4k
    tokens on CPU, a concatenation, an add or a softmax into a fresh tensor runs several times slower
    than into an existing one). Without autograd nothing a layer computes outlives the next layer, so
    each layer gives its big tensors back here and the next one takes them. With autograd
    (`reuse=False`) every tensor may be saved for backward: `take` gives None, which every op below
    reads as "allocate a fresh result" (`out=None`), so both modes run the same code.
    """

    def __init__(self, reuse: bool):
        self.reuse = reuse
        self._free: dict[tuple[str, str], Tensor] = {}

    def take(self, name: tuple[str, str], shape: tuple[int, ...], like: Tensor) -> Tensor | None:
        if not self.reuse:
            return None
        buffer = self._free.pop(name, None)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = like.new_empty(shape)
        return buffer

    def give(self, name: tuple[str, str], buffer: Tensor | None) -> None:
        if self.reuse and buffer is not None:
            self._free[name] = buffer

    def spare(self, buffer: Tensor | None) -> Tensor | None:
        """`buffer` for an op to write its result into, if buffers are reused."""
        return buffer if self.reuse else None


class _MaskedSoftmax(torch.autograd.Function):
    """softmax(scale * scores + mask_bias) over the last dimension, in one tensor (`out`, or a fresh one).

    Autograd's own path would allocate the masked logits and the weights separately; this writes
    the masked logits straight into the tensor that becomes the weights (saved for backward).
    """

    @staticmethod
    def forward(ctx, scores: Tensor, mask_bias: Tensor, scale: float, out: Tensor | None) -> Tensor:
        probs = torch.add(mask_bias, scores, alpha=scale, out=out)
        torch.softmax(probs, -1, out=probs)
        ctx.scale = scale
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx, grad_probs: Tensor):
        (probs,) = ctx.saved_tensors
        # No public op computes the softmax's backward from its output in one kernel; written out
        # with public ops, probs * (grad - (grad * probs).sum(-1, keepdim=True)) takes several times
        # as long.
        grad_scores = torch.ops.aten._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        if ctx.scale != 1.0:
            grad_scores = grad_scores * ctx.scale
        return grad_scores, None, None, None


def masked_softmax(scores: Tensor, mask_bias: Tensor, scale: float = 1.0, out: Tensor | None = None) -> Tensor:
    """softmax(scale * scores + mask_bias, dim=-1), written into `out` if given (only without autograd)."""
    return _MaskedSoftmax.apply(scores, mask_bias, scale, out)


class PickRelative(torch.autograd.Function):
    """picked[..., q, c] = relative[..., q, ids[..., q, c]]: each pair's relative term (a gather),
    with a backward that sums by the ids' structure (longdoc.model.backends.relative) instead of
    scattering pair by pair. relative [B, h, ..., Nq, R], ids [B, 1, ..., Nq, Nk]; `block_size`: b for
    the long softmax, None for the global one; `out`: a buffer for the picked terms (only without autograd).
    """

    @staticmethod
    def forward(ctx, relative: Tensor, ids: Tensor, links: Tensor | None, layout: RelativeIdLayout,
                block_size: int | None, out: Tensor | None):
        ctx.save_for_backward(ids, links)
        ctx.layout, ctx.block_size, ctx.relative_shape = layout, block_size, relative.shape
        return torch.gather(relative, -1, ids.expand(*relative.shape[:-1], ids.shape[-1]), out=out)

    @staticmethod
    def backward(ctx, grad_picked: Tensor):
        ids, links = ctx.saved_tensors
        grad = relative_gradient(grad_picked, ids, links, ctx.layout, ctx.block_size, ctx.relative_shape)
        return grad, None, None, None, None, None


class EagerBackend(AttentionBackend):
    name = "eager"

    def __init__(self, reuse_buffers: bool = False, keep_weights: bool = False):
        # Autocast casts no op given an out= tensor (the float32 relative terms and head mixes would
        # meet bfloat16 buffers): under autocast every tensor is fresh.
        reuse_buffers = reuse_buffers and not any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))
        super().__init__(reuse_buffers, keep_weights)
        self.workspace = Workspace(reuse=reuse_buffers)

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        query, first_keys, first_values, second_keys, second_values = operands.heads()  # [B, h, N, d] views
        batch, heads, num_queries, size = query.shape
        # [B, h, Nq, d], pre-scaled, contiguous (from the view, a product would keep the projection's
        # order of axes); the keys and values are read where the projections wrote them.
        query = query.contiguous() * operands.query_scale
        b = operands.window_block
        name = "long" if b else "global"  # (of the workspace's buffers)
        if b:  # queries in blocks, over [previous | own | next block | all second keys]
            blocks = num_queries // b
            keys = self._window_keys(first_keys, second_keys, b, blocks, (name, "keys"))  # [B, h, nb, 3b + N2, d]
            values = self._window_keys(first_values, second_values, b, blocks, (name, "values"))
            query = query.view(batch, heads, blocks, b, size)  # [B, h, nb, b, d]
        else:  # over [all first keys | all second keys]
            keys = self._concat(first_keys, second_keys, (name, "keys"))  # [B, h, N1 + N2, d]
            values = self._concat(first_values, second_values, (name, "values"))
        context, summed, weights = self._attend(query, keys, values, operands, name)  # context: query's shape
        self.workspace.give((name, "keys"), keys)
        self.workspace.give((name, "values"), values)
        return SoftmaxResult(merge_heads(context.view(batch, heads, num_queries, size)), summed, weights)

    def _attend(
        self, query: Tensor, key: Tensor, value: Tensor, operands: SoftmaxOperands, name: str
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """query [..., Nq, d] (pre-scaled), key and value [..., Nk, d] -> (context [..., Nq, d], the
        summed scores to carry or None, the weights or None).

        With autograd every big tensor is fresh (the weights are saved for backward). With buffers
        reused, two score-sized buffers serve all layers: the carried sum, and one that holds this
        layer's raw scores and then its weights.
        """
        workspace, carried = self.workspace, operands.carried
        shape = (*query.shape[:-1], key.shape[-2])  # the scores': [.., Nq, Nk]
        # matmul, not bmm(...).view(...): its result is no autograd view, so the in-place adds
        # below stay cheap in backward (an in-place op on a view costs copies).
        scores = torch.matmul(query, key.transpose(-1, -2), out=workspace.take((name, "scores"), shape, query))
        # The buffer free once the softmax's input is formed: the carried sum these scores replace,
        # or the scores themselves when nothing is carried on (the softmax then works in place).
        spent = carried if operands.keep_summed else scores
        if operands.relative_ids is not None:
            relative = relative_terms(query, operands.relative_key, operands.relative_bias)  # [.., Nq, R]
            buffer = workspace.take((name, "relative"), shape, query)
            picked = PickRelative.apply(relative, operands.relative_ids, operands.links, operands.relative_layout,
                                        operands.window_block or None, buffer)  # [.., Nq, Nk]
            # A plain matmul then an add: measured faster than baddbmm_ accumulating into the picked
            # terms (beta = 1 slows MKL's small batched gemms more than the extra pass costs).
            scores.add_(picked)
            workspace.give((name, "relative"), picked)
        if carried is not None:
            scores = scores.add_(carried)  # in place is safe for autograd: no backward needs these values
        dropped, probs = self._probabilities(scores, operands, out=workspace.spare(spent))
        context = torch.matmul(dropped, value)  # [.., Nq, d]
        if not operands.keep_weights:  # (kept weights must outlive the layer)
            workspace.give((name, "scores"), dropped)
        return context, scores if operands.keep_summed else None, probs if operands.keep_weights else None

    @staticmethod
    def _probabilities(scores: Tensor, operands: SoftmaxOperands, out: Tensor | None) -> tuple[Tensor, Tensor]:
        """Summed scores -> (the weights that multiply the values, the softmax's weights): (running
        mean's scale) -> talking heads -> mask -> softmax (-> talking heads) -> dropout. `out`: a free
        buffer for the weights (only without autograd)."""
        mask_bias, scale, pre = operands.mask_bias, operands.scale, operands.talking_heads_pre
        if pre is None:
            probs = masked_softmax(scores, mask_bias, scale, out=out)
            return dropout(probs, operands.drop_probability), probs
        # The running mean's scale commutes with the (linear) head mix, so the softmax applies it:
        # no extra pass over the scores. A free buffer takes the mixed logits, unless it is the
        # scores themselves (the mix cannot write over its input).
        logits = _mix_heads(scores, pre, out=None if out is scores else out)
        probs = masked_softmax(logits, mask_bias, scale, out=None if out is None else logits)
        return dropout(_mix_heads(probs, operands.talking_heads_post), operands.drop_probability), probs

    def _window_keys(self, long_k: Tensor, global_k: Tensor, b: int, nb: int, name: tuple[str, str]) -> Tensor:
        """Keys of each query block: previous, own and next long block, then all globals.

        long_k [B, h, nb * b, d], global_k [B, h, G, d] (views at any stride) -> [B, h, nb, 3b + G, d].
        One copy of the keys (3 + G / b times their size), small next to the [.., b, 3b + G] scores it
        enables as a single batched matmul. The windows are an overlapping view (unfold), whose
        backward sums the three overlaps in one kernel.
        """
        batch, heads, _, size = long_k.shape
        windows = F.pad(long_k, (0, 0, b, b)).unfold(2, 3 * b, b).transpose(-1, -2)  # [B, h, nb, 3b, d] view
        pieces = [windows]
        if global_k.shape[2] > 0:
            pieces.append(global_k.unsqueeze(2).expand(batch, heads, nb, global_k.shape[2], size))
        shape = (batch, heads, nb, 3 * b + global_k.shape[2], size)
        return torch.cat(pieces, dim=3, out=self.workspace.take(name, shape, long_k))

    def _concat(self, first: Tensor, second: Tensor, name: tuple[str, str]) -> Tensor:
        """[B, h, N1, d] and [B, h, N2, d] -> [B, h, N1 + N2, d]."""
        shape = (*first.shape[:2], first.shape[2] + second.shape[2], first.shape[3])
        return torch.cat([first, second], dim=2, out=self.workspace.take(name, shape, first))


def _mix_heads(values: Tensor, mixing: Tensor, out: Tensor | None = None) -> Tensor:
    """Mix [B, h, ...] across heads with mixing [h_out, h_in]: one batched matmul over the flattened
    pairs. bmm with the mixing expanded over the batch, not matmul(2-D, 3-D): that one computes
    (values^T mixing^T)^T and copies its [pairs, h] result back across the heads' stride, which costs
    more than the matmul itself."""
    batch, heads = values.shape[:2]
    mixing = mixing.expand(batch, *mixing.shape)
    flat_out = None if out is None else out.view(batch, heads, -1)
    return torch.bmm(mixing, values.reshape(batch, heads, -1), out=flat_out).view(values.shape)
