"""The reproduction's tables: one module per table (``mt_en_de.py`` the En-De BLEU table, ``lm_ptb.py`` the PTB
perplexity table, ...; each defines ``TABLE``) and the two kinds they are (``translation.py``,
``language_model.py``). Tables build on :mod:`recipes.reproduce.engine` and :mod:`recipes.reproduce.data`; neither
imports a table (import-linter holds it).
"""
