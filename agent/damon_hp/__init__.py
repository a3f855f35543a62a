"""damon-hp: DAMON-guided selective transparent huge pages for one process."""

__version__ = "0.1.0"
