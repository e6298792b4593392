"""collect: the tables of a sweep, read top to bottom from ``python -m
dg_plugins.scripts.collect_results``.

records (results.jsonl -> a DataFrame) -> selection (DomainBed's model selection) -> tables (the
table model, the standard tables) -> report (all tables of a sweep, with one module per kind:
ipoop, single_source, udg, papers; and the notes) -> formats (text, LaTeX, Markdown, CSV);
learning: did each job learn. Of train it uses only train.folder; it imports no torch.
"""
