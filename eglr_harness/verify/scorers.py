"""Loading a verifier and scoring batches of encoded inputs.

:func:`load_scorer` loads the verifier of a :class:`~eglr_harness.verify.spec.VerifierSpec` (local
weights, offline); :meth:`Scorer.score` runs one padded batch and reads each input's step scores at
its positions (:mod:`~eglr_harness.verify.formats`) through :mod:`~eglr_harness.verify.heads`. Causal
LM verifiers (``shepherd``, the self-verifiers) apply the output head only at the read positions, so
that no (batch, length, vocabulary) tensor is ever made.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from eglr_harness.core.hub import cached_model_file, hub_unreachable
from eglr_harness.run.model_names import model_name
from eglr_harness.run.presets import load_preset, resolve_pretrained
from eglr_harness.run.stores import weights_fingerprint
from eglr_harness.verify import formats, heads
from eglr_harness.verify.spec import VerifierSpec

__all__ = ["Item", "Scorer", "check_weights", "self_model_args", "load_scorer"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Item:
    """What a verifier scores: the problem's text, the prompt the run's model got, and one rollout."""

    question: str
    prompt: str
    solution: str


@dataclass
class Scorer:
    """A loaded verifier. ``encode(item)`` builds its input; :meth:`score` gives step scores per input."""

    spec: VerifierSpec
    name: str  # the verifier's model name (never a path)
    fingerprint: str | None
    dtype: str
    model: object
    tokenizer: object
    encode: Callable[[Item], formats.Encoded]
    read: Callable  # (model outputs of the batch, row, positions) -> list of step scores
    lm_head: bool  # run the base model and apply the output head at the positions only

    def score(self, batch: Sequence[formats.Encoded]) -> list[list[float]]:
        """Step scores of each encoded input (right-padded batch; pads are masked and never read)."""
        import torch

        device = next(self.model.parameters()).device
        width = max(len(e.input_ids) for e in batch)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, e in enumerate(batch):
            ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
            mask[i, : len(e.input_ids)] = 1
        ids, mask = ids.to(device), mask.to(device)
        with torch.inference_mode():
            if self.lm_head:
                hidden = self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
                head = self.model.get_output_embeddings()
                cap = getattr(self.model.config, "final_logit_softcapping", None)

                def logits_at(row, positions):
                    out = head(hidden[row, list(positions)])
                    return out if not cap else torch.tanh(out / cap) * cap

                return [self.read(logits_at, i, e.positions) for i, e in enumerate(batch)]
            outputs = self.model(input_ids=ids, attention_mask=mask)
            logits = outputs.logits if hasattr(outputs, "logits") else outputs[0]
            return [self.read(logits, i, e.positions) for i, e in enumerate(batch)]


def _floats(t) -> list[float]:
    return [float(x) for x in t.reshape(-1).tolist()]


def _is_local(target: str) -> bool:
    return target.startswith(("/", ".", "~")) or Path(target).exists()


def check_weights(spec: VerifierSpec, trust_remote_code: bool) -> None:
    """What can be known before loading: a local path exists; remote code is allowed when needed."""
    if spec.is_self:
        return
    path = Path(spec.target).expanduser()
    if _is_local(spec.target) and not path.exists():
        raise ValueError(f"`--verifier`={spec.key!r}: {spec.target!r} does not exist; give the folder of the "
                         "verifier's weights (config.json, tokenizer, *.safetensors).")
    if not _is_local(spec.target) and not cached_model_file(spec.target):
        why = hub_unreachable()  # the load would retry the hub for over a minute, then end in a traceback
        if why is not None:
            raise ValueError(f"`--verifier`={spec.key!r}: the hub model {spec.target!r} is not in the local cache and "
                             f"the Hugging Face hub cannot be asked ({why}); run once where the hub is reachable (the "
                             f"model is cached after), or give the folder of its weights: {spec.format}:/path/to/it.")
    config = path / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"`--verifier`={spec.key!r}: {config} is not readable JSON ({err}).") from None
        if data.get("auto_map") and not trust_remote_code:
            raise ValueError(f"`--verifier`={spec.key!r}: the model's code ships with its weights (config.json "
                             "auto_map, e.g. Qwen2.5-Math-PRM); pass --trust_remote_code after reading that code.")


def self_model_args(run_model_args: Sequence[Mapping]) -> dict:
    """The HF loading args of the runs' own model (``model_config`` presets expanded, ``pkg://``
    resolved); the runs must share one model."""
    merged = []
    for args in run_model_args:
        args = dict(args)
        if args.get("model_config") and "pretrained" not in args:
            args = {**load_preset(str(args["model_config"]))["model_args"], **args}
        if not args.get("pretrained"):
            raise ValueError(f"the run's model args {args!r} name no model; pass --model_args pretrained=...")
        args["pretrained"] = resolve_pretrained(args["pretrained"])
        merged.append({k: args.get(k) for k in ("pretrained", "gguf_file", "revision")})
    names = {model_name(a) for a in merged}
    if len(names) != 1:
        raise ValueError(f"the runs were made by different models {sorted(map(str, names))}; a self-verifier "
                         "scores one model's runs: give them to eglr-verify apart.")
    return merged[0]


def _torch_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"`--dtype`={dtype!r} is not allowed; allowed: auto, float32, bfloat16, float16.") from None


def load_scorer(spec: VerifierSpec, *, device: str = "cpu", dtype: str = "auto", trust_remote_code: bool = False,
                model_args: Mapping | None = None, system_prompt: str | None = None) -> Scorer:
    """Load the verifier of ``spec`` (``model_args``: the runs' own model, for ``self:``)."""
    import transformers as tf

    torch_dtype = _torch_dtype(dtype, device)
    check_weights(spec, trust_remote_code)
    if spec.is_self:
        args = dict(model_args or {})
        source, gguf = args["pretrained"], args.get("gguf_file")
        kwargs = {"gguf_file": gguf} if gguf else {}
        if args.get("revision"):
            kwargs["revision"] = args["revision"]
        tokenizer = tf.AutoTokenizer.from_pretrained(source, **kwargs)
        model = tf.AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
        name, fingerprint = model_name(args), weights_fingerprint(source, gguf)
    else:
        source = str(Path(spec.target).expanduser()) if _is_local(spec.target) else spec.target
        tokenizer = tf.AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        config = tf.AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        remote = bool(getattr(config, "auto_map", None)) and trust_remote_code
        auto = {
            "qwen-prm": tf.AutoModel if remote else tf.AutoModelForTokenClassification,
            "shepherd": tf.AutoModelForCausalLM,
            "value-head": tf.AutoModelForTokenClassification,
            "orm": tf.AutoModel if remote else tf.AutoModelForSequenceClassification,
        }[spec.format]
        model = auto.from_pretrained(source, dtype=torch_dtype, trust_remote_code=trust_remote_code)
        name, fingerprint = model_name({"pretrained": spec.target}), weights_fingerprint(source) or spec.target
        labels = getattr(model.config, "num_labels", None)
        want = {"qwen-prm": 2, "value-head": 1}.get(spec.format)
        if want is not None and not remote and labels != want:
            raise ValueError(f"`--verifier`={spec.key!r}: the model's head has {labels} labels; {spec.format} "
                             f"needs {want}.")
    model.to(device).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id  # sequence classifiers find the last token by it
    encode, read, lm_head = _format(spec, tokenizer, system_prompt)
    logger.info("verifier %s loaded (%s, %s on %s)", spec.key, name, str(torch_dtype).replace("torch.", ""), device)
    return Scorer(spec, name, fingerprint, str(torch_dtype).replace("torch.", ""), model, tokenizer, encode, read,
                  lm_head)


def _format(spec: VerifierSpec, tok, system_prompt: str | None):
    """(encode, read, lm_head) of a format: how an item becomes input and outputs become step scores."""
    if spec.format == "qwen-prm":
        system = system_prompt or formats.QWEN_PRM_SYSTEM
        return (lambda it: formats.encode_qwen_prm(tok, it.question, it.solution, system),
                lambda logits, i, pos: _floats(heads.two_label_positive(logits[i, list(pos)])), False)
    if spec.format == "value-head":
        return (lambda it: formats.encode_value_head(tok, it.question, it.solution),
                lambda logits, i, pos: _floats(heads.sigmoid_values(logits[i, list(pos)])), False)
    if spec.format == "orm":
        return (lambda it: formats.encode_orm(tok, it.question, it.solution, system_prompt),
                lambda logits, i, pos: _floats(heads.orm_probability(logits[i])), False)
    if spec.format == "shepherd":
        plus, minus = formats.shepherd_candidates(tok)
        return (lambda it: formats.encode_shepherd(tok, it.question, it.solution),
                lambda logits_at, i, pos: _floats(heads.plus_probability(logits_at(i, pos), plus, minus)), True)
    if spec.target == "p_true":
        true_id = tok.encode("True", add_special_tokens=False)[0]
        return (lambda it: formats.encode_p_true(tok, it.question, it.solution),
                lambda logits_at, i, pos: _floats(heads.token_probability(logits_at(i, pos)[0], true_id)), True)

    def certainty(logits_at, i, pos):
        return [0.0] if not pos else _floats(heads.self_certainty(logits_at(i, pos)))  # no token: no certainty

    return (lambda it: formats.encode_certainty(tok, it.prompt, it.solution), certainty, True)
