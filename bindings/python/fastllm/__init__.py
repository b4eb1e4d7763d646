"""fastllm: LLM inference in C++ with a pure-ctypes Python binding.

    import fastllm
    with fastllm.Model("model.flm", threads=2) as m:
        print(m.generate("Once upon a time", max_new_tokens=32, temperature=0.0))
"""
from ._lib import lib as _clib
from ._log import route_library_logs_to_python
from .model import Adapter, FastLLMError, GenerationResult, Model, Session, check_grammar, devices, json_schema_to_grammar, \
    render_template

route_library_logs_to_python()
__version__ = _clib.fastllm_version().decode()
library_path = _clib.path


def isa() -> str:
    """Instruction set the kernels use on this CPU ("amx", "avx512", "avxvnni", "avx2" or "scalar" on x86-64)."""
    return _clib.fastllm_isa().decode()


__all__ = ["Model", "Session", "Adapter", "FastLLMError", "GenerationResult", "json_schema_to_grammar", "check_grammar", "isa", "devices", "render_template",
           "library_path", "__version__"]
