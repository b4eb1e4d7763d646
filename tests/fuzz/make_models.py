"""Writes the models the text fuzz targets run on: OUT/spm.flm (a tiny random Phi-3 with a
SentencePiece tokenizer, its added role tokens and its chat template) and OUT/bpe.flm (a tiny
random Qwen2 with a byte-level BPE tokenizer, ChatML special tokens). Usage: make_models.py OUT"""
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from converter.convert import convert  # noqa: E402
from hf_models import make_model  # noqa: E402


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, family in (("spm", "phi3"), ("bpe", "qwen2")):
            if not (out / f"{name}.flm").exists():
                convert(str(make_model(tmp, family)), str(out / f"{name}.flm"), progress=False)
            print(out / f"{name}.flm")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
