"""Table ``lm-ptb``: Penn Treebank perplexity (Mixtape paper Table 3: softmax 59.19, MoS-3 57.62, MoS-5 57.24,
MoS-10 56.49, MoS-15 56.14, Mixtape 56.37, Mixtape without gate sharing 56.33, test; PLIF paper: AWD-LSTM softmax
60.83 / 58.37 -> PLIF 59.45 / 57.25 valid / test, MoS-15 58.58 / 56.43 -> MoS + PLIF 58.20 / 56.02). Full: the MoS
settings (emsize 280, nhid 960, nhidlast 620, batch 12, bptt 70, lr 20, NT-ASGD). Mini: the train split (929,589
tokens), chosen on valid.txt, scored on test.txt, a scaled-down AWD-LSTM with the optimiser its pilot chose
(:mod:`recipes.reproduce.pilots.lm_pilot`)."""

from recipes.reproduce.tables.language_model import LanguageModelTable

TABLE = LanguageModelTable(
    name="lm-ptb",
    corpus="ptb",
    description="Penn Treebank perplexity (Mixtape Table 3, PLIF): AWD-LSTM + head on PTB's train split",
    # one paper per row, the one whose model the row trains: AWD-LSTM's own (softmax, PLIF: the PLIF paper, valid /
    # test) or the MoS model (MoS-K, Mixtape: the Mixtape paper's Table 3, test only; MoS + PLIF: the PLIF paper)
    paper={
        "test": {
            "softmax": 58.37,
            "mos-3": 57.62,
            "mos-5": 57.24,
            "mos-10": 56.49,
            "mos-15": 56.14,
            "mixtape": 56.37,
            "mixtape-unscaled": 56.37,  # the paper's Mixtape beside the library's default form of it
            "mixtape-noshare": 56.33,
            "plif": 57.25,
            "mos_plif": 56.02,
        },
        "valid": {"softmax": 60.83, "plif": 59.45, "mos_plif": 58.20},
    },
    paper_source={"*": "Mixtape T3", "softmax": "PLIF", "plif": "PLIF", "mos_plif": "PLIF"},
    # the claims each row tests, relative to its paper's softmax (MoS-4 sits between Table 3's MoS-3 and MoS-5: the
    # smaller claim, MoS-3's)
    paper_claims={
        "mos-4": {
            "relative": 57.62 / 59.19 - 1,
            "source": "Mixtape T3: MoS-3 57.62 vs softmax 59.19; MoS-4 lies between MoS-3 and MoS-5, the smaller claim",
        },
        "mixtape-unscaled": {"relative": 56.37 / 59.19 - 1, "source": "Mixtape T3: 56.37 vs 59.19"},
        "plif": {"relative": 57.25 / 58.37 - 1, "source": "PLIF: 57.25 vs 58.37"},
    },
    # Table 3's time columns: seconds per batch of 48 (same batch), per instance at 12 GB (same memory)
    paper_costs={
        "softmax": {"out_bsz": 14, "all_bsz": 328, "out_mem": 0.40, "all_mem": 3.06},
        "mos-3": {"out_bsz": 147, "all_bsz": 439, "out_mem": 3.37, "all_mem": 6.25},
        "mos-5": {"out_bsz": 173, "all_bsz": 488, "out_mem": 4.40, "all_mem": 8.38},
        "mos-10": {"out_bsz": 242, "all_bsz": 609, "out_mem": 6.96, "all_mem": 12.99},
        "mos-15": {"out_bsz": 310, "all_bsz": 731, "out_mem": 9.62, "all_mem": 15.73},
        "mixtape": {"out_bsz": 27, "all_bsz": 345, "out_mem": 0.90, "all_mem": 3.66},
        "mixtape-noshare": {"out_bsz": 95, "all_bsz": 487, "out_mem": 3.88, "all_mem": 10.44},
    },
    # the bottleneck map's frozen trunk: softmax's seed 1 at its chosen rate
    keep_cell=("softmax", 1),
    full_arch="head_awd_lstm_lm_ptb",
    full_batch=12,
    full_lr=20.0,
    full_awd={"arch": "head_awd_lstm_lm_awd_ptb", "batch": 20, "lr": 30.0},
    # Mixtape sized to MoS-15's 21.5M parameters through its last LSTM layer (620 -> 781 units): 100.0%
    full_model_options={"mixtape": ["--nhidlast", "781"]},
    # seeds fixed before the runs: 5 for softmax, MoS and PLIF, 3 for the others (every row gets a paired test)
    mini_seeds={"softmax": 5, "mos-4": 5, "plif": 5, "mixtape-unscaled": 3, "sigsoftmax": 3, "softmax-matched": 3},
    # the rows sized to MoS-4's parameters (5.34M): Mixtape (default form) through its last LSTM layer, 5.34M
    # (100.0%, within 2% as the Mixtape paper matches them); softmax through its LSTMs' hidden size, 5.33M (99.8%),
    # its tied 200-d embedding, the rank under test, unchanged (tests/test_reproduce.py checks both)
    mini_model_options={"mixtape-unscaled": ["--nhidlast", "275"], "softmax-matched": ["--nhid", "450"]},
)
