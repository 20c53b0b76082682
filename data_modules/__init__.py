"""LightningDataModules: the search data module and the problem sources."""

from data_modules.search import SearchDataModule

__all__ = ["SearchDataModule"]
