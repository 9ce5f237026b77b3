"""What several test modules share and that is not a fixture: tiny models, inputs, fake lm-eval runs, Markdown
tables, the vLLM engines of the tests, the continuous engine's recorded tokens. Test modules import from here
(``pyproject.toml`` puts ``tests/`` on the path), never from each other."""
