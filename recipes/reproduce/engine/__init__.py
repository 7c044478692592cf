"""The reproduction engine, what every table runs on: :mod:`.table` (the loop of a table: sweep, seeds, scoring),
:mod:`.runner` (fairseq's command line, ``commands.sh``, logs, CPU time), :mod:`.sweep` (the stopping rule and the
learning-rate sweep), :mod:`.results` (rows, finished cells, json), :mod:`.variants` (head names such as ``mos-9``),
:mod:`.costs` (the papers' training-cost columns). It imports no table, no data preparation and no report.
"""
