"""The bottleneck map: on a frozen AWD-LSTM trunk, each head's test perplexity as the head's input size d shrinks
(:mod:`studies.bottleneck_map.study`, ``python -m studies.bottleneck_map``), its check with the trunk trained jointly
(``python -m studies.bottleneck_map.joint``), and the page (``python -m studies.bottleneck_map.report``, from the
committed ``records/``; the analysis in :mod:`~studies.bottleneck_map.analysis`, the rendering in
:mod:`~studies.bottleneck_map.page`). The head-upgrade table on the same page is :mod:`studies.head_upgrade`."""
