"""The head-upgrade study: SmolLM2-135M's output layer upgraded on WikiText-2, each head beside two controls (a fresh
softmax, and a residual MLP as large as the head: :mod:`studies.head_upgrade.control`).

``python -m studies.head_upgrade`` is ``softmax-heads upgrade`` with that control's ``--residual-mlp``
(:mod:`studies.head_upgrade.command`); ``python -m studies.head_upgrade.table`` runs the table cell after cell. Its
committed cells are in the bottleneck map's records (``studies/bottleneck_map/records/``); its page is
studies/bottleneck_map/README.md."""
