"""collect: the tables of a sweep, read from ``cli`` (the flags and the flow of ``python -m
dg_plugins.scripts.collect_results``) through ``records`` (results.jsonl -> a DataFrame),
``selection`` (model selection), ``tables`` (the model, standard tables; ``ipoop``,
``single_source``, ``udg`` for the other kinds), ``report`` (every table, published numbers,
notes on stderr) and ``formats`` (text, LaTeX, Markdown, CSV); ``plots`` (--plot) and
``learning`` (--learning_check); torch-free; what a job's records hold comes from the job
contract (dg_plugins.job). Each kind of table selects once into a ``selection.Selection`` its
tables and figures read. What each shows: docs/collect.md."""
