"""Sentence embeddings with the packaged all-MiniLM-L6-v2, computed as sentence-transformers does.

The model's sentence-transformers configuration (modules.json, 1_Pooling/config.json in its
folder) is: the transformer, mean pooling over the non-padding tokens, then L2 normalisation, with
inputs truncated at 256 wordpieces (sentence_bert_config.json). Here the same three steps run on
`transformers.AutoModel`, so sentence-transformers need not be installed; vectors are float32 and
unit length, so an inner product is the cosine similarity.
"""

import hashlib
import os
from typing import Sequence

import numpy as np

from longdoc.convert.pretrained import minilm_path

MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's sentence_bert_config.json


class SentenceEmbedder:
    def __init__(self, model_path=None, batch_size: int = 64):
        import torch
        from transformers import AutoModel, AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.path = minilm_path() if model_path is None else model_path
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModel.from_pretrained(self.path).eval()
        self.batch_size = batch_size
        self._torch = torch
        self.dimension = self.model.config.hidden_size
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
        return [len(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def embed(self, texts: Sequence[str], progress=None) -> np.ndarray:
        """[len(texts), dimension] float32, unit rows. `progress`: a tqdm bar to advance per text."""
        torch = self._torch
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        # Longest first in batches of similar length: little padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        with torch.inference_mode():
            for begin in range(0, len(order), self.batch_size):
                chosen = order[begin:begin + self.batch_size]
                batch = self.tokenizer([texts[i] for i in chosen], padding=True, truncation=True,
                                       max_length=MAX_SEQ_LENGTH, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                vectors[chosen] = pooled.float().numpy()
                if progress is not None:
                    progress.update(len(chosen))
        return vectors
