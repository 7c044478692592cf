"""Do the lean loss's V-wide products in bf16 change bf16 training? ``python -m studies.bf16_products``; the code is
:mod:`studies.bf16_products.study`, its committed run ``records/``, its plot ``curves.png``."""
