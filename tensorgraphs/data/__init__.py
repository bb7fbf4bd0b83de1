"""Datasets and data loading with torch.utils.data's names."""

from tensorgraphs import missing as _missing
from tensorgraphs.data.dataloader import DataLoader, default_collate
from tensorgraphs.data.dataset import Dataset, Subset, TensorDataset, random_split
from tensorgraphs.data.distributed import DistributedSampler
from tensorgraphs.data.grouping import grouped
from tensorgraphs.data.sampling import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["BatchSampler", "DataLoader", "Dataset", "DistributedSampler", "RandomSampler", "SequentialSampler",
           "Subset", "TensorDataset", "default_collate", "grouped", "random_split"]

__getattr__ = _missing.module_getattr(__name__, globals())  # missing torch names: "not implemented yet"
