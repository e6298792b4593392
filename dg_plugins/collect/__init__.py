"""collect: the tables of a sweep, read top to bottom from ``python -m
dg_plugins.scripts.collect_results``.

cli (flags, the flow) -> records (results.jsonl -> a DataFrame) -> selection (DomainBed's model
selection) -> tables (the table model, the standard tables) -> report (all tables of a sweep;
one module per kind: ipoop, single_source, udg, papers; notes) -> formats (text, LaTeX,
Markdown, CSV); plots (--plot); learning (--learning_check). Of train it uses only train.folder;
it imports no torch.
"""
