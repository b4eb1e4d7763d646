"""The C library's messages go to Python's logging, as records of the logger "fastllm".

Like any library, fastllm adds only a NullHandler: nothing is shown until the application
configures logging (e.g. logging.basicConfig(level=logging.INFO) shows model loads and sessions).
"""
from __future__ import annotations

import logging

from . import _lib

logger = logging.getLogger("fastllm")
logger.addHandler(logging.NullHandler())

_LEVELS = {_lib.LOG_ERROR: logging.ERROR, _lib.LOG_WARN: logging.WARNING, _lib.LOG_INFO: logging.INFO,
           _lib.LOG_DEBUG: logging.DEBUG}


@_lib.LogCallback
def _forward(level: int, message: bytes, _user_data) -> None:
    logger.log(_LEVELS.get(level, logging.DEBUG), message.decode("utf-8", "replace"))


def route_library_logs_to_python() -> None:
    """Installs the forwarding callback (done at import; the callback object lives as long as the module)."""
    _lib.lib.fastllm_log_set(_forward, None)
