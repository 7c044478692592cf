"""Table ``lm-wt2``: WikiText-2 perplexity (PLIF paper: AWD-LSTM softmax 68.11 / 65.22 -> PLIF 67.87 / 64.86 valid /
test, MoS-15 66.01 / 63.33). Full: the MoS settings (emsize 300, nhid 1150, nhidlast 650, dropouti .55, dropouth .2,
batch 15 in small batches of 5, bptt 70, windows capped at 90, lr 15, NT-ASGD). Mini: PLIF's claim only (softmax and
PLIF on AWD-LSTM), trained on the first 5,488 lines of train.txt (300,000 tokens of its 2,088,628, for the budget),
the vocabulary of the whole train split (33,278 words), chosen on valid.txt, scored on test.txt."""

from recipes.reproduce.tables.language_model import LanguageModelTable

TABLE = LanguageModelTable(
    name="lm-wt2",
    corpus="wikitext-2",
    description="WikiText-2 perplexity (PLIF): AWD-LSTM + head; mini trains on a prefix of the train split",
    paper={
        "test": {"softmax": 65.22, "plif": 64.86, "mos-15": 63.33},
        "valid": {"softmax": 68.11, "plif": 67.87, "mos-15": 66.01},
    },
    paper_claims={"plif": {"relative": 64.86 / 65.22 - 1, "source": "PLIF: 64.86 vs 65.22"}},
    full_arch="head_awd_lstm_lm_wt2",
    full_batch=15,
    full_lr=15.0,
    full_chunks=3,
    full_max_seq_len_delta=20,
    full_awd={"arch": "head_awd_lstm_lm_awd_wt2", "batch": 80, "lr": 30.0},
    # Mixtape sized to MoS-15's 34.9M parameters through its last LSTM layer (650 -> 803 units): 100.0%
    full_model_options={"mixtape": ["--nhidlast", "803"]},
    mini_lines=5488,
    mini_tokens=300_000,
    # PLIF's claim (65.22 -> 64.86 test): softmax and PLIF, 3 seeds each, fixed before the runs
    mini_heads=["softmax", "plif"],
    mini_seeds={"softmax": 3, "plif": 3},
)
