"""``python -m fairseq_plugin.average CHECKPOINT OUT`` (the command recipes and recorded runs use): see
:mod:`fairseq_plugin.lm.average`."""

from fairseq_plugin.lm.average import main

if __name__ == "__main__":
    main()
