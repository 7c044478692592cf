"""What the reproduced tables' cells say, apart from the page that shows it: :mod:`.collect` (results into the
committed json), :mod:`.compare` (the paired comparisons of a table and what they could detect, equal compute, the
lead per epoch, the sweep's checks, the CPU-hours) and :mod:`.facts` (what a section shows, and the derived numbers a
reading may cite). The report (:mod:`recipes.reproduce.report`) renders them as tables and plots.
"""
