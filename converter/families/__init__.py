"""The model families, one module each: ARCH (general.architecture and the metadata key prefix),
HF_ARCHITECTURES, MODEL_TYPE, GGUF_ARCH, ADD_BOS_DEFAULT, read_hparams(config) -> HParams,
add_metadata(writer, hp, tied), layer_tensors(hp, i) and add_tensors(writer, ckpt, hp, dtype).
What they share is in common.py."""

from . import bert, gemma, gemma2, gemma3, glm, glm4, llama, mistral, phi3, qwen2, qwen3

FAMILIES = {m.ARCH: m for m in (llama, qwen2, qwen3, mistral, phi3, gemma, gemma2, gemma3, glm, glm4, bert)}
