"""fairseq adapter for softmax-heads (``fairseq-train --user-dir fairseq_plugin``).

The fairseq models (``head_ARCH``), the ``head_cross_entropy`` criterion and checkpoint loading
are being built (project issue #3); they will import the heads from :mod:`hf_heads.heads`, the
single pure-torch implementation both adapters share. Importing this folder as a fairseq
``--user-dir`` today registers nothing and changes nothing in fairseq.
"""
