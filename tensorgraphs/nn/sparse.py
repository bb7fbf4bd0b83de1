"""Embedding: a lookup table of learned rows."""

from __future__ import annotations

from typing import Any

from tensorgraphs.frontend import creation
from tensorgraphs.frontend import elementwise as ew
from tensorgraphs.frontend.grad_mode import no_grad
from tensorgraphs.frontend.tensor import Tensor
from tensorgraphs.nn import functional as F
from tensorgraphs.nn import init
from tensorgraphs.nn.linear import new_parameter
from tensorgraphs.nn.module import Module
from tensorgraphs.nn.parameter import Parameter


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Tensor | None = None, _freeze: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = new_parameter(num_embeddings, embedding_dim, dtype=dtype)
            self.reset_parameters()
        else:
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            rows = creation.arange(self.num_embeddings).reshape(self.num_embeddings, 1)
            with no_grad():
                self.weight.assign(ew.where(ew.eq(rows, self.padding_idx), 0.0, self.weight))

    def forward(self, input: Tensor) -> Tensor:
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: bool = True, padding_idx: int | None = None,
                        **kwargs: Any) -> Embedding:
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, _weight=embeddings, _freeze=freeze, **kwargs)

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        return text + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")
