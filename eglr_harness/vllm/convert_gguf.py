"""Turn a GGUF checkpoint into a folder vLLM loads: fp32 safetensors, config and tokenizer.

    python -m eglr_harness.vllm.convert_gguf FOLDER GGUF_FILE OUT [--dtype float32]

transformers de-quantizes the GGUF (as ``eglr-hf`` loads it with ``gguf_file=``), so the folder holds
the same weights ``eglr-hf`` decodes with; vLLM then serves it with ``pretrained=OUT``.
"""

from __future__ import annotations

import argparse
import logging

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
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    convert(args.folder, args.gguf_file, args.out, args.dtype)


if __name__ == "__main__":
    main()
