"""Table ``mt-en-de``: English -> German (Mixtape paper, Tables 1 and 5: WMT'14 En-De BLEU softmax 29.0,
MoS-9 29.5, Mixtape 29.3). Mini: Multi30k English -> German on a CPU. Full: the paper's transformer (6 layers,
embedding 1024, inner 4096, 16 heads, dropout 0.3, attention dropout 0.15, Mixtape gate dropout 0.2, learning
rate 2.5 with 16k warm-up, 300k updates) on WMT'16 En-De training data, newstest2013 / newstest2014."""

from recipes.reproduce.tables.translation import TranslationTable, paper_schedule, paper_transformer

TABLE = TranslationTable(
    name="mt-en-de",
    src="en",
    tgt="de",
    description="English->German BLEU (Mixtape Tables 1/5): mini Multi30k, full WMT'14 newstest2014",
    paper_bleu={"softmax": 29.0, "mos-9": 29.5, "mixtape": 29.3},
    paper_claims={
        "mos-4": {"relative": 29.5 / 29.0 - 1, "source": "Mixtape T1: MoS-9 29.5 vs softmax 29.0"},
        "mixtape-unscaled": {"relative": 29.3 / 29.0 - 1, "source": "Mixtape T1: 29.3 vs 29.0"},
    },
    paper_costs={
        "softmax": {"out_bsz": 2.16, "all_bsz": 18.15, "out_mem": 5.4, "all_mem": 37.0},
        "mos-9": {"out_bsz": 14.36, "all_bsz": 30.08, "out_mem": 61.1, "all_mem": 97.9},
        "mixtape": {"out_bsz": 5.83, "all_bsz": 21.48, "out_mem": 17.6, "all_mem": 49.8},
    },
    full_model=paper_transformer("head_transformer_vaswani_wmt_en_de_big", 1024, 4096, 0.3, 0.15),
    full_train=paper_schedule(2.5, 1024),
    full_updates=300000,
    gate_dropout=0.2,
    full_data="wmt16-en-de",
    # the most-tested mini table: 5 seeds for softmax, Mixtape in the library's default form (mixtape-unscaled) and
    # MoS; Mesh TensorFlow's form (the `mixtape` row) 1, as on mt-en-fr (the compute budget went to the 5 seeds)
    mini_seeds={"softmax": 5, "mixtape-unscaled": 5, "mos-4": 5},
)
