"""Mixtape's two forms of its projections (``scaled_input``) under Adam and SGD on the synthetic bottleneck task:
``python -m studies.mixtape_forms``; the code is :mod:`studies.mixtape_forms.study`."""
