"""Optimizers and learning-rate schedulers with torch.optim's names; updates are built in-graph."""

from tensorgraphs.optim import lr_scheduler
from tensorgraphs.optim.optimizer import Optimizer
from tensorgraphs.optim.optimizers import SGD, Adagrad, Adam, AdamW, RMSprop

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Optimizer", "RMSprop", "lr_scheduler"]
