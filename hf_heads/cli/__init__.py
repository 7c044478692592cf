"""The commands of softmax-heads, one module each (:mod:`.finetune`, :mod:`.upgrade`, :mod:`.lm_eval`, :mod:`.bench`),
with what they share: :mod:`.runner` (how a command starts and ends), :mod:`.process` (the process-wide defaults set
before torch loads; standard library only), :mod:`.timing` (interleaved timing, peak memory, a busy neighbour)."""
