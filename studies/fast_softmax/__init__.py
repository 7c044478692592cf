"""The fast-softmax study: DS-Softmax beside its control, SVD-softmax against the class-based softmax, adaptive
sampling at its paper's criterion, decoding at batch 1, and the speed benchmark of the fast heads. Its commands are
``python -m studies.fast_softmax.NAME`` (``svd_study``, ``ds_softmax``, ``decoding``, ``bench_fast_inference``; the
page: ``fast_report``); its committed results are ``records/``, its page ``README.md``."""
