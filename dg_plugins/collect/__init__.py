"""collect: the tables of a sweep, read from ``cli`` (the flags and the flow of ``python -m
dg_plugins.scripts.collect_results``) through the modules below, in order; torch-free; what a
job's records hold comes from the job contract (dg_plugins.job). Each kind of table selects once
into a ``selection.Selection`` its tables and figures read. What each shows: docs/collect.md."""

from dg_plugins.collect.records import job_progress, load_records  # results.jsonl -> a DataFrame
from dg_plugins.collect.selection import IID, LOO, METHODS, ORACLE, select  # model selection
from dg_plugins.collect.ipoop import add_pooled_subsets  # IP/OOP keys
from dg_plugins.collect.tables import Cell, Report, Section, Table  # the model, standard tables
from dg_plugins.collect.single_source import select_single_source  # single-source tables
from dg_plugins.collect.udg import select_udg  # UDG tables
from dg_plugins.collect.report import (add_paper_comparisons, build_report,  # every table,
                                       missing_cell_notes)  # published numbers, notes on stderr
from dg_plugins.collect.formats import FORMATS, render  # text, LaTeX, Markdown, CSV
from dg_plugins.collect.plots import write_figures  # --plot
from dg_plugins.collect.learning import learning_rows  # --learning_check
