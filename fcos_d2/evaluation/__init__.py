"""Evaluation beyond detectron2's COCOEvaluator: ``summary`` (a summary.txt block per
evaluation, the verdict on TEST.EXPECTED_RESULTS, proposal recall) and ``report`` (after
each evaluation, report.html with precision-recall curves, AP per class and the worst
images beside their ground truth; ``report.evaluator.ReportingCOCOEvaluator`` writes it)."""
from .summary import (SUMMARY_METRICS, append_summaries, append_summary, append_summary_note,
                      expected_results_verdict, format_summary, iterations_trained,
                      proposal_recall, summary_path)

__all__ = ["SUMMARY_METRICS", "append_summary_note", "append_summaries", "append_summary",
           "expected_results_verdict", "format_summary", "iterations_trained",
           "proposal_recall", "summary_path"]
