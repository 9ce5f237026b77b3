"""The one name under which the installed transformers hands the KV cache around.

transformers 5.24 renamed the cache in ``generate``'s ``model_kwargs``, in model outputs and in
decoder-layer calls from ``past_key_values`` to ``cache`` (the old name is a deprecated alias
until 5.40). Both engines read and pass the cache under :data:`CACHE_KWARG`, found here once from
transformers' own list of generation cache names; a name outside :data:`KNOWN_CACHE_KWARGS`
stops the import with the versions to use, rather than decoding without a cache.
"""

from __future__ import annotations

import transformers
from transformers.generation import utils as _generation_utils

# transformers <= 5.23: "past_key_values"; 5.24 and later: "cache".
KNOWN_CACHE_KWARGS = ("past_key_values", "cache")

# generate's own default name heads this list in every release that has it.
CACHE_KWARG: str = _generation_utils.ALL_CACHE_NAMES[0]

if CACHE_KWARG not in KNOWN_CACHE_KWARGS:
    raise ImportError(
        f"transformers {transformers.__version__} passes the KV cache as {CACHE_KWARG!r}; eglr-harness knows "
        f"{KNOWN_CACHE_KWARGS}. Install a transformers version inside the range pyproject.toml declares."
    )
