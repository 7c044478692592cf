"""The recipes: ``python -m recipes.NAME``. Importing the package imports hf_heads first, so torch loads with
hf_heads' OpenMP default for shared machines (:mod:`hf_heads.threads`)."""
import hf_heads  # noqa: F401
