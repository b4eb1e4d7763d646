"""A decoder reranker's keys (`{arch}.rerank.*`, docs/flm_format.md): a causal LM asked whether a
document meets a query, whose score is its "yes" logit minus its "no" logit at the end of the
prompt (Qwen3-Reranker). The prompt is the model's protocol, so it is stored in the file: its
template with {instruction}, {query} and {document}, the default instruction, and the two answer
tokens' texts (the core checks that each is one token)."""

from __future__ import annotations

from pathlib import Path

from .errors import ConversionError

# Qwen3-Reranker's prompt, as its model card gives it (system turn, user turn with the three
# fields, an empty thinking block before the answer).
QWEN3_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def is_qwen3_reranker(folder: Path, config: dict) -> bool:
    """Qwen3-Reranker's checkpoints are plain Qwen3ForCausalLM: its name (the folder's or
    config.json's _name_or_path) or its model card's title says so."""
    hints = [Path(folder).resolve().name, str(config.get("_name_or_path", ""))]
    if any("qwen3-reranker" in h.lower() for h in hints):
        return True
    readme = Path(folder) / "README.md"
    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace").lower()
        return "# qwen3-reranker" in text
    return False


def add_rerank_metadata(writer, arch: str, tokens=("yes", "no"), template: str = QWEN3_TEMPLATE,
                        instruction: str = QWEN3_INSTRUCTION) -> None:
    yes, no = tokens
    if not yes or not no or yes == no:
        raise ConversionError(f"--rerank_tokens needs two different tokens, got {yes!r}, {no!r}")
    for field in ("{query}", "{document}"):
        if field not in template:
            raise ConversionError(f"a rerank template needs {field}")
    a = arch + ".rerank."
    writer.add_string(a + "template", template)
    writer.add_string(a + "instruction", instruction)
    writer.add_string(a + "yes", yes)
    writer.add_string(a + "no", no)
