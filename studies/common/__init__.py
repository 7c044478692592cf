"""What several studies share: :mod:`.lms` (the language models the studies train on the corpora's train splits, and
the PTB trunk kept in ``artifacts/``), :mod:`.hidden_tasks` (tasks of hidden states and labels, and the loop that fits
a head to them), :mod:`.real_heads` (SmolLM2-135M's head and hidden states, random heads)."""
