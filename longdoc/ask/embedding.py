"""Sentence embeddings with the packaged all-MiniLM-L6-v2, computed as sentence-transformers does.

The model's sentence-transformers configuration (modules.json, 1_Pooling/config.json in its
folder) is: the transformer, mean pooling over the non-padding tokens, then L2 normalisation, with
inputs truncated at 256 wordpieces (sentence_bert_config.json). Vectors are float32 and unit
length, so an inner product is the cosine similarity.

The transformer (a 6-layer BERT encoder, config.json) runs here on torch alone, its weights read
with safetensors and its wordpieces cut by the `tokenizers` library from its tokenizer.json: every
question of `longdoc ask` embeds itself, and importing transformers' model classes
(`transformers.modeling_utils` and what it pulls in) took several times as long as `import torch`
(docs/ask.md, "A fast start"). The operations are transformers' BertModel's, in its order (its SDPA
attention with the same boolean padding mask), so the vectors are the same floats to the bit
(tests/ask/test_index.py compares them).
"""

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from longdoc.convert.pretrained import minilm_path

MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's sentence_bert_config.json
# A batch of fewer wordpieces (a question, the second hop's three queries) runs on one thread: its
# products are too small to share, and where other work keeps the cores busy, waiting for a second
# thread costs more than the whole pass (one question: 11 ms on one thread, 142 ms on two, AMD EPYC,
# 2 cores at load average 5). Its floats may then differ in the last bit from two threads'.
ONE_THREAD_WORDPIECES = 512


class BertEncoder:
    """A BERT encoder's forward pass (absolute positions, GELU, post-LayerNorm) in inference: the last
    hidden states of a batch, from the weights of a BertModel checkpoint (`model.safetensors`) and its
    config.json."""

    def __init__(self, folder: Path):
        import torch
        from safetensors.torch import load_file

        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{folder}: not a BERT encoder with GELU and absolute positions")
        self.weights = load_file(folder / "model.safetensors")
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.hidden_size = config["hidden_size"]
        self.eps = config["layer_norm_eps"]
        self.scale = (self.hidden_size // self.heads) ** -0.5
        self.dtype = torch.float32

    def _linear(self, name: str, x):
        import torch.nn.functional as F

        return F.linear(x, self.weights[f"{name}.weight"], self.weights[f"{name}.bias"])

    def _norm(self, name: str, x):
        import torch.nn.functional as F

        return F.layer_norm(x, (self.hidden_size,), self.weights[f"{name}.weight"], self.weights[f"{name}.bias"],
                            self.eps)

    def __call__(self, input_ids, attention_mask):
        """[batch, length, hidden] for `input_ids` and `attention_mask` ([batch, length], 1 on real tokens)."""
        import torch
        import torch.nn.functional as F

        w = self.weights
        batch, length = input_ids.shape
        hidden = F.embedding(input_ids, w["embeddings.word_embeddings.weight"])
        hidden = hidden + w["embeddings.token_type_embeddings.weight"][0]
        hidden = hidden + w["embeddings.position_embeddings.weight"][:length]
        hidden = self._norm("embeddings.LayerNorm", hidden)
        # No padding: no mask, as transformers passes none then (SDPA's result differs by a bit with one).
        mask = (None if bool(attention_mask.all()) else
                attention_mask.bool()[:, None, None, :].expand(batch, 1, length, length).contiguous())
        shape = (batch, length, self.heads, self.hidden_size // self.heads)
        for layer in range(self.layers):
            name = f"encoder.layer.{layer}"
            q, k, v = (self._linear(f"{name}.attention.self.{part}", hidden).view(shape).transpose(1, 2)
                       for part in ("query", "key", "value"))
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.scale,
                                                      is_causal=False)
            attended = attended.transpose(1, 2).reshape(batch, length, -1).contiguous()
            hidden = self._norm(f"{name}.attention.output.LayerNorm",
                                self._linear(f"{name}.attention.output.dense", attended) + hidden)
            inner = F.gelu(self._linear(f"{name}.intermediate.dense", hidden))
            hidden = self._norm(f"{name}.output.LayerNorm", self._linear(f"{name}.output.dense", inner) + hidden)
        return hidden


class SentenceEmbedder:
    def __init__(self, model_path=None, batch_size: int = 64):
        import torch
        from tokenizers import Tokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.path = minilm_path() if model_path is None else model_path
        # Two copies of the tokenizer: one pads and truncates batches for the encoder, one counts wordpieces.
        self.counter = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.counter.no_truncation()
        self.counter.no_padding()
        self.batcher = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.batcher.enable_truncation(MAX_SEQ_LENGTH)
        self.batcher.enable_padding(pad_id=self.batcher.token_to_id("[PAD]"), pad_token="[PAD]")
        self.model = BertEncoder(self.path)
        self.batch_size = batch_size
        self._torch = torch
        self.dimension = self.model.hidden_size
        # Cached indexes are valid only for the same weights: key them by the model's files.
        digest = hashlib.sha256()
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            file = self.path / name
            if file.is_file():
                digest.update(name.encode())
                digest.update(str(file.stat().st_size).encode())
                digest.update(hashlib.sha256(file.read_bytes()[:1 << 20]).digest())
        self.key = f"{self.path.name}-{digest.hexdigest()[:16]}"

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Wordpieces of each text, without [CLS]/[SEP]."""
        if not texts:
            return []
        return [len(encoding.ids) for encoding in self.counter.encode_batch(list(texts), add_special_tokens=False)]

    def embed(self, texts: Sequence[str], progress=None) -> np.ndarray:
        """[len(texts), dimension] float32, unit rows. `progress`: a tqdm bar to advance per text."""
        torch = self._torch
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        # Longest first in batches of similar length: little padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        with torch.inference_mode():
            for begin in range(0, len(order), self.batch_size):
                chosen = order[begin:begin + self.batch_size]
                encodings = self.batcher.encode_batch([texts[i] for i in chosen])
                input_ids = torch.tensor([encoding.ids for encoding in encodings], dtype=torch.long)
                attention_mask = torch.tensor([encoding.attention_mask for encoding in encodings], dtype=torch.long)
                with _threads(torch, 1 if input_ids.numel() < ONE_THREAD_WORDPIECES else None):
                    hidden = self.model(input_ids, attention_mask)
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                vectors[chosen] = pooled.float().numpy()
                if progress is not None:
                    progress.update(len(chosen))
        return vectors


@contextlib.contextmanager
def _threads(torch, count: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `count` inside (None: left as they are)."""
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)

