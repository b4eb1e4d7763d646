"""The converter: HuggingFace checkpoint folders and llama.cpp GGUF files -> `.flm` files.

    from converter.convert import convert          # or: python3 converter/convert.py --help

Importing the package itself loads nothing (flm_reader needs only numpy; the conversion needs
torch and the packages in requirements.txt), so light tools can use single modules.
"""
