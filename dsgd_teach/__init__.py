"""dsgd-teach: parallel and distributed SGD, taught by running it on a live dask cluster."""

from .cluster import start_client
from .config import sized, smoke_mode
from .trace import Result, StopRequested

__version__ = "0.1.0"
__all__ = ["Result", "StopRequested", "__version__", "sized", "smoke_mode", "start_client"]
