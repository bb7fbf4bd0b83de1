"""Optimizers and learning-rate schedulers with torch.optim's names; updates are built in-graph."""

from tensorgraphs import missing as _missing
from tensorgraphs.optim import lr_scheduler
from tensorgraphs.optim.optimizer import Optimizer
from tensorgraphs.optim.optimizers import SGD, Adadelta, Adagrad, Adam, Adamax, AdamW, NAdam, RAdam, RMSprop

__all__ = ["SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "Optimizer", "RAdam", "RMSprop",
           "lr_scheduler"]

__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
