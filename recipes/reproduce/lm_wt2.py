"""Table ``lm-wt2``: WikiText-2 perplexity (PLIF paper: AWD-LSTM softmax 68.11 / 65.22 -> PLIF 67.87 / 64.86 valid /
test, MoS-15 66.01 / 63.33). Full: the MoS settings (emsize 300, nhid 1150, nhidlast 650, dropouti .55, dropouth .2,
batch 15 in small batches of 5, bptt 70, windows capped at 90, lr 15, NT-ASGD). Mini: trained on the first 1,500 lines of the shipped
valid.txt (PTB's amount of text: a cell in 5 minutes), scored on the first 1,500 lines of test.txt."""
from recipes.reproduce.language_model import LanguageModelTable

TABLE = LanguageModelTable(
    name="lm-wt2", corpus="wikitext-2",
    description="WikiText-2 perplexity (PLIF): AWD-LSTM + head; mini trains on valid.txt",
    paper={"test": {"softmax": 65.22, "plif": 64.86, "mos-15": 63.33},
           "valid": {"softmax": 68.11, "plif": 67.87, "mos-15": 66.01}},
    full_arch="head_awd_lstm_lm_wt2", full_batch=15, full_lr=15.0, full_chunks=3, full_max_seq_len_delta=20,
    full_awd={"arch": "head_awd_lstm_lm_awd_wt2", "batch": 80, "lr": 30.0},
    mini_lines=1500,
    # PLIF's own table: 3 seeds for every head (the default gives 3 to softmax, MoS and both Mixtape forms only)
    mini_seeds={"softmax": 3, "MOS": 3, "mixtape": 3, "mixtape-unscaled": 3, "plif": 3, "sigsoftmax": 3},
    mini_mos="mos-3")  # MoS-5 trains about 310 s a cell on WikiText-2's larger vocabulary here: over the budget
