"""Table ``mt-en-fr``: English -> French (Mixtape paper, Tables 1 and 6: WMT'14 En-Fr BLEU softmax 43.0,
MoS-9 42.1, Mixtape 43.9). Mini: Multi30k English -> French on a CPU. Full: the paper's transformer (6 layers,
embedding 2048, inner 8192, 16 heads, dropout 0.25, attention and Mixtape gate dropout 0.15, 1.2M updates,
16k warm-up) on WMT'14 En-Fr (36M pairs), newstest2013 / newstest2014."""
from recipes.reproduce.translation import TranslationTable

TABLE = TranslationTable(
    name="mt-en-fr", src="en", tgt="fr",
    description="English->French BLEU (Mixtape Tables 1/6): mini Multi30k, full WMT'14 newstest2014",
    paper_bleu={"softmax": 43.0, "mos-9": 42.1, "mixtape": 43.9},
    paper_costs={"softmax": {"out_bsz": 2.43, "all_bsz": 24.06, "out_mem": 15.0, "all_mem": 159.3},
                 "mos-9": {"out_bsz": 7.90, "all_bsz": 29.05, "out_mem": 254.0, "all_mem": 936.0},
                 "mixtape": {"out_bsz": 4.88, "all_bsz": 26.81, "out_mem": 40.5, "all_mem": 197.2}},
    full_model=["--arch", "head_transformer_vaswani_wmt_en_fr_big", "--encoder-layers", "6", "--decoder-layers", "6",
                "--encoder-embed-dim", "2048", "--decoder-embed-dim", "2048", "--encoder-ffn-embed-dim", "8192",
                "--decoder-ffn-embed-dim", "8192", "--encoder-attention-heads", "16",
                "--decoder-attention-heads", "16", "--share-all-embeddings", "--dropout", "0.25",
                "--attention-dropout", "0.15"],
    # lr 2.0 * d^-0.5 * max(step, 16k)^-0.5: a peak of 3.5e-4 at 16k updates
    full_train=["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.000349", "--lr-scheduler",
                "inverse_sqrt", "--warmup-updates", "16000", "--warmup-init-lr", "1e-07", "--max-tokens", "4096",
                "--label-smoothing", "0.1", "--clip-norm", "0.0"],
    full_updates=1200000, gate_dropout=0.15, full_data="wmt14-en-fr")
